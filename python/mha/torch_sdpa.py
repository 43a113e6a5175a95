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
from . import _checks, _torch_ops

OP = "mha.torch.scaled_dot_product_attention"

__all__ = ["scaled_dot_product_attention"]


def _check_tensor(x, name):
    _glue.check_tensor(OP, x, name)


def _mask_tensor(attn_mask, lead, B, H, L, S):
    """The mask over (B, H, L, S) as a (b, h, L, S) tensor, b in {1, B} and h in {1, H}: broadcast batch
    and head axes are kept at 1 (the kernel reads them with stride 0), bool kept, floats as float32."""
    if attn_mask is None:
        return None
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
    if B == 1 or m.stride(0) == 0:
        m = m[:1]
    if H == 1 or m.stride(1) == 0:
        m = m[:, :1]
    return m.contiguous() if m.dtype == torch.bool else m.float().contiguous()


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(query key^T * scale + mask) value, with PyTorch 2.x's arguments and semantics
    (module docstring); gradients by mha's attention backward."""
    return attend(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _scale(op, scale, E):
    """torch's scale: None (1/sqrt(E)) or any finite real, 0 and negative ones included. -> (the
    kernels' scale, a factor for the queries or None): a scale that is not a float32-sized positive
    number (0, negative, below 1.2e-38) multiplies the queries instead, the kernels' scale then 1."""
    if scale is None:
        return _glue.default_scale(E), None
    scale = _checks.real(scale, op, "scale")
    if not math.isfinite(scale) or abs(scale) > _glue.F32_MAX:
        raise ValueError(f"[{op}] scale: {scale:g}; wanted a finite number that float32 holds (at most 3.4e+38 "
                         "in magnitude; torch takes 0 and negative scales too)")
    if scale >= _glue.F32_TINY:
        return scale, None
    return 1.0, scale


def attend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
           softcap=None, sinks=None, op=OP):
    """scaled_dot_product_attention with two score options more (the Hugging Face backend's, mha/hf.py):
    softcap (None or > 0: the scaled score s becomes softcap * tanh(s / softcap), before the mask) and
    sinks (None or (H,) floating: one more logit per head in each row's softmax denominator, with a
    gradient)."""
    _glue.check_inputs(op, ((query, "query"), (key, "key"), (value, "value")))
    dropout_p = _checks.real(dropout_p, op, "dropout_p")
    is_causal = _checks.flag(is_causal, op, "is_causal")
    enable_gqa = _checks.flag(enable_gqa, op, "enable_gqa")
    if scale is not None:
        scale = _checks.real(scale, op, "scale")
    dropout_p = _glue.dropout_probability(op, dropout_p)
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(f"[{op}] query, key, value: shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}; wanted (..., L, E), (..., S, E), (..., S, Ev) of one rank >= 2")
    L, E = query.shape[-2:]
    S = key.shape[-2]
    Ev = value.shape[-1]
    if key.shape[-1] != E or value.shape[-2] != S:
        raise ValueError(f"[{op}] key, value: shapes {tuple(key.shape)}, {tuple(value.shape)} do not fit query "
                         f"{tuple(query.shape)}; wanted key (..., S, {E}) and value (..., S, Ev)")
    lead = tuple(query.shape[:-2])
    kv_lead = tuple(key.shape[:-2])
    if tuple(value.shape[:-2]) != kv_lead:
        raise ValueError(f"[{op}] value: shape {tuple(value.shape)}; its leading dimensions differ from key's "
                         f"{tuple(key.shape)}")
    H = lead[-1] if len(lead) >= 1 else 1
    Hkv = kv_lead[-1] if len(kv_lead) >= 1 else 1
    groups_ok = enable_gqa and len(lead) >= 1 and lead[:-1] == kv_lead[:-1] and Hkv > 0 and H % Hkv == 0
    if kv_lead != lead and not groups_ok:
        want = ("key/value heads (dimension -3) dividing the query's and the other leading dimensions equal"
                if enable_gqa else "the query's (or enable_gqa=True for fewer key/value heads)")
        raise ValueError(f"[{op}] key: leading dimensions {kv_lead} against query's {lead}; wanted {want}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"[{op}] attn_mask and is_causal: both given; pass one (torch refuses both too)")
    softcap = _glue.softcap_value(op, softcap)
    if sinks is not None:
        _check_tensor(sinks, "sinks")
        if not sinks.is_floating_point() or tuple(sinks.shape) != (H,):
            raise ValueError(f"[{op}] sinks: {sinks.dtype} of shape {tuple(sinks.shape)}; wanted a floating "
                             f"tensor of shape ({H},), one logit per query head")
    B = math.prod(lead[:-1]) if len(lead) >= 1 else 1
    mask = _mask_tensor(attn_mask, lead, B, H, L, S)
    out_dtype = query.dtype
    scale, q_factor = _scale(op, scale, E)
    if B * H * L * S * E == 0 or Ev == 0:
        # Nothing to attend to (S = 0: every query fully masked, so zeros) or nothing to compute.
        tie = 0.0 * (query.sum() + key.sum() + value.sum() + (sinks.sum() if sinks is not None else 0.0))
        return query.new_zeros((*lead, L, Ev)) + tie
    q, k, v = (x.float().reshape(B, n, x.shape[-2], x.shape[-1]).contiguous()
               for x, n in ((query, H), (key, Hkv), (value, Hkv)))
    if q_factor is not None:  # a scale the kernels' divisor cannot carry, applied to the queries
        q = q * q_factor
    out = _torch_ops.sdpa(q, k, v, mask, None if sinks is None else sinks.float().contiguous(),
                          _torch_ops.dropout_key(dropout_p), is_causal, float(scale), float(softcap),
                          float(dropout_p))
    return _glue.in_dtype(out.reshape(*lead, L, Ev), out_dtype)
