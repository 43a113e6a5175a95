"""mha.torch.scaled_dot_product_attention: PyTorch 2.x's function on mha's kernels.

    out = mha.torch.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                                 is_causal=False, scale=None, enable_gqa=False)

PyTorch 2.x's semantics, so that code written for torch 2 runs on torch 1.13
(which has no such function) with mha:
- query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); the
  leading dimensions are equal (dimension -3 is the heads' when enable_gqa).
- attn_mask: boolean, True = the key takes part (the opposite of
  nn.MultiheadAttention's key_padding_mask / attn_mask), or floating, added
  to the scaled scores; broadcastable to (..., L, S) (broadcast dimensions
  are read in place, not copied). is_causal: query i sees keys j <= i (top
  left); attn_mask and is_causal together are refused, as in torch.
- scale: 1/sqrt(E) by default. dropout_p: dropout on the weights whenever it
  is positive (as torch's function: pass 0.0 in evaluation); mha draws the
  mask from a key taken from torch's generator (torch.manual_seed repeats
  it); it is not torch's mask.
- enable_gqa: key and value may have Hkv heads (dimension -3), Hkv dividing
  the query's; query head h reads kv head h // (Hq // Hkv), as torch's
  repeat_interleave.
- A query whose every key is masked gets zeros (torch >= 2.5's math path),
  never NaN; no gradient flows through it.
- Autograd: gradients for query, key and value (each call keeps its own
  context); a floating attn_mask that requires grad is refused (mha's
  kernels give masks no gradient); double backward raises.
- dtypes: float32; bfloat16 and float16 are computed in float32 and returned
  in their dtype; float64 raises TypeError (pass .float()). CPU tensors only.
"""
import math

import torch

from . import _attention_glue as _glue
from . import _checks, _core

_calls = _core._sdpa_calls
OP = "mha.torch.scaled_dot_product_attention"

__all__ = ["scaled_dot_product_attention"]


def _check_tensor(x, name):
    _glue.check_tensor(OP, x, name)


def _mask_args(attn_mask, lead, B, H, L, S):
    """(mask array or None, stride_b, stride_h): the mask over (B, H, L, S), broadcast dimensions kept
    as stride 0 where the kernel allows it (the batch and head axes)."""
    if attn_mask is None:
        return None, 0, 0
    _check_tensor(attn_mask, "attn_mask")
    if attn_mask.dtype != torch.bool:
        if not attn_mask.is_floating_point():
            raise TypeError(f"[{OP}] attn_mask: dtype {attn_mask.dtype}; wanted bool (True = takes part) or "
                            "floating (added to the scores)")
        if attn_mask.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"[{OP}] attn_mask: requires grad; mha's kernels give masks no "
                                      "gradient: pass attn_mask.detach()")
    want = (*lead, L, S)
    try:
        m = torch.broadcast_to(attn_mask.detach(), want)
    except RuntimeError:
        raise ValueError(f"[{OP}] attn_mask: shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"{tuple(want)} (the query's leading dimensions, L, S)") from None
    m = m.reshape(B, H, L, S)
    same_b = B == 1 or m.stride(0) == 0
    same_h = H == 1 or m.stride(1) == 0
    if same_b:
        m = m[:1]
    if same_h:
        m = m[:, :1]
    m = m.contiguous() if m.dtype == torch.bool else m.float().contiguous()
    stride_h = 0 if same_h else L * S
    stride_b = 0 if same_b else (1 if same_h else H) * L * S
    return m.numpy(), stride_b, stride_h


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(query key^T * scale + mask) value, with PyTorch 2.x's arguments and semantics
    (module docstring); gradients by mha's attention backward."""
    _glue.check_inputs(OP, ((query, "query"), (key, "key"), (value, "value")))
    dropout_p = _checks.real(dropout_p, OP, "dropout_p")
    is_causal = _checks.flag(is_causal, OP, "is_causal")
    enable_gqa = _checks.flag(enable_gqa, OP, "enable_gqa")
    if scale is not None:
        scale = _checks.real(scale, OP, "scale")
    dropout_p = _glue.dropout_probability(OP, dropout_p)
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(f"[{OP}] query, key, value: shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}; wanted (..., L, E), (..., S, E), (..., S, Ev) of one rank >= 2")
    L, E = query.shape[-2:]
    S = key.shape[-2]
    Ev = value.shape[-1]
    if key.shape[-1] != E or value.shape[-2] != S:
        raise ValueError(f"[{OP}] key, value: shapes {tuple(key.shape)}, {tuple(value.shape)} do not fit query "
                         f"{tuple(query.shape)}; wanted key (..., S, {E}) and value (..., S, Ev)")
    lead = tuple(query.shape[:-2])
    kv_lead = tuple(key.shape[:-2])
    if tuple(value.shape[:-2]) != kv_lead:
        raise ValueError(f"[{OP}] value: shape {tuple(value.shape)}; its leading dimensions differ from key's "
                         f"{tuple(key.shape)}")
    H = lead[-1] if len(lead) >= 1 else 1
    Hkv = kv_lead[-1] if len(kv_lead) >= 1 else 1
    groups_ok = enable_gqa and len(lead) >= 1 and lead[:-1] == kv_lead[:-1] and Hkv > 0 and H % Hkv == 0
    if kv_lead != lead and not groups_ok:
        want = ("key/value heads (dimension -3) dividing the query's and the other leading dimensions equal"
                if enable_gqa else "the query's (or enable_gqa=True for fewer key/value heads)")
        raise ValueError(f"[{OP}] key: leading dimensions {kv_lead} against query's {lead}; wanted {want}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"[{OP}] attn_mask and is_causal: both given; pass one (torch refuses both too)")
    B = math.prod(lead[:-1]) if len(lead) >= 1 else 1
    mask, stride_b, stride_h = _mask_args(attn_mask, lead, B, H, L, S)
    out_dtype = query.dtype
    if scale is None:
        scale = _glue.default_scale(E)
    if B * H * L * S * E == 0 or Ev == 0:
        # Nothing to attend to (S = 0: every query fully masked, so zeros) or nothing to compute.
        return query.new_zeros((*lead, L, Ev)) + 0.0 * (query.sum() + key.sum() + value.sum())
    q, k, v = (x.float().reshape(B, n, x.shape[-2], x.shape[-1])
               for x, n in ((query, H), (key, Hkv), (value, Hkv)))
    key_ = _glue.dropout_key(dropout_p)

    def forward(keep):
        return _calls.forward(q.detach().contiguous().numpy(), k.detach().contiguous().numpy(),
                              v.detach().contiguous().numpy(), mask, stride_b, stride_h, is_causal, float(scale),
                              float(dropout_p), key_, keep)

    def backward(context, grad_out):
        return tuple(torch.from_numpy(g) for g in _calls.backward(context, grad_out.numpy()))

    out = _glue.run(OP, (q, k, v), forward, backward)
    return _glue.in_dtype(out.reshape(*lead, L, Ev), out_dtype)
