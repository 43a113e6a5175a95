"""mha.torch.MultiheadAttention: torch.nn.MultiheadAttention's constructor,
parameters, state-dict names, forward signature and (output, weights)
return values, computed and differentiated by mha; the functional
multi_head_attention_forward; replace_attention; the weights' differentiable
form (_differentiable_weights). The package's overview: python/mha/torch.py."""
import dataclasses
import math

import numpy as np
import torch
from torch import nn

from . import _checks, _core
from . import _torch_traced as _traced
from ._torch_call import (
    _GATES_DOC, _CallMasks, _unexpected_keywords, _kept_slopes, _public_errors, _gates_property, _Call, _SharedModule, _alibi_numpy, _as_float32, _call_dtype, _call_gates,
    _call_sinks, _calls, _check_input, _check_param, _dropout_key, _dropout_p, _float_array, _inputs_numpy,
    _mask_numpy, _refuse_scripting, _refuse_tracing, _run, _sinks_numpy, _with_gates)
from ._torch_cache import TensorKVCache, _CacheImpl, _cache_gates, _check_cached
from .torch_chapter import _rope


class MultiheadAttention(_SharedModule, nn.Module):
    """torch.nn.MultiheadAttention, computed and differentiated by mha.

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                       add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
                       device=None, dtype=None, *, fully_masked_rows=mha.FullyMaskedRows.ZEROS,
                       kernel=mha.Kernel.FUSED, precision='float32', rotary=None)

    The same parameters, names, initialisation (torch's, from torch's generator)
    and state dict as nn.MultiheadAttention, so either's state dict loads into
    the other and it can replace TransformerEncoderLayer(...).self_attn.

    forward(query, key, value, key_padding_mask=None, need_weights=True,
            attn_mask=None, average_attn_weights=True, is_causal=False, *,
            cache=None, head_mask=None, window=None)
        -> (attn_output, attn_weights or None)
    query (B, L, E) if batch_first else (L, B, E), or unbatched (L, E); key
    (.., S, kdim), value (.., S, vdim); key_padding_mask (B, S) or (S,);
    attn_mask (L, S) or (B*num_heads, L, S); a boolean mask means True = masked
    out, a floating one is added to the scores. attn_output is shaped like query;
    attn_weights (B, L, S) averaged over heads or (B, num_heads, L, S) (S + 1 with
    bias_k/bias_v, + 1 with add_zero_attn). Differences from PyTorch 1.13: a row
    whose every key is masked gets fully_masked_rows (zeros by default), not NaN;
    is_causal=True always applies the causal mask; masks get no gradient.
    The returned weights are differentiable when a gradient is wanted (they
    are then recomputed by torch's ops from the call's query, key and
    parameters, with its masks and dropout mask: mha's values to float32
    rounding); with mha.Mask objects as masks they are not. precision='bfloat16' ('bf16')
    runs the projections' products in bfloat16 with float32 sums and rounds
    q, k, v to bfloat16; attention, parameters, gradients and optimiser steps
    stay float32.

    head_gates ((num_heads,) tensor or None) and head_mask= multiply each head's
    output before out_proj (see mha.torch.head_importance).

    rotary: rotary position embeddings (RoFormer; LLaMA, GPT-NeoX, GPT-J) on
    each head's projected q and k (after in_proj and its bias), forward and
    backward: None or False (default, off); True (every entry of each head,
    base 10000, Hugging Face's rotate_half pairs (x[m], x[m + d/2])); a dict
    {"dims": n, "base": b, "interleaved": bool} (dims: the first n entries of
    each head, even, default the head width, as GPT-NeoX's rotary_pct;
    interleaved=True pairs (x[2m], x[2m+1]) as GPT-J); or an mha.Rotary.
    Query i and key j sit at positions i and j; in cached calls the new
    positions follow each row's cached length, so decoding token by token
    equals the uncached causal call. bias_k and add_zero_attn's keys are not
    rotated. Also a property (module.rotary = ...).
    torch's TransformerEncoder(Layer) calls this module in eval mode under
    no_grad too (its own fused path is never taken for it).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, fully_masked_rows=None, kernel=None, precision="float32", rotary=None, **unexpected):
        super().__init__()
        op = "mha.torch.MultiheadAttention"
        if unexpected:
            raise _unexpected_keywords(op, unexpected)
        embed_dim = _checks.integer(embed_dim, op, "embed_dim")
        num_heads = _checks.integer(num_heads, op, "num_heads")
        dropout = _checks.real(dropout, op, "dropout")
        bias, add_bias_kv, add_zero_attn, batch_first = (
            _checks.flag(v, op, n) for v, n in ((bias, "bias"), (add_bias_kv, "add_bias_kv"),
                                                (add_zero_attn, "add_zero_attn"), (batch_first, "batch_first")))
        kdim = None if kdim is None else _checks.integer(kdim, op, "kdim")
        vdim = None if vdim is None else _checks.integer(vdim, op, "vdim")
        # Checked here, before torch's module allocates (its own checks are
        # asserts, and a huge width fails inside torch's allocator).
        for n, v in (("embed_dim", embed_dim), ("num_heads", num_heads), ("kdim", kdim), ("vdim", vdim)):
            if v is not None and v < 1:
                raise ValueError(f"[{op}] {n}: {v}; wanted a positive integer")
        if embed_dim % num_heads:
            raise ValueError(f"[{op}] embed_dim: {embed_dim} is not divisible by num_heads {num_heads}")
        widths = embed_dim + (kdim or embed_dim) + (vdim or embed_dim)
        param_bytes = 4 * (embed_dim * widths + embed_dim * embed_dim + 6 * embed_dim)
        if param_bytes > _core.memory_limit():
            raise ValueError(f"[{op}] embed_dim: {embed_dim}: the parameters need {param_bytes} bytes, above the "
                             f"memory limit of {_core.memory_limit()} bytes; raise the limit with "
                             "mha.set_memory_limit")
        if dtype is not None and dtype != torch.float32:
            raise TypeError(f"[mha.torch.MultiheadAttention] dtype {dtype}: mha keeps float32 parameters "
                            "(bfloat16 and float16 inputs run its bfloat16 mode on them)")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"[mha.torch.MultiheadAttention] device: {device}; mha.torch computes "
                             "on the CPU only (the CUDA path does not exist yet)")
        # torch's own module draws the initial parameters (same order, same
        # numbers after the same torch.manual_seed); this module takes them.
        ref = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, bias=bias,
                                    add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                                    kdim=kdim, vdim=vdim, batch_first=batch_first)
        self.embed_dim = ref.embed_dim
        self.kdim, self.vdim = ref.kdim, ref.vdim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = ref.head_dim
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                     "in_proj_bias"):
            self.register_parameter(name, getattr(ref, name))
        self.out_proj = ref.out_proj
        self.bias_k, self.bias_v = ref.bias_k, ref.bias_v
        self.add_zero_attn = add_zero_attn
        self._fully_masked_rows = (_core.FullyMaskedRows.ZEROS if fully_masked_rows is None
                                   else fully_masked_rows)
        self._kernel = _core.Kernel.FUSED if kernel is None else kernel
        self._precision = _checks.precision(precision, op)
        self._rotary = _core._to_rotary(rotary, op, self.head_dim)
        self._make_state()

    @property
    def rotary(self):
        """The rotary position embeddings on q and k (an mha.Rotary), or None (off)."""
        return self._rotary

    @rotary.setter
    def rotary(self, r):
        self._rotary = _core._to_rotary(r, "mha.torch.MultiheadAttention.rotary", self.head_dim)

    __prepare_scriptable__ = _refuse_scripting  # torch.jit.script calls it first
    _public = "mha.torch.MultiheadAttention"

    def _width(self):
        return self.embed_dim

    @property
    def _qkv_same_embed_dim(self):
        """False, so that torch's TransformerEncoder and TransformerEncoderLayer never take their own
        fused path in eval mode (it reads these parameters without calling forward): every call of
        theirs comes to mha. (Which projection parameters exist says whether q, k, v share in_proj.)"""
        return False

    def _named_params(self):
        """(torch state-dict name, Parameter) in nn.MultiheadAttention's order, read now."""
        # The registries themselves (what assignment and load_state_dict change), not getattr:
        # nn.Module.__getattr__ costs about a microsecond a name on every call.
        ps = self._parameters
        # torch.nn.utils.parametrize moves a parametrized tensor out of _parameters: read it as the
        # property it becomes (computed now, so its gradient reaches the original).
        reparam = self._modules.get("parametrizations")
        if reparam is not None:
            ps = dict(ps, **{name: getattr(self, name) for name in reparam.keys()})
        out = [(name, ps[name]) for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                             "in_proj_bias") if ps.get(name) is not None]
        out_proj = self._modules["out_proj"]
        ops = out_proj._parameters
        weight = ops["weight"] if "weight" in ops else out_proj.weight
        out.append(("out_proj.weight", weight))
        bias = ops["bias"] if "bias" in ops else getattr(out_proj, "bias", None)
        if bias is not None:
            out.append(("out_proj.bias", bias))
        out += [(name, ps[name]) for name in ("bias_k", "bias_v") if ps.get(name) is not None]
        return out

    def _kept(self):
        kept = self.__dict__.get("kept_heads")
        return None if kept is None or len(kept) == self.num_heads else kept

    def prune_heads(self, heads):
        """Removes heads for good, numbered as built (0 .. num_heads - 1), as
        mha.TorchMultiheadAttention.prune_heads: calls compute only the kept heads (their rows of the
        projections and columns of out_proj, gathered once per version of the parameters); the
        Parameters keep PyTorch's shapes with the removed heads' rows and columns set to zero, so
        that nn.MultiheadAttention loads the state dict and computes what this module computes, and
        their gradients are zero there. num_heads stays as built (PyTorch's attribute); kept_heads
        lists the heads that remain; head_gates and head_mask keep one entry per head as built.
        At least one head must remain."""
        op = "mha.torch.MultiheadAttention.prune_heads"
        if isinstance(heads, torch.Tensor):
            heads = heads.tolist()
        if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
            raise _checks.wrong_kind(op, "heads", heads, "a list of head numbers")
        heads = [_checks.integer(h, op, "heads") for h in heads]
        kept = self.__dict__.get("kept_heads") or list(range(self.num_heads))
        # mha's own drop-in checks the numbers with its messages (range, repeats, all removed).
        E, H = self.embed_dim, self.num_heads
        check = _core.TorchMultiheadAttention.from_state_dict(
            {"in_proj_weight": np.zeros((3 * E, E), np.float32), "out_proj.weight": np.zeros((E, E), np.float32)},
            H)
        gone = [h for h in range(H) if h not in kept]
        if gone:
            check.prune_heads(gone)
        check.prune_heads(heads)
        d = E // H
        removed = _kept_rows(sorted(set(gone) | set(heads)), d)
        with torch.no_grad():
            for name, p in self._named_params():
                if name in ("in_proj_weight", "in_proj_bias"):
                    for part in range(3):
                        p[part * E:(part + 1) * E][removed] = 0
                elif name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                    p[removed] = 0
                elif name == "out_proj.weight":
                    p[:, removed] = 0
                elif name in ("bias_k", "bias_v"):
                    p.view(-1)[removed] = 0
        self.kept_heads = [h for h in kept if h not in heads]
        self._make_state()  # packings, the cache's module and the last context are of the old heads

    def _cache_module(self):
        """The mha module behind cached calls (batch-first; its buffers copied from the Parameters)."""
        if self._cache_impl is None:
            named = self._named_params()
            for name, p in named:
                _check_param("mha.torch.MultiheadAttention", name, p)
            state = {n: p.detach().numpy() for n, p in named}
            impl = _core.TorchMultiheadAttention.from_state_dict(
                state, self.num_heads, batch_first=True, kdim=self.kdim, vdim=self.vdim,
                add_zero_attn=self.add_zero_attn, dropout=0.0, fully_masked_rows=self._fully_masked_rows)
            kept = self._kept()
            if kept is not None:
                impl.prune_heads([h for h in range(self.num_heads) if h not in kept])
            self._cache_impl = _CacheImpl(impl)
        return self._cache_impl

    def _cache_pairs(self, named):
        """(mha buffer name, tensor) for _CacheImpl.sync."""
        proj, bias_k, bias_v = _drop_in_split(named, self.embed_dim)
        kept = self._kept()
        if kept is not None:  # the cache's module was pruned alike: its buffers hold the kept rows
            rows = _kept_rows(kept, self.embed_dim // self.num_heads)
            proj = [(w[rows], None if b is None else b[rows]) for w, b in proj[:3]] + \
                   [(proj[3][0][:, rows], proj[3][1])]
            bias_k = None if bias_k is None else bias_k.reshape(-1)[rows]
            bias_v = None if bias_v is None else bias_v.reshape(-1)[rows]
        out = []
        for (w, b), n in zip(proj, ("q_proj", "k_proj", "v_proj", "out_proj")):
            out.append((f"{n}_weight" if n != "out_proj" else "out_proj.weight", w))
            if b is not None:
                out.append((f"{n}_bias" if n != "out_proj" else "out_proj.bias", b))
        for n, t in (("bias_k", bias_k), ("bias_v", bias_v)):
            if t is not None:
                out.append((n, t))
        return out

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, *, cache=None, head_mask=None, window=None,
                softcap=None, alibi_slopes=None, sinks=None, **unexpected):
        """(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
        average_attn_weights=True, is_causal=False, *, cache=None, window=None, softcap=None,
        alibi_slopes=None, sinks=None) -> (attn_output, attn_weights or None); shapes in the class
        docstring.
        window: None or (left, right), a sliding window as FlashAttention's window_size (query i
        of L sees key j of S iff i + S - L - left <= j <= i + S - L + right, -1 unbounded),
        intersected with the other masks. softcap: None or c > 0, each scaled score s becomes
        c * tanh(s / c) (Gemma 2); alibi_slopes: None or one slope per head (a tensor or array,
        no gradient), subtracting slope_h * |i + S - L - j| (ALiBi); both before the masks, as
        FlashAttention's softcap and alibi_slopes. sinks: None or a (num_heads,) tensor of attention
        sinks (gpt-oss): one more logit per head in each row's softmax denominator, with no value (a
        row's weights then sum to less than 1; a row with no live key gives 0), through autograd: a
        learned sink is your own nn.Parameter, passed on every call:

            self.sinks = nn.Parameter(torch.zeros(num_heads))       # in your layer's __init__
            out, w = self.attn(x, x, x, is_causal=True, sinks=self.sinks)
            loss.backward()                                         # self.sinks.grad is filled

        With cache= (an mha.KVCache of kv_cache()): the cached call of the n new
        positions (eval mode, no gradients, causal over the new positions, no attn_mask;
        key_padding_mask over the cached and new keys; window over each row's keys),
        -> (attn_output, None)."""
        op = "mha.torch.MultiheadAttention"
        if unexpected:
            raise _unexpected_keywords(op, unexpected)
        _refuse_tracing(op)
        for x, n in ((query, "query"), (key, "key"), (value, "value")):
            _check_input(x, op, n, (2, 3))
        if (query.dim() == 3 and isinstance(key_padding_mask, torch.Tensor) and key_padding_mask.dim() == 1
                and key_padding_mask.dtype != torch.bool):
            raise ValueError(f"[{op}] key_padding_mask: shape {tuple(key_padding_mask.shape)} of "
                             f"{key_padding_mask.dtype} for a batched call; wanted (B, S), True = masked (valid "
                             "lengths (B,) are the d2l chapter's module's: mha.torch.MultiHeadAttention, capital H)")
        if isinstance(cache, TensorKVCache):  # torch's ops around mha's cached operator, eager or traced
            _, mode = _call_dtype(op, (query, key, value))
            masks = _CallMasks(given=(key_padding_mask, attn_mask), window=window, softcap=softcap,
                               alibi_slopes=alibi_slopes, sinks=sinks)
            return _traced.drop_in_cached(self, query, key, value, cache, masks, head_mask,
                                          mode or self._precision), None
        if _traced.tracing(query, key, value):  # torch.compile / torch.export: torch's ops around mha's
            if cache is not None:
                _traced._refuse(op, "cache")
            _, mode = _call_dtype(op, (query, key, value))
            masks = _CallMasks(given=(key_padding_mask, attn_mask), is_causal=is_causal, window=window,
                               softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks)
            return _traced.drop_in(self, query, key, value, masks, _checks.flag(need_weights, op, "need_weights"),
                                   _checks.flag(average_attn_weights, op, "average_attn_weights"), head_mask,
                                   mode or self._precision)
        named = self._named_params()
        params = [p for _, p in named]
        out_dtype, mode = _call_dtype(op, (query, key, value))
        precision = mode or self._precision
        query, key, value = _as_float32(query, key, value)
        batch_first = bool(self.batch_first)
        alibi_slopes = _alibi_numpy(op, alibi_slopes)
        sinks = _call_sinks(op, sinks, self.num_heads)
        if cache is not None:
            _check_cached(op, cache, [query, key, value, *params, *([] if sinks is None else [sinks])])
            if attn_mask is not None:
                raise ValueError(f"[{op}] attn_mask: a cached call takes none (its new positions are "
                                 "causal already); pass key_padding_mask over the cached and new keys")
            if self.training:
                raise ValueError(f"[{op}] cache: cached calls run in evaluation mode only (this module is "
                                 "in training mode); call eval() first")
            cm = self._cache_module()
            cm.sync(self._cache_pairs(named))
            impl = cm.impl
            impl.eval()
            impl.precision = precision
            impl.kernel = self._kernel
            impl.rotary = self._rotary
            gates = _call_gates(op, self.head_gates, head_mask, self.num_heads)
            kept = self._kept()
            if kept is not None and gates is not None:
                gates = gates[torch.tensor(kept, dtype=torch.long)]
            _cache_gates(impl, gates, self.num_heads if kept is None else len(kept))
            if kept is not None and sinks is not None:
                sinks = sinks[torch.tensor(kept, dtype=torch.long)]
            alibi_slopes = _kept_slopes(op, alibi_slopes, kept, self.num_heads)
            seq_first = query.dim() == 3 and not batch_first
            if seq_first:  # the cache's module is batch-first
                query, key, value = (t.transpose(0, 1) for t in (query, key, value))
            nq, nk, nv = _inputs_numpy(query, key, value)
            mask = _mask_numpy(key_padding_mask, "key_padding_mask")
            with _public_errors(op, ("TorchMultiheadAttention",)):
                out = torch.from_numpy(impl(nq, nk, nv, mask, cache=cache, window=window, softcap=softcap,
                                            alibi_slopes=alibi_slopes, sinks=_sinks_numpy(sinks)))
            if seq_first:
                out = out.transpose(0, 1)
            return out.to(out_dtype), None
        kpm = _mask_numpy(key_padding_mask, "key_padding_mask")
        am = _mask_numpy(attn_mask, "attn_mask")
        need_weights = _checks.flag(need_weights, op, "need_weights")
        average = _checks.flag(average_attn_weights, op, "average_attn_weights")
        p = _dropout_p(op, "dropout", self.dropout) if self.training else 0.0
        masks = _CallMasks(given=(key_padding_mask, attn_mask), kpm=kpm, am=am, is_causal=is_causal, window=window,
                             softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                             fully_masked=self._fully_masked_rows)
        return _drop_in_run(op, named, query, key, value, _DropInCall(
            embed_dim=self.embed_dim, num_heads=self.num_heads, batch_first=batch_first,
            add_zero_attn=bool(self.add_zero_attn), masks=masks, need_weights=need_weights, average=average,
            kernel=self._kernel, precision=precision, p=p, weights=self._weights, out_dtype=out_dtype, module=self,
            gates=_call_gates(op, self.head_gates, head_mask, self.num_heads), kept=self._kept(),
            rotary=self._rotary))

    def extra_repr(self):
        # nn.MultiheadAttention prints only its submodules; so does this one.
        return ""


def _drop_in_split(named, E):
    """nn.MultiheadAttention's projections from its parameters: [(weight, bias or None) for q, k, v,
    o], bias_k, bias_v; slices of in_proj_weight / in_proj_bias are views (no copy)."""
    d = dict(named)
    if "in_proj_weight" in d:
        w = d["in_proj_weight"]
        ws = [w[0:E], w[E:2 * E], w[2 * E:3 * E]]
    else:
        ws = [d["q_proj_weight"], d["k_proj_weight"], d["v_proj_weight"]]
    b = d.get("in_proj_bias")
    bs = [b[0:E], b[E:2 * E], b[2 * E:3 * E]] if b is not None else [None] * 3
    proj = list(zip(ws, bs)) + [(d["out_proj.weight"], d.get("out_proj.bias"))]
    return proj, d.get("bias_k"), d.get("bias_v")


def _kept_rows(kept, d):
    """The rows (of W_q, W_k, W_v; columns of W_o) of the kept heads, d wide each."""
    return torch.tensor([h * d + c for h in kept for c in range(d)], dtype=torch.long)


def _drop_in_layers(named, weights, E, add_zero_attn, op="mha.torch.MultiheadAttention", kept=None, d=0):
    """The layer tuple of one drop-in call (weights: the _Weights that versions the projections,
    or None: packed for this call alone). kept: the heads a pruned module keeps (their rows and
    columns are gathered, once per version of the parameters), or None."""
    for name, t in named:
        _check_param(op, name, t)
    proj, bias_k, bias_v = _drop_in_split(named, E)
    if kept is not None:
        rows = _kept_rows(kept, d)
        with torch.no_grad():
            proj = [(w[rows], None if b is None else b[rows]) for w, b in proj[:3]] + \
                   [(proj[3][0][:, rows].contiguous(), proj[3][1])]
            bias_k = None if bias_k is None else bias_k.reshape(-1)[rows]
            bias_v = None if bias_v is None else bias_v.reshape(-1)[rows]
    layers = []
    for i, (w, b) in enumerate(proj):
        version = weights.version(i, w) if weights is not None else 0
        layers.append((_float_array(w), None if b is None else _float_array(b), version))
    return (*layers, None if bias_k is None else _float_array(bias_k),
            None if bias_v is None else _float_array(bias_v), add_zero_attn, None)


def _scatter_rows(g, rows, n, columns=False):
    """g's rows (or columns) placed at `rows` of a zero array n rows (columns) long."""
    shape = list(g.shape)
    shape[1 if columns else 0] = n
    out = np.zeros(shape, np.float32)
    if columns:
        out[:, rows.numpy()] = g
    else:
        out[rows.numpy()] = g
    return out


def _drop_in_grads(names, ps, rest, kept=None, d=0, E=0):
    """The engine's gradients of a drop-in call, one per parameter (None where none is wanted); a
    pruned module's gradients are zero on the removed heads' rows and columns."""
    pg, gbk, gbv = rest[:3]
    if kept is not None:
        rows = _kept_rows(kept, d)
        pg = [None if x is None else _scatter_rows(x, rows, E) for x in pg[:6]] + \
             [_scatter_rows(pg[6], rows, E, columns=True), pg[7]]
        gbk = None if gbk is None else _scatter_rows(gbk, rows, E)
        gbv = None if gbv is None else _scatter_rows(gbv, rows, E)
    by_name = dict(zip(names, ps))
    g = {}
    if "in_proj_weight" in by_name:
        g["in_proj_weight"] = torch.from_numpy(np.concatenate([pg[0], pg[2], pg[4]]))
    else:
        g["q_proj_weight"], g["k_proj_weight"], g["v_proj_weight"] = (
            torch.from_numpy(pg[0]), torch.from_numpy(pg[2]), torch.from_numpy(pg[4]))
    if "in_proj_bias" in by_name:
        g["in_proj_bias"] = torch.from_numpy(np.concatenate([pg[1], pg[3], pg[5]]))
    g["out_proj.weight"] = torch.from_numpy(pg[6])
    if pg[7] is not None:
        g["out_proj.bias"] = torch.from_numpy(pg[7])
    if gbk is not None:
        g["bias_k"] = torch.from_numpy(gbk).reshape(by_name["bias_k"].shape)
        g["bias_v"] = torch.from_numpy(gbv).reshape(by_name["bias_v"].shape)
    return [g[n] if t.requires_grad else None for n, t in zip(names, ps)]


_FUNCTIONAL_STATE = _calls._CallState()  # spare buffers of the functional calls (their weights: per call)


def _kept_mask_slices(op, am, kept, num_heads):
    """A per-head attn_mask ((B*h, L, S), or (h, L, S) unbatched, h as built) cut to the kept heads."""
    if am is None or isinstance(am, _core.Mask) or np.ndim(am) != 3:
        if isinstance(am, _core.Mask) and len(am.shape) == 3:
            raise NotImplementedError(f"[{op}] attn_mask: a per-head mha.Mask on a module with pruned heads; "
                                      "pass the mask as a tensor")
        return am
    a = np.asarray(am)
    L, S = a.shape[1:]
    return np.ascontiguousarray(a.reshape(-1, num_heads, L, S)[:, kept].reshape(-1, L, S))


@dataclasses.dataclass
class _DropInCall:
    """One nn.MultiheadAttention call beside its inputs and parameters: the layout, the mask value,
    what it returns and how it runs. weights: the module's _Weights, or None (a functional call)."""
    embed_dim: int
    num_heads: int
    batch_first: bool
    add_zero_attn: bool
    masks: _CallMasks
    need_weights: bool
    average: bool
    kernel: object
    precision: str
    p: float
    weights: object
    out_dtype: object
    module: object = None
    gates: object = None
    kept: object = None
    rotary: object = None


def _drop_in_run(op, named, query, key, value, call):
    """nn.MultiheadAttention's call on the parameters `named` ((name, tensor) in its order), through
    autograd when a gradient is wanted."""
    names = [n for n, _ in named]
    params = [t for _, t in named]
    weights, kept, masks, embed_dim = call.weights, call.kept, call.masks, call.embed_dim
    state = weights.state if weights is not None else _FUNCTIONAL_STATE
    drop_key = _dropout_key(call.p)

    d = embed_dim // call.num_heads
    last = [None]  # the call's context (its dropout mask for differentiable weights)
    gates, am, sinks = call.gates, masks.am, masks.sinks
    if kept is not None:
        if gates is not None:
            gates = gates[torch.tensor(kept, dtype=torch.long)]
        am = _kept_mask_slices(op, am, kept, call.num_heads)
        if sinks is not None:  # the kept heads' sinks (the others get a zero gradient through the gather)
            sinks = sinks[torch.tensor(kept, dtype=torch.long)]
    alibi = _kept_slopes(op, masks.alibi_slopes, kept, call.num_heads)
    if alibi is not masks.alibi_slopes:  # the kept heads' slopes, for the differentiable weights too
        call = dataclasses.replace(call, masks=dataclasses.replace(masks, alibi_slopes=alibi))
    mask_value = _calls.call_masks(op, key_padding_mask=masks.kpm, attn_mask=am, is_causal=masks.is_causal,
                                   window=masks.window, softcap=masks.softcap, alibi_slopes=alibi,
                                   sinks=_sinks_numpy(sinks), fully_masked_rows=masks.fully_masked)

    def build(ps):
        return _drop_in_layers(list(zip(names, ps)), weights, embed_dim, call.add_zero_attn, op, kept, d)

    def forward(q, k, v, ps, for_backward, gates):
        nq, nk, nv = _inputs_numpy(q, k, v)
        layers = _with_gates(build(ps) if weights is None else weights.layers(ps, build), gates)
        settings = _calls.call_settings(op, kernel=call.kernel, precision=call.precision, for_backward=for_backward,
                                        dropout_p=call.p, dropout_key=drop_key, keep_context=call.p > 0.0,
                                        rotary=call.rotary)
        out, w, context = _calls._torch_mha_forward(state, layers, nq, nk, nv, embed_dim, call.num_heads,
                                                    call.batch_first, mask_value, settings, call.need_weights,
                                                    call.average)
        if context is not None and call.module is not None:
            object.__setattr__(call.module, "_last_context", context)  # a plain attribute: skip nn.Module's
        last[0] = context
        return out, w, context

    def layers(ps, w):
        return _drop_in_layers(list(zip(names, ps)), w, embed_dim, call.add_zero_attn, op, kept, d)

    fn = _Call(state, forward, layers, lambda ps, rest: _drop_in_grads(names, ps, rest, kept, d, embed_dim), gates,
               sinks)
    out, w = _run(fn, query, key, value, params, call.need_weights)
    if w is not None and torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or any(t.requires_grad for t in params)
            or (sinks is not None and sinks.requires_grad)) \
            and not any(isinstance(m, _core.Mask) for m in masks.given):
        # The weights as a function of query, key and the projections, by torch's ops (their
        # values equal mha's to float32 rounding), so that a loss on them has gradients.
        w = _differentiable_weights(named, query, key, call, sinks, last[0])
    if call.out_dtype != torch.float32:
        out = out.to(call.out_dtype)
        w = None if w is None else w.to(call.out_dtype)
    return out, w


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                                 in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight,
                                 out_proj_bias, training=True, key_padding_mask=None, need_weights=True,
                                 attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                                 average_attn_weights=True, is_causal=False):
    """torch.nn.functional.multi_head_attention_forward, computed and differentiated by mha.

    The same arguments and results as PyTorch's: query (L, N, E) or unbatched (L, E), key (S, N, kdim),
    value (S, N, vdim) (sequence-first, as the functional form always is); the projections given as
    in_proj_weight (3E, E) / in_proj_bias (3E,), or as q/k/v_proj_weight with
    use_separate_proj_weight=True; bias_k, bias_v (1, 1, E) or None; dropout on the weights when
    training. -> (attn_output shaped like query, attn_weights or None). Gradients reach every tensor
    argument that requires grad. The weights are packed for each call (a module's weights are packed
    once per version: prefer mha.torch.MultiheadAttention in a model). Differences from PyTorch 1.13 as
    mha.torch.MultiheadAttention's (a fully masked row gets zeros); static_k / static_v are not
    supported (NotImplementedError).
    """
    op = "mha.torch.multi_head_attention_forward"
    _refuse_tracing(op)
    embed_dim_to_check = _checks.integer(embed_dim_to_check, op, "embed_dim_to_check")
    num_heads = _checks.integer(num_heads, op, "num_heads")
    if num_heads < 1:
        raise ValueError(f"[{op}] num_heads: {num_heads}; wanted a positive integer")
    if num_heads > embed_dim_to_check > 0:
        raise ValueError(f"[{op}] num_heads: {num_heads} is more heads than embed_dim_to_check {embed_dim_to_check}")
    dropout_p = _checks.real(dropout_p, op, "dropout_p")
    add_zero_attn, training, need_weights, use_separate_proj_weight, average_attn_weights = (
        _checks.flag(v, op, n) for v, n in ((add_zero_attn, "add_zero_attn"), (training, "training"),
                                            (need_weights, "need_weights"),
                                            (use_separate_proj_weight, "use_separate_proj_weight"),
                                            (average_attn_weights, "average_attn_weights")))
    for n, t in (("in_proj_weight", in_proj_weight), ("in_proj_bias", in_proj_bias), ("bias_k", bias_k),
                 ("bias_v", bias_v), ("out_proj_weight", out_proj_weight), ("out_proj_bias", out_proj_bias),
                 ("q_proj_weight", q_proj_weight), ("k_proj_weight", k_proj_weight),
                 ("v_proj_weight", v_proj_weight), ("static_k", static_k), ("static_v", static_v)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise _checks.wrong_kind(op, n, t, "a torch.Tensor or None")
    if not isinstance(out_proj_weight, torch.Tensor):
        raise _checks.wrong_kind(op, "out_proj_weight", out_proj_weight, "a torch.Tensor")
    if static_k is not None or static_v is not None:
        raise NotImplementedError(f"[{op}] static_k / static_v: not supported by mha; pass the keys and "
                                  "values as key and value")
    for x, n in ((query, "query"), (key, "key"), (value, "value")):
        _check_input(x, op, n, (2, 3))
    embed_dim = int(query.shape[-1])
    if embed_dim != embed_dim_to_check:
        raise ValueError(f"[{op}] query: width {embed_dim}; wanted embed_dim_to_check {embed_dim_to_check}")
    named = []
    if use_separate_proj_weight:
        for n, t in (("q_proj_weight", q_proj_weight), ("k_proj_weight", k_proj_weight),
                     ("v_proj_weight", v_proj_weight)):
            if t is None:
                raise ValueError(f"[{op}] {n}: None with use_separate_proj_weight=True; wanted a tensor")
            named.append((n, t))
    else:
        if in_proj_weight is None:
            raise ValueError(f"[{op}] in_proj_weight: None with use_separate_proj_weight=False; wanted a "
                             "(3 * embed_dim, embed_dim) tensor")
        named.append(("in_proj_weight", in_proj_weight))
    if in_proj_bias is not None:
        named.append(("in_proj_bias", in_proj_bias))
    named.append(("out_proj.weight", out_proj_weight))
    if out_proj_bias is not None:
        named.append(("out_proj.bias", out_proj_bias))
    if (bias_k is None) != (bias_v is None):
        raise ValueError(f"[{op}] bias_k / bias_v: one given without the other; wanted both or neither")
    if bias_k is not None:
        named += [("bias_k", bias_k), ("bias_v", bias_v)]
    out_dtype, mode = _call_dtype(op, (query, key, value))
    query, key, value = _as_float32(query, key, value)
    p = _dropout_p(op, "dropout_p", dropout_p) if training else 0.0
    masks = _CallMasks(given=(key_padding_mask, attn_mask), kpm=_mask_numpy(key_padding_mask, "key_padding_mask"),
                         am=_mask_numpy(attn_mask, "attn_mask"), is_causal=is_causal)
    return _drop_in_run(op, named, query, key, value, _DropInCall(
        embed_dim=embed_dim, num_heads=num_heads, batch_first=False, add_zero_attn=bool(add_zero_attn), masks=masks,
        need_weights=need_weights, average=average_attn_weights, kernel=_core.Kernel.FUSED,
        precision=mode or "float32", p=p, weights=None, out_dtype=out_dtype))


def replace_attention(model, **kwargs):
    """Swaps every torch.nn.MultiheadAttention inside `model` (in place) for an
    mha.torch.MultiheadAttention with the same options, the same Parameter objects (so optimisers
    built before keep working) and the same state-dict keys. kwargs go to the new modules
    (kernel=, precision=, fully_masked_rows=). torch's TransformerEncoder(Layer)s then run mha in
    eval mode under no_grad too (their fused path is never taken with mha's module).
    Returns {qualified name: the nn.MultiheadAttention replaced}; a model that is itself an
    nn.MultiheadAttention cannot be replaced in place (ValueError: build the drop-in instead).
    """
    op = "mha.torch.replace_attention"
    if not isinstance(model, nn.Module):
        raise _checks.wrong_kind(op, "model", model, "a torch.nn.Module")
    if type(model) is nn.MultiheadAttention:
        raise ValueError(f"[{op}] model: an nn.MultiheadAttention itself; wanted a model that contains "
                         "some (build mha.torch.MultiheadAttention and load its state_dict instead)")
    replaced = {}
    made = {}  # id of an nn.MultiheadAttention -> its drop-in: a module held twice stays one module
    for parent_name, parent in list(model.named_modules(remove_duplicate=False)):
        for child_name, child in list(parent._modules.items()):  # every name, a module held twice too
            if type(child) is not nn.MultiheadAttention:
                continue
            if id(child) in made:
                setattr(parent, child_name, made[id(child)])
                replaced[f"{parent_name}.{child_name}" if parent_name else child_name] = child
                continue
            ours = made[id(child)] = MultiheadAttention(child.embed_dim, child.num_heads, dropout=child.dropout,
                                      bias=child.in_proj_bias is not None,
                                      add_bias_kv=child.bias_k is not None, add_zero_attn=child.add_zero_attn,
                                      kdim=child.kdim, vdim=child.vdim, batch_first=child.batch_first, **kwargs)
            for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                         "bias_k", "bias_v"):
                setattr(ours, name, getattr(child, name))
            ours.out_proj = child.out_proj
            ours.train(child.training)
            setattr(parent, child_name, ours)
            replaced[f"{parent_name}.{child_name}" if parent_name else child_name] = child
    return replaced


def _differentiable_weights(named, query, key, call, sinks, context):
    """nn.MultiheadAttention's returned weights (after dropout, averaged or per head) recomputed with
    torch's ops from the call's query, key and parameters (call: _DropInCall; sinks: the kept
    heads'), with the call's masks, fully masked policy and mha's dropout mask: what mha returned,
    now differentiable."""
    E, H, batch_first, kept, rotary = call.embed_dim, call.num_heads, call.batch_first, call.kept, call.rotary
    m = call.masks
    is_causal, window, softcap, alibi_slopes = m.is_causal, m.window, m.softcap, m.alibi_slopes
    kpm, am = (torch.from_numpy(np.asarray(x)) if x is not None and not isinstance(x, torch.Tensor) else x
               for x in m.given)
    batched = query.dim() == 3
    qx, kx = query, key
    if not batched:
        qx, kx = qx.unsqueeze(0), kx.unsqueeze(0)
    elif not batch_first:
        qx, kx = qx.transpose(0, 1), kx.transpose(0, 1)
    proj, bias_k, _ = _drop_in_split(named, E)
    d = E // H
    (wq, bq), (wk, bk) = proj[0], proj[1]
    if kept is not None:
        rows = _kept_rows(kept, d)
        wq, wk = wq[rows], wk[rows]
        bq = None if bq is None else bq[rows]
        bk = None if bk is None else bk[rows]
        bias_k = None if bias_k is None else bias_k.reshape(-1)[rows]
    h = H if kept is None else len(kept)
    q = nn.functional.linear(qx, wq, bq)
    k = nn.functional.linear(kx, wk, bk)
    B, L, S = q.shape[0], q.shape[1], k.shape[1]
    if bias_k is not None:
        k = torch.cat([k, bias_k.reshape(1, 1, -1).expand(B, 1, -1)], 1)
    if call.add_zero_attn:
        k = torch.cat([k, k.new_zeros(B, 1, k.shape[2])], 1)
    Kt = k.shape[1]
    q = q.reshape(B, L, h, d).transpose(1, 2)
    k = k.reshape(B, Kt, h, d).transpose(1, 2)
    if rotary is not None:  # the S given keys only (mha/rotary.h)
        q = _rope(q, rotary.dims, rotary.base, rotary.interleaved)
        k = torch.cat([_rope(k[:, :, :S], rotary.dims, rotary.base, rotary.interleaved), k[:, :, S:]], 2)
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if softcap:  # Gemma 2's softcapping, then ALiBi, before the masks (mha/masks.h ScoreOptions)
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:  # only without appended keys (refused otherwise): Kt == S
        dist = (torch.arange(L)[:, None] + S - L - torch.arange(Kt)[None, :]).abs().float()
        s = s - torch.from_numpy(np.asarray(alibi_slopes, np.float32))[None, :, None, None] * dist
    if kpm is not None and not batched:
        kpm = kpm.unsqueeze(0)
    if am is not None and am.dim() == 3 and kept is not None:  # the kept heads' slices of a per-head mask
        am = am.reshape(-1, H, L, S)[:, torch.tensor(kept, dtype=torch.long)].reshape(-1, L, S)
    # Causality and the window count the S given keys; the appended ones
    # (bias_k, add_zero_attn) stay visible, as mha's kernels mask them
    # (src/nn/call_masks.cpp) and as torch pads attn_mask.
    masked, additive = _traced.score_masks(B, h, L, S, Kt, kpm, am, _traced.causal_kind(is_causal), window)
    if additive is not None:
        s = s + additive
    s = s.masked_fill(masked, float("-inf"))
    if sinks is not None:  # one more logit per head in the denominator, with no value: never a dead row
        sink = sinks.float().reshape(1, h, 1, 1).expand(B, h, L, 1)
        w = torch.softmax(torch.cat([s, sink], -1), -1)[..., :Kt]
    else:
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), -1)
        fill = 0.0 if m.fully_masked == _core.FullyMaskedRows.ZEROS else 1.0 / Kt
        w = torch.where(dead, torch.full_like(w, fill), w)
    if call.p > 0.0 and context is not None:
        w = w * torch.from_numpy(context.dropout_mask)
    if call.average:
        w = w.mean(1)
    return w if batched else w.squeeze(0)



MultiheadAttention.head_gates = _gates_property(_GATES_DOC)
