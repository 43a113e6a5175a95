"""mha.torch.attention_with_kv_cache: FlashAttention's flash_attn_with_kvcache on mha's decode kernels.

    out = mha.torch.attention_with_kv_cache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens,
                                            causal=False, window=None, alibi_slopes=None, softcap=None,
                                            sinks=None, scale=None)

Incremental decoding with the cache as plain torch tensors that the caller
owns (a static cache, as transformers' StaticCache and FlashAttention's),
so the call is one torch.library operator (torch.ops.mha.flash_kvcache on
torch >= 2.4) that torch.compile(fullgraph=True) and torch.export keep whole.
flash_attn_with_kvcache's conventions:
- q (B, Lq, H, d); k_cache (B, capacity, Hkv, d), v_cache (B, capacity, Hkv,
  dv), contiguous, float32 or bfloat16 (half the memory; read as stored, the
  arithmetic float32); Hkv divides H (grouped heads).
- cache_seqlens: an int, or a (B,) int32/int64 tensor: the keys each row
  holds before this call. The function does not change it (advance it
  yourself, as with FlashAttention).
- k (B, n, Hkv, d), v (B, n, Hkv, dv), optional together: new keys and values,
  written in place into slots cache_seqlens[b] .. cache_seqlens[b] + n - 1
  of each row (rounded to the cache's dtype) before the attention; then row
  b has K_b = cache_seqlens[b] + n keys.
- causal and window = (left, right) aligned to the bottom right of each row:
  query i of Lq sees key j iff i + K_b - Lq - left <= j <= i + K_b - Lq +
  right (-1: unbounded); causal is right = 0. A causal call needs K_b = 0 or
  K_b >= Lq (FlashAttention gives the queries before the first key zeros;
  here it is refused, so a wrong cache_seqlens is not silently read).
- alibi_slopes (H,), softcap (> 0: s -> softcap * tanh(s / softcap)), sinks
  (H,) and scale (1/sqrt(d) by default): as mha.torch.attention.
- A query with no key to see (a row with K_b = 0, a window past the keys)
  gets zeros, never NaN.
- No autograd (as FlashAttention's): an input that requires grad under grad
  mode is refused; decode under torch.no_grad() or torch.inference_mode().
- Returns (B, Lq, H, dv) in q's dtype (float32, bfloat16 or float16; float32
  arithmetic). CPU tensors only. Not for paged caches (block_table) yet.
"""

import torch

from . import _attention_glue as _glue
from . import _checks, _torch_ops
from . import _torch_traced as _traced
from .torch_attention import per_head, window_sides

OP = "mha.torch.attention_with_kv_cache"

__all__ = ["attention_with_kv_cache"]


def _check_cache(c, name):
    _glue.check_tensor(OP, c, name)
    if c.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"[{OP}] {name}: dtype {c.dtype}; wanted torch.float32 or torch.bfloat16 (the cache's "
                        "storage, read in place)")
    if c.dim() != 4:
        raise ValueError(f"[{OP}] {name}: shape {tuple(c.shape)}; wanted (B, capacity, Hkv, width)")
    if not c.is_contiguous():
        raise ValueError(f"[{OP}] {name}: not contiguous (strides {c.stride()}); wanted a contiguous tensor, "
                         "written and read in place (make it with torch.zeros)")


def _seqlens(cache_seqlens, B):
    """cache_seqlens (an int, or a (B,) int32/int64 tensor) -> a (B,) int64 tensor (values checked by the
    operator against the capacity)."""
    if isinstance(cache_seqlens, torch.Tensor):
        _glue.check_tensor(OP, cache_seqlens, "cache_seqlens")
        if cache_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"[{OP}] cache_seqlens: dtype {cache_seqlens.dtype}; wanted torch.int32 (as "
                            "FlashAttention's) or torch.int64")
        if tuple(cache_seqlens.shape) != (B,):
            raise ValueError(f"[{OP}] cache_seqlens: shape {tuple(cache_seqlens.shape)}; wanted ({B},), the keys "
                             "each batch row holds")
        return cache_seqlens.detach().to(torch.int64).contiguous()
    n = _checks.integer(cache_seqlens, OP, "cache_seqlens")
    return torch.full((B,), n, dtype=torch.int64)


def attention_with_kv_cache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, causal=False, window=None,
                            alibi_slopes=None, softcap=None, sinks=None, scale=None):
    """softmax(softcap(q k^T * scale) + ALiBi, masked by causal/window, with sinks) v over each row's
    cached keys, after writing the new k, v into the caches (module docstring; flash_attn_with_kvcache's
    arguments and conventions)."""
    _glue.check_inputs(OP, ((q, "q"),))
    _check_cache(k_cache, "k_cache")
    _check_cache(v_cache, "v_cache")
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"[{OP}] v_cache: dtype {v_cache.dtype}; wanted k_cache's, {k_cache.dtype}")
    if (k is None) != (v is None):
        raise ValueError(f"[{OP}] k, v: {'k' if v is None else 'v'} given alone; wanted both (new keys and "
                         "values) or neither")
    causal = _checks.flag(causal, OP, "causal")
    if q.dim() != 4:
        raise ValueError(f"[{OP}] q: shape {tuple(q.shape)}; wanted (B, Lq, H, d)")
    B, Lq, H, d = q.shape
    capacity, Hkv, dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    if (k_cache.shape[0] != B or k_cache.shape[3] != d or v_cache.shape[0] != B
            or tuple(v_cache.shape[1:3]) != (capacity, Hkv)):
        raise ValueError(f"[{OP}] k_cache, v_cache: shapes {tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not "
                         f"fit q {tuple(q.shape)}; wanted ({B}, capacity, Hkv, {d}) and ({B}, capacity, Hkv, dv)")
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"[{OP}] k_cache: {Hkv} heads do not divide q's {H}; wanted Hkv dividing H "
                         "(grouped heads)")
    if k is not None:
        _glue.check_inputs(OP, ((k, "k"), (v, "v")))
        n = k.shape[1] if k.dim() == 4 else -1
        if (k.dim() != 4 or tuple(k.shape) != (B, n, Hkv, d) or v.dim() != 4
                or tuple(v.shape) != (B, n, Hkv, dv)):
            raise ValueError(f"[{OP}] k, v: shapes {tuple(k.shape)}, {tuple(v.shape)}; wanted ({B}, n, {Hkv}, {d}) "
                             f"and ({B}, n, {Hkv}, {dv}), the caches' rows and heads")
    left, right = window_sides(window, causal, OP)
    scale = _glue.positive_scale(OP, scale, d)
    softcap = _glue.softcap_value(OP, softcap)
    slopes = per_head(alibi_slopes, "alibi_slopes", H, OP)
    sink_values = per_head(sinks, "sinks", H, OP)
    lengths = _seqlens(cache_seqlens, B)
    # (torch.export traces with grad on: there the operator, which has no autograd formula, stands alone.)
    if torch.is_grad_enabled() and not _traced.tracing(q) and any(x is not None and x.requires_grad
                                       for x in (q, k, v, k_cache, v_cache, alibi_slopes, sinks)):
        raise NotImplementedError(f"[{OP}] an input requires grad; attention over a cache has no backward (as "
                                  "FlashAttention's): run it under torch.no_grad() or torch.inference_mode()")
    out_dtype = q.dtype
    out = _torch_ops.flash_kvcache(q.float().contiguous(), k_cache, v_cache,
                                   None if k is None else k.contiguous(), None if v is None else v.contiguous(),
                                   lengths, slopes, sink_values, [left, right], causal, [float(scale), float(softcap)])
    return _glue.in_dtype(out, out_dtype)
