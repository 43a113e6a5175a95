"""Random nn.MultiheadAttention cases for the parity tests: a PyTorch module
with random parameters (biases included), inputs, masks in every form
PyTorch takes, and each mask three ways: as mha is given it (PyTorch's own
arrays), as PyTorch 1.13 can run it, and as torch_mha_reference reads it.
"""
from dataclasses import dataclass, field

import numpy as np
import torch

import safetensors_spec
from torch_mha_reference import causal_keep, reference_mha

LENGTHS = [1, 2, 3, 5, 7, 8, 13, 17, 31]


@dataclass
class Case:
    E: int
    H: int
    Hkv: int
    kdim: int
    vdim: int
    bias: bool
    bias_kv: bool
    add_zero_attn: bool
    batch_first: bool
    unbatched: bool
    B: int
    L: int
    S: int
    kpm_kind: str       # none, bool, float
    attn_kind: str      # none, bool2, float2, bool3, float3
    causal: str         # none, top_left, bottom_right
    need_weights: bool
    average: bool
    policy: str         # zeros, uniform
    arrays: dict = field(default_factory=dict)

    def describe(self):
        return (f"E{self.E} H{self.H}/{self.Hkv} kdim{self.kdim} vdim{self.vdim} bias {self.bias} "
                f"bias_kv {self.bias_kv} zero_attn {self.add_zero_attn} batch_first {self.batch_first} "
                f"unbatched {self.unbatched} B{self.B} L{self.L} S{self.S} kpm {self.kpm_kind} "
                f"attn {self.attn_kind} causal {self.causal} weights {self.need_weights}/{self.average} "
                f"policy {self.policy}")

    @property
    def extra(self):
        return int(self.bias_kv) + int(self.add_zero_attn)


def draw_case(rng, grouped=False):
    Hkv = int(rng.integers(1, 4))
    H = Hkv * int(rng.integers(1, 4)) if grouped else int(rng.integers(1, 6))
    if not grouped:
        Hkv = H
    d = int(rng.choice([1, 2, 3, 5, 8]))
    E = H * d
    separate = grouped or rng.random() < 0.4
    kdim = int(rng.integers(1, 20)) if separate else E
    vdim = int(rng.integers(1, 20)) if separate else E
    if grouped and kdim == E and vdim == E:
        vdim = E + 1  # grouped weights only exist as q/k/v_proj_weight in PyTorch's module
    unbatched = rng.random() < 0.1
    c = Case(E=E, H=H, Hkv=Hkv, kdim=kdim, vdim=vdim,
             bias=bool(rng.random() < 0.6), bias_kv=bool(rng.random() < 0.3),
             add_zero_attn=bool(rng.random() < 0.3), batch_first=bool(rng.random() < 0.5),
             unbatched=unbatched, B=1 if unbatched else int(rng.integers(1, 4)),
             L=int(rng.choice(LENGTHS)), S=int(rng.choice(LENGTHS)),
             kpm_kind=str(rng.choice(["none", "bool", "float"])),
             attn_kind=str(rng.choice(["none", "bool2", "float2", "bool3", "float3"])),
             causal=str(rng.choice(["none", "none", "top_left", "bottom_right"])),
             need_weights=bool(rng.random() < 0.75), average=bool(rng.random() < 0.5),
             policy=str(rng.choice(["zeros", "uniform"])))
    draw_arrays(rng, c)
    return c


def bool_mask(rng, shape, rows_all_masked=0.15):
    """True = masked out (PyTorch's convention); some rows entirely masked."""
    m = rng.random(shape) < rng.choice([0.15, 0.4])
    m[rng.random(shape[:-1]) < rows_all_masked] = True
    return m


def float_mask(rng, shape, rows_all_minus_inf=0.15):
    m = (rng.standard_normal(shape) * 2).astype(np.float32)
    m[rng.random(shape) < 0.2] = -np.inf
    m[rng.random(shape[:-1]) < rows_all_minus_inf] = -np.inf
    return m


def draw_arrays(rng, c):
    a = c.arrays
    lead = () if c.unbatched else (c.B,)
    q_shape = (c.B, c.L) if c.batch_first else (c.L, c.B)
    kv_shape = (c.B, c.S) if c.batch_first else (c.S, c.B)
    if c.unbatched:
        q_shape, kv_shape = (c.L,), (c.S,)
    a["query"] = rng.standard_normal(q_shape + (c.E,)).astype(np.float32)
    a["key"] = rng.standard_normal(kv_shape + (c.kdim,)).astype(np.float32)
    a["value"] = rng.standard_normal(kv_shape + (c.vdim,)).astype(np.float32)
    a["kpm"] = {"none": None, "bool": lambda: bool_mask(rng, lead + (c.S,)),
                "float": lambda: float_mask(rng, lead + (c.S,))}[c.kpm_kind]
    a["kpm"] = a["kpm"]() if a["kpm"] else None
    heads = c.H if c.unbatched else c.B * c.H
    shapes = {"bool2": (c.L, c.S), "float2": (c.L, c.S), "bool3": (heads, c.L, c.S),
              "float3": (heads, c.L, c.S)}
    if c.attn_kind == "none":
        a["attn"] = None
    elif c.attn_kind.startswith("bool"):
        a["attn"] = bool_mask(rng, shapes[c.attn_kind], rows_all_masked=0.05)
    else:
        a["attn"] = float_mask(rng, shapes[c.attn_kind], rows_all_minus_inf=0.05)


def torch_module(rng, c, path):
    """nn.MultiheadAttention with random parameters; its state dict written
    to `path` as safetensors (by the spec's writer, not mha's). For a grouped
    case the module gets each kv head's rows repeated for its query heads,
    and the file holds the grouped (unrepeated) parameters."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    separate = c.kdim != c.E or c.vdim != c.E
    m = torch.nn.MultiheadAttention(c.E, c.H, bias=c.bias, add_bias_kv=c.bias_kv,
                                    add_zero_attn=c.add_zero_attn, kdim=c.kdim if separate else None,
                                    vdim=c.vdim if separate else None, batch_first=c.batch_first)
    m.eval()
    d = c.E // c.H
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
        full = {k: v.detach().clone() for k, v in m.state_dict().items()}
        if c.Hkv == c.H:
            state = full
        else:
            # Grouped parameters: the first d rows of each kv group's first head.
            rows = torch.cat([torch.arange(g * (c.H // c.Hkv) * d, g * (c.H // c.Hkv) * d + d)
                              for g in range(c.Hkv)])
            expand = torch.arange(c.H).div(c.H // c.Hkv, rounding_mode="floor")
            expand = (expand[:, None] * d + torch.arange(d)[None, :]).reshape(-1)
            state = dict(full)
            for n in ["k_proj_weight", "v_proj_weight"]:
                state[n] = full[n][rows].clone()
                full[n] = state[n][expand]
            if c.bias:
                b = full["in_proj_bias"]
                bk, bv = b[c.E:2 * c.E][rows], b[2 * c.E:][rows]
                state["in_proj_bias"] = torch.cat([b[:c.E], bk, bv])
                full["in_proj_bias"] = torch.cat([b[:c.E], bk[expand], bv[expand]])
            if c.bias_kv:
                for n in ["bias_k", "bias_v"]:
                    state[n] = full[n][:, :, rows].clone()
                    full[n] = state[n][:, :, expand]
            m.load_state_dict(full)
    safetensors_spec.write(path, {k: v.numpy() for k, v in state.items()})
    return m, state


def torch_masks(c):
    """(key_padding_mask, attn_mask) as PyTorch 1.13's module can take them
    with the meaning mha gives the raw arrays: a float key_padding_mask next
    to an attn_mask is folded into a 3D float attn_mask (1.13 refuses two
    float masks and reads a float one next to a boolean one as boolean), and
    causal masking becomes part of attn_mask (1.13 has no is_causal)."""
    kpm, attn = c.arrays["kpm"], c.arrays["attn"]
    kpm = None if kpm is None else torch.from_numpy(kpm)
    attn = None if attn is None else torch.from_numpy(attn)
    if c.causal != "none":
        masked = ~causal_keep(c.L, c.S, c.causal)
        if attn is None:
            attn = masked
        elif attn.dtype == torch.bool:
            attn = attn | masked
        else:
            attn = attn.masked_fill(masked, float("-inf"))
    if kpm is not None and kpm.dtype != torch.bool and attn is not None:
        heads = c.H if c.unbatched else c.B * c.H
        if attn.dtype == torch.bool:
            attn = torch.zeros(attn.shape).masked_fill(attn, float("-inf"))
        attn = attn.expand(heads, c.L, c.S) if attn.dim() == 2 else attn
        k = kpm.reshape(-1, 1, 1, c.S).expand(-1, c.H, 1, c.S).reshape(heads, 1, c.S)
        attn, kpm = attn + k, None
    return kpm, attn


def reference_masks(c):
    """keep (True = takes part) and bias, broadcastable to (B, H, L, S')."""
    B, H, L, S, e = c.B, c.H, c.L, c.S, c.extra
    keep = torch.ones(B, H, L, S + e, dtype=torch.bool)
    bias = torch.zeros(B, H, L, S + e, dtype=torch.float64)
    kpm, attn = c.arrays["kpm"], c.arrays["attn"]
    if kpm is not None:
        k = torch.from_numpy(kpm).reshape(B, 1, 1, S)
        if k.dtype == torch.bool:
            keep[..., :S] &= ~k
        else:
            bias[..., :S] += k.double()
    if attn is not None:
        t = torch.from_numpy(attn)
        t = t.reshape(1, 1, L, S) if t.dim() == 2 else t.reshape(B, H, L, S)
        if t.dtype == torch.bool:
            keep[..., :S] &= ~t
        else:
            bias[..., :S] += t.double()
    if c.causal != "none":
        keep[..., :S] &= causal_keep(L, S, c.causal)
    return keep, bias


def to_batch_first(c, x):
    if c.unbatched:
        return x[None]
    return x if c.batch_first else np.swapaxes(x, 0, 1)


def run_reference(c, state):
    keep, bias = reference_masks(c)
    st = {k: v.double() for k, v in state.items()}
    q, k, v = (torch.from_numpy(to_batch_first(c, c.arrays[n])).double() for n in ("query", "key", "value"))
    out, w = reference_mha(st, c.H, q, k, v, num_kv_heads=c.Hkv, keep=keep, bias=bias,
                           add_zero_attn=c.add_zero_attn, fully_masked=c.policy)
    return out.numpy(), w.numpy()
