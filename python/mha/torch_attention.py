"""mha.torch.attention: FlashAttention's functional interface on mha's kernels.

    out = mha.torch.attention(q, k, v, *, causal=False, window=None, alibi_slopes=None, softcap=None,
                              sinks=None, cu_seqlens=None, max_seqlen=None, scale=None, dropout_p=0.0)

flash_attn_func's and flash_attn_varlen_func's documented conventions, so that
code written for FlashAttention ports by changing the import (and its
window_size / softmax_scale to window / scale):
- q (B, Lq, H, d), k (B, Lk, Hkv, d), v (B, Lk, Hkv, dv) -> (B, Lq, H, dv);
  grouped heads when Hkv divides H (query head h reads kv head h // (H // Hkv)).
- Packed: q (T, H, d), k (T, Hkv, d), v (T, Hkv, dv) with cu_seqlens, an
  integer tensor (int32 as FlashAttention's, or int64) of B + 1 offsets from
  0 to T, nondecreasing: sequence b is rows [cu_seqlens[b], cu_seqlens[b+1]),
  and a query sees only keys of its own sequence (one cu_seqlens for q and k:
  each sequence attends to itself). max_seqlen, when given, must be at least
  the longest sequence (FlashAttention sizes its grid with it; here it is
  only checked).
- scale: 1/sqrt(d) by default (FlashAttention's softmax_scale).
- causal and window = (left, right) aligned to the bottom right: query i of
  Lq sees key j of Lk iff i + Lk - Lq - left <= j <= i + Lk - Lq + right, -1
  leaving a side unbounded; causal is right = 0. (In a packed batch,
  positions count within each sequence.)
- alibi_slopes (H,) float: adds -slope_h * |i + Lk - Lq - j| to the score.
  It gets no gradient (as FlashAttention's): a tensor that requires grad is
  refused, so that a slope meant to be trained does not silently stay put.
- softcap > 0: the scaled score s becomes softcap * tanh(s / softcap), before
  ALiBi and the masks; 0 or None: off.
- sinks (H,) float (gpt-oss): one more logit per head in each row's softmax
  denominator with no value; they get a gradient.
- dropout_p: dropout on the weights whenever it is positive (as
  FlashAttention's function: pass 0.0 in evaluation); the mask is drawn from
  a key taken from torch's generator (torch.manual_seed repeats it), not
  FlashAttention's.
- A query with no key to see (causal with Lq > Lk, a window past the keys)
  gets zeros, as FlashAttention's, never NaN; no gradient flows through it.
- Autograd: gradients for q, k, v and sinks; each call keeps its own
  context; double backward raises.
- dtypes: float32; bfloat16 and float16 are computed in float32 and returned
  in their dtype; float64 raises TypeError. CPU tensors only.
"""
import numbers

import torch

from . import _attention_glue as _glue
from . import _checks, _torch_ops

OP = "mha.torch.attention"

__all__ = ["attention"]


def _check_tensor(x, name):
    _glue.check_tensor(OP, x, name)


def per_head(x, name, H, op=OP):
    """alibi_slopes / sinks: None or a (H,) floating tensor -> None or a float32 tensor (its values are
    checked to be finite by the operator, python/mha/_torch_ops.py)."""
    if x is None:
        return None
    _glue.check_tensor(op, x, name)
    if not x.is_floating_point():
        raise TypeError(f"[{op}] {name}: dtype {x.dtype}; wanted a floating tensor (one value per query head)")
    if tuple(x.shape) != (H,):
        raise ValueError(f"[{op}] {name}: shape {tuple(x.shape)}; wanted ({H},), one value per query head")
    return x.float().contiguous()


def window_sides(window, causal, op=OP):
    """(left, right) from window and causal (right = 0 when causal), each >= -1."""
    if window is None:
        left, right = -1, -1
    else:
        # Integers of any kind (numpy's too, as torch takes them), never bools.
        if (not isinstance(window, (tuple, list)) or len(window) != 2
                or not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window)):
            raise _checks.wrong_kind(op, "window", window, "None or a pair (left, right) of integers (-1: unbounded)")
        left, right = (int(w) for w in window)
        if left < -1 or right < -1:
            raise ValueError(f"[{op}] window: ({left}, {right}) has a side below -1; wanted each side >= 0 keys, "
                             "or -1 for unbounded")
    # A side wider than any axis bounds nothing: the same as -1 (and no int64 overflow in the kernels).
    left, right = (-1 if w > 2**31 else w for w in (left, right))
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _documents(cu_seqlens, max_seqlen):
    """cu_seqlens (B + 1 offsets from 0 to T: checked by the operator) -> an int64 tensor; max_seqlen as an
    int (2**31 when not given, above any sequence: the operator checks it against the longest)."""
    _check_tensor(cu_seqlens, "cu_seqlens")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"[{OP}] cu_seqlens: dtype {cu_seqlens.dtype}; wanted torch.int32 (as FlashAttention's) "
                        "or torch.int64")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"[{OP}] cu_seqlens: shape {tuple(cu_seqlens.shape)}; wanted (B + 1,) offsets with B >= 1")
    if max_seqlen is None:
        max_seqlen = 2**31
    else:
        max_seqlen = _checks.integer(max_seqlen, OP, "max_seqlen")
        if max_seqlen > 2**31 - 1:
            raise ValueError(f"[{OP}] max_seqlen: {max_seqlen}; wanted at most 2147483647 (FlashAttention's int32)")
        if max_seqlen < 0:
            raise ValueError(f"[{OP}] max_seqlen: {max_seqlen}; wanted a length >= 0 (at least the longest "
                             "sequence of cu_seqlens)")
    return cu_seqlens.detach().to(torch.int64).contiguous(), max_seqlen


def attention(q, k, v, *, causal=False, window=None, alibi_slopes=None, softcap=None, sinks=None, cu_seqlens=None,
              max_seqlen=None, scale=None, dropout_p=0.0):
    """softmax(softcap(q k^T * scale) + ALiBi, masked by causal/window/sequences, with sinks) v, with
    FlashAttention's arguments and conventions (module docstring); gradients by mha's attention backward."""
    _glue.check_inputs(OP, ((q, "q"), (k, "k"), (v, "v")))
    causal = _checks.flag(causal, OP, "causal")
    dropout_p = _glue.dropout_probability(OP, dropout_p)
    packed = cu_seqlens is not None
    rank = 3 if packed else 4
    if q.dim() != rank or k.dim() != rank or v.dim() != rank:
        want = "(T, H, d), (T, Hkv, d), (T, Hkv, dv) with cu_seqlens" if packed else \
            "(B, Lq, H, d), (B, Lk, Hkv, d), (B, Lk, Hkv, dv) (packed (T, H, d) rows need cu_seqlens)"
        raise ValueError(f"[{OP}] q, k, v: shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; "
                         f"wanted {want}")
    if not packed and max_seqlen is not None:
        raise ValueError(f"[{OP}] max_seqlen: {max_seqlen!r} without cu_seqlens; wanted it only with a packed batch")
    q4, k4, v4 = (x.unsqueeze(0) for x in (q, k, v)) if packed else (q, k, v)
    B, Lq, H, d = q4.shape
    Lk, Hkv = k4.shape[1], k4.shape[2]
    dv = v4.shape[3]
    if (k4.shape[0] != B or k4.shape[3] != d or tuple(v4.shape[:3]) != tuple(k4.shape[:3])
            or (packed and Lk != Lq)):
        rows = "T" if packed else "B, Lk"
        raise ValueError(f"[{OP}] k, v: shapes {tuple(k.shape)}, {tuple(v.shape)} do not fit q {tuple(q.shape)}; "
                         f"wanted k ({rows}, Hkv, {d}) and v ({rows}, Hkv, dv) with q's "
                         f"{'T' if packed else 'B'}")
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"[{OP}] k: {Hkv} heads do not divide q's {H}; wanted Hkv dividing H (grouped heads)")
    left, right = window_sides(window, causal)
    scale = _glue.positive_scale(OP, scale, d)
    softcap = _glue.softcap_value(OP, softcap)
    if alibi_slopes is not None and isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.requires_grad \
            and torch.is_grad_enabled():
        raise NotImplementedError(f"[{OP}] alibi_slopes: requires grad; the slopes get no gradient (as "
                                  "FlashAttention's): pass alibi_slopes.detach()")
    slopes = per_head(alibi_slopes, "alibi_slopes", H)
    sink_values = per_head(sinks, "sinks", H)
    offsets, max_seqlen = _documents(cu_seqlens, max_seqlen) if packed else (None, 2**31)
    out_dtype = q.dtype
    out_shape = (*q.shape[:-1], dv)
    if B * H * Lq * Lk * d == 0 or dv == 0:
        # Nothing to attend to (Lk = 0: every query sees no key, so zeros) or nothing to compute.
        _torch_ops.flash_checks(slopes, sink_values, offsets, max_seqlen, Lq)  # values are still checked
        tie = 0.0 * (q.sum() + k.sum() + v.sum() + (sinks.sum() if sinks is not None else 0.0))
        return q.new_zeros(out_shape) + tie
    # float(): a bfloat16 input gets its gradient through the widening.
    q32, k32, v32 = (x.float().contiguous() for x in (q4, k4, v4))
    out = _torch_ops.flash(q32, k32, v32, slopes, sink_values, offsets, _torch_ops.dropout_key(dropout_p),
                           [left, right], causal, [float(scale), float(softcap), float(dropout_p)], max_seqlen)
    return _glue.in_dtype(out.reshape(out_shape), out_dtype)
