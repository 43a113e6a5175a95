"""The operators under mha.torch's attention functions: one forward and one
backward per function, on the stateless calls of python/bindings/sdpa_calls.cpp and
python/bindings/attention_calls.cpp.

    sdpa(q, k, v, mask, sinks, dropout_key, causal, scale, softcap, dropout_p) -> out
        q [B,H,L,E], k [B,Hkv,S,E], v [B,Hkv,S,Ev] float32 contiguous; mask None or
        [b,h,L,S] (b in {1,B}, h in {1,H}) bool (True = takes part) or float32;
        sinks None or [H]; dropout_key an int64 tensor of one element -> [B,H,L,Ev]
    flash(q, k, v, alibi, sinks, cu_seqlens, dropout_key, window, causal, scale_softcap_p,
          max_seqlen) -> out
        q (B,L,H,d), k (B,S,Hkv,d), v (B,S,Hkv,dv); window [left, right]; cu_seqlens
        None or (documents + 1,) int64; max_seqlen 2**31 when not given -> (B,L,H,dv)

The operators take their scalars as one list each, the scales, softcap and dropout
probability as [scale, softcap, p] (mha::sdpa's and mha::flash's `scalars`), and
mha::flash takes causal folded into its window (causal_window): mha::sdpa(q, k, v,
mask, sinks, dropout_key, causal, scalars), mha::flash(q, k, v, alibi, sinks,
cu_seqlens, dropout_key, window, scalars, max_seqlen), and their backwards the
gradient, the inputs, out and the statistics before the same options.
    flash_kvcache(q, k_cache!, v_cache!, k, v, cache_seqlens, alibi, sinks, window, causal,
                  scale_softcap) -> out
        q (B,L,H,d) float32 contiguous; k_cache (B,capacity,Hkv,d), v_cache
        (B,capacity,Hkv,dv) float32 or bfloat16 contiguous, written in place: k, v
        None or (B,n,Hkv,d/dv) go to slots cache_seqlens[b] .. + n - 1 of row b;
        cache_seqlens (B,) int32/int64 (not changed) -> (B,L,H,dv), no autograd

On torch >= 2.4 these are torch.library custom operators in the `mha`
namespace (torch.ops.mha.sdpa, .sdpa_backward, .flash, .flash_backward,
.flash_kvcache), each with a fake implementation (shapes only) and, but for
the cached call (no backward, as FlashAttention's), an autograd formula, so that
torch.compile(fullgraph=True) and torch.export keep them whole and
torch.library.opcheck passes. On older torch (1.13, no torch.library.custom_op)
the same calls run under a torch.autograd.Function with the same signature.

Checks that read values (the offsets of cu_seqlens, finite sinks and slopes)
run inside the operators, where the tensors hold data; the functions check
shapes, dtypes and options before (python/mha/torch_sdpa.py,
python/mha/torch_attention.py).
"""
from typing import List, Optional, Tuple

import torch

from . import _attention_glue as _glue
from . import _core

_sdpa = _core._sdpa_calls
_flash = _core._attention_calls
_FLASH_OP = "mha.torch.attention"
_SDPA_OP = "mha.torch.scaled_dot_product_attention"
_MAX_FUSED_KEYS = 1 << 24  # kFusedMaxKeys (src/cpu/fused/limits.h): beyond it no statistics are kept

HAS_LIBRARY = hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def _np(x):
    return None if x is None else x.detach().numpy()


def _stats_tensor(stats):
    return torch.empty(0) if stats is None else torch.from_numpy(stats)


def _stats_array(stats):
    return None if stats.numel() == 0 else stats.detach().numpy()


def _grad(g, like):
    return torch.zeros_like(like) if g is None else torch.from_numpy(g)


# ---- scaled_dot_product_attention -------------------------------------------

def _sdpa_options(mask, sinks, dropout_key, causal, scalars):
    scale, softcap, dropout_p = scalars
    key = int(dropout_key.reshape(-1)[0]) if dropout_p > 0 else 0
    return (_np(mask), bool(causal), float(scale), float(softcap), _np(sinks), float(dropout_p), key)


def _sdpa_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                  sinks: Optional[torch.Tensor], dropout_key: torch.Tensor, causal: bool,
                  scalars: List[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    if mask is not None and mask.is_floating_point() and not bool(torch.isfinite(mask).all()) \
            and bool((torch.isnan(mask) | (mask == float("inf"))).any()):
        raise ValueError(f"[{_SDPA_OP}] attn_mask: holds NaN or +inf; wanted finite values, or -inf for a key "
                         "that takes no part (NaN and +inf can only give NaN)")
    out, stats = _sdpa.forward(_np(q), _np(k), _np(v), _sdpa_options(mask, sinks, dropout_key, causal, scalars))
    out = torch.from_numpy(out)
    float_mask = mask if mask is not None and mask.is_floating_point() else None
    _glue.check_overflow(_SDPA_OP, out, ((q, "query"), (k, "key"), (v, "value"), (float_mask, "attn_mask"),
                                         (sinks, "sinks")), scalars[0])
    return out, _stats_tensor(stats)


def _sdpa_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   stats: torch.Tensor, mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                   dropout_key: torch.Tensor, causal: bool,
                   scalars: List[float]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gq, gk, gv, gs = _sdpa.backward(_np(grad_out.float().contiguous()), _np(q), _np(k), _np(v), _np(out),
                                    _stats_array(stats), _sdpa_options(mask, sinks, dropout_key, causal, scalars))
    return (torch.from_numpy(gq), torch.from_numpy(gk), torch.from_numpy(gv),
            torch.empty(0) if gs is None else torch.from_numpy(gs))


def _sdpa_fake(q, k, v, mask, sinks, dropout_key, causal, scalars):
    B, H, L, _ = q.shape
    rows = B * H * L if k.shape[2] <= _MAX_FUSED_KEYS else 0
    return q.new_empty((B, H, L, v.shape[3])), q.new_empty((2, rows) if rows else (0,))


def _sdpa_backward_fake(grad_out, q, k, v, out, stats, mask, sinks, dropout_key, causal, scalars):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty((0,)) if sinks is None else torch.empty_like(sinks))


# ---- attention (FlashAttention's layout and options) ------------------------

def flash_checks(alibi, sinks, cu_seqlens, max_seqlen, T, op=_FLASH_OP):
    """The checks that read values, with the messages of the calling function's other checks."""
    for x, name in ((alibi, "alibi_slopes"), (sinks, "sinks")):
        if x is not None and not bool(torch.isfinite(x).all()):
            raise ValueError(f"[{op}] {name}: {x.tolist()} holds a value that is not finite; wanted finite "
                             "numbers")
    if cu_seqlens is None:
        return
    o = cu_seqlens
    lengths = o[1:] - o[:-1]
    if int(o[0]) != 0 or int(o[-1]) != T or bool((lengths < 0).any()):
        shown = o.tolist() if o.numel() <= 12 else o[:12].tolist() + ["..."]
        raise ValueError(f"[{_FLASH_OP}] cu_seqlens: {shown}; wanted nondecreasing offsets from 0 to the {T} packed "
                         "rows")
    longest = int(lengths.max())
    if max_seqlen < longest:
        raise ValueError(f"[{_FLASH_OP}] max_seqlen: {max_seqlen} is below the longest sequence of cu_seqlens "
                         f"({longest} rows); wanted at least {longest}")


def causal_window(window, causal):
    """FlashAttention's causal mask folded into its window (both bottom right): causal keeps the keys up
    to each query's diagonal, which is the window's right side 0, so the operator takes one window."""
    left, right = int(window[0]), int(window[1])
    return [left, 0 if right < 0 else min(right, 0)] if causal else [left, right]


def _flash_options(alibi, sinks, cu_seqlens, dropout_key, window, scalars):
    scale, softcap, dropout_p = scalars
    key = int(dropout_key.reshape(-1)[0]) if dropout_p > 0 else 0
    return (False, int(window[0]), int(window[1]), float(softcap), _np(alibi), _np(sinks), _np(cu_seqlens),
            float(scale), float(dropout_p), key)


def _flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi: Optional[torch.Tensor],
                   sinks: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], dropout_key: torch.Tensor,
                   window: List[int], scalars: List[float], max_seqlen: int) -> Tuple[torch.Tensor, torch.Tensor]:
    flash_checks(alibi, sinks, cu_seqlens, max_seqlen, q.shape[1])
    out, stats = _flash.forward(_np(q), _np(k), _np(v),
                                _flash_options(alibi, sinks, cu_seqlens, dropout_key, window, scalars))
    out = torch.from_numpy(out)
    _glue.check_overflow(_FLASH_OP, out, ((q, "q"), (k, "k"), (v, "v"), (alibi, "alibi_slopes"), (sinks, "sinks")),
                         scalars[0])
    return out, _stats_tensor(stats)


def _flash_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    stats: torch.Tensor, alibi: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                    cu_seqlens: Optional[torch.Tensor], dropout_key: torch.Tensor, window: List[int],
                    scalars: List[float]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gq, gk, gv, gs = _flash.backward(_np(grad_out.float().contiguous()), _np(q), _np(k), _np(v), _np(out),
                                     _stats_array(stats),
                                     _flash_options(alibi, sinks, cu_seqlens, dropout_key, window, scalars))
    return (torch.from_numpy(gq), torch.from_numpy(gk), torch.from_numpy(gv),
            torch.empty(0) if gs is None else torch.from_numpy(gs))


def _flash_fake(q, k, v, alibi, sinks, cu_seqlens, dropout_key, window, scalars, max_seqlen):
    B, L, H, _ = q.shape
    rows = B * H * L if k.shape[1] <= _MAX_FUSED_KEYS else 0
    return q.new_empty((B, L, H, v.shape[3])), q.new_empty((2, rows) if rows else (0,))


def _flash_backward_fake(grad_out, q, k, v, out, stats, alibi, sinks, cu_seqlens, dropout_key, window, scalars):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty((0,)) if sinks is None else torch.empty_like(sinks))


# ---- attention over a key/value cache (flash_attn_with_kvcache) -------------

_KVCACHE_OP = "mha.torch.attention_with_kv_cache"


def _cache_array(c):
    """A cache tensor as the array the call reads in place: float32, or bfloat16's bits as uint16."""
    c = c.detach()
    if c.dtype == torch.bfloat16:
        return c.view(torch.int16).numpy().view("uint16")
    return c.numpy()


def _kvcache_lengths(cache_seqlens, n, capacity, L, causal):
    """The keys each row holds after the call's n new ones (int64), checked against the capacity."""
    lengths = cache_seqlens.to(torch.int64)
    total = lengths + n
    bad = (lengths < 0) | (total > capacity)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(f"[{_KVCACHE_OP}] cache_seqlens: row {b} holds {int(lengths[b])} keys; with the call's {n} "
                         f"new ones wanted 0 <= cache_seqlens[b] and cache_seqlens[b] + {n} <= the cache's "
                         f"{capacity} slots")
    if causal:
        short = (total > 0) & (total < L)
        if bool(short.any()):
            b = int(short.nonzero()[0, 0])
            raise ValueError(f"[{_KVCACHE_OP}] cache_seqlens: row {b} has {int(total[b])} keys for {L} causal "
                             f"queries; wanted 0 or at least {L} keys (cache_seqlens[b] + new keys): causal "
                             "queries are the row's last L positions")
    return total


def _flash_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                   v: Optional[torch.Tensor], cache_seqlens: torch.Tensor, alibi: Optional[torch.Tensor],
                   sinks: Optional[torch.Tensor], window: List[int], causal: bool,
                   scale_softcap: List[float]) -> torch.Tensor:
    flash_checks(alibi, sinks, None, 0, 0, _KVCACHE_OP)
    B, capacity = k_cache.shape[0], k_cache.shape[1]
    n = 0 if k is None else k.shape[1]
    lengths = _kvcache_lengths(cache_seqlens, n, capacity, q.shape[1], causal)
    if n:
        rows = torch.arange(B).unsqueeze(1)
        slots = cache_seqlens.to(torch.int64).unsqueeze(1) + torch.arange(n)
        k_cache[rows, slots] = k.to(k_cache.dtype)
        v_cache[rows, slots] = v.to(v_cache.dtype)
    if q.numel() == 0 or v_cache.shape[3] == 0:  # no query, or nothing to weigh (d = 0: no score either)
        return q.new_zeros((*q.shape[:3], v_cache.shape[3]))
    scale, softcap = scale_softcap
    options = (bool(causal), int(window[0]), int(window[1]), float(softcap), _np(alibi), _np(sinks), float(scale))
    out = torch.from_numpy(_flash.with_kv_cache(_np(q), _cache_array(k_cache), _cache_array(v_cache),
                                                lengths.numpy(), options))
    if not bool(torch.isfinite(out).all()):  # the keys and values read: each row's first lengths[b] slots
        read = [(torch.cat([c[b, :int(lengths[b])].reshape(-1) for b in range(B)]), name)
                for c, name in ((k_cache, "k_cache"), (v_cache, "v_cache"))]
        _glue.check_overflow(_KVCACHE_OP, out, ((q, "q"), *read, (alibi, "alibi_slopes"), (sinks, "sinks")),
                             scale)
    return out


def _flash_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, alibi, sinks, window, causal, scale_softcap):
    return q.new_empty((*q.shape[:3], v_cache.shape[3]))


def _no_double_backward(op):
    """backward(create_graph=True) refused: the gradients would be constants of the graph."""
    if torch.is_grad_enabled() and not compiling():
        raise RuntimeError(f"[{op}] backward with create_graph=True: mha's attention has no double backward; "
                           "its first-order gradients are exact")


def compiling():
    """Whether torch.compile or torch.export traces this call (AOTAutograd traces the backward with grad on)."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


# ---- the operators -----------------------------------------------------------

if HAS_LIBRARY:
    _sdpa_op = torch.library.custom_op("mha::sdpa", mutates_args=())(_sdpa_forward)
    _sdpa_op.register_fake(_sdpa_fake)
    _sdpa_backward_op = torch.library.custom_op("mha::sdpa_backward", mutates_args=())(_sdpa_backward)
    _sdpa_backward_op.register_fake(_sdpa_backward_fake)
    _flash_op = torch.library.custom_op("mha::flash", mutates_args=())(_flash_forward)
    _flash_op.register_fake(_flash_fake)
    _flash_backward_op = torch.library.custom_op("mha::flash_backward", mutates_args=())(_flash_backward)
    _flash_backward_op.register_fake(_flash_backward_fake)

    def _sdpa_setup(ctx, inputs, output):
        q, k, v, mask, sinks, dropout_key, causal, scalars = inputs
        ctx.save_for_backward(q, k, v, output[0], output[1], mask, sinks, dropout_key)
        ctx.options = (causal, scalars)
        ctx.has_sinks = sinks is not None

    def _sdpa_grad(ctx, grad_out, _grad_stats):
        _no_double_backward("mha.torch.scaled_dot_product_attention")
        q, k, v, out, stats, mask, sinks, dropout_key = ctx.saved_tensors
        gq, gk, gv, gs = _sdpa_backward_op(grad_out.contiguous(), q, k, v, out, stats, mask, sinks, dropout_key,
                                           *ctx.options)
        return gq, gk, gv, None, (gs if ctx.has_sinks else None), None, None, None

    _sdpa_op.register_autograd(_sdpa_grad, setup_context=_sdpa_setup)

    def _flash_setup(ctx, inputs, output):
        q, k, v, alibi, sinks, cu_seqlens, dropout_key, window, scalars, _max_seqlen = inputs
        ctx.save_for_backward(q, k, v, output[0], output[1], alibi, sinks, cu_seqlens, dropout_key)
        ctx.options = (window, scalars)
        ctx.has_sinks = sinks is not None

    def _flash_grad(ctx, grad_out, _grad_stats):
        _no_double_backward(_FLASH_OP)
        q, k, v, out, stats, alibi, sinks, cu_seqlens, dropout_key = ctx.saved_tensors
        gq, gk, gv, gs = _flash_backward_op(grad_out.contiguous(), q, k, v, out, stats, alibi, sinks, cu_seqlens,
                                            dropout_key, *ctx.options)
        return gq, gk, gv, None, (gs if ctx.has_sinks else None), None, None, None, None, None

    _flash_op.register_autograd(_flash_grad, setup_context=_flash_setup)

    _flash_kvcache_op = torch.library.custom_op("mha::flash_kvcache",
                                                mutates_args=("k_cache", "v_cache"))(_flash_kvcache)
    _flash_kvcache_op.register_fake(_flash_kvcache_fake)

    def sdpa(q, k, v, mask, sinks, dropout_key, causal, scale, softcap, dropout_p):
        return _sdpa_op(q, k, v, mask, sinks, dropout_key, causal, [scale, softcap, dropout_p])[0]

    def flash(q, k, v, alibi, sinks, cu_seqlens, dropout_key, window, causal, scalars, max_seqlen):
        return _flash_op(q, k, v, alibi, sinks, cu_seqlens, dropout_key, causal_window(window, causal), scalars,
                         max_seqlen)[0]

    def flash_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, alibi, sinks, window, causal, scale_softcap):
        return _flash_kvcache_op(q, k_cache, v_cache, k, v, cache_seqlens, alibi, sinks, window, causal,
                                 scale_softcap)

    OPERATORS = ("sdpa", "sdpa_backward", "flash", "flash_backward", "flash_kvcache")

else:
    class _Function(torch.autograd.Function):
        """forward(kind, options, q, k, v, sinks) -> out; the backward of the same stateless calls. The
        inputs and the output are saved, so one changed in place before the backward fails there, as with
        PyTorch's own functions."""

        @staticmethod
        def forward(ctx, kind, options, q, k, v, sinks):
            forward = _sdpa_forward if kind == "sdpa" else _flash_forward
            out, stats = forward(q, k, v, *options[0](sinks))
            ctx.kind, ctx.options, ctx.stats = kind, options, stats
            ctx.save_for_backward(q, k, v, sinks, out)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, sinks, out = ctx.saved_tensors
            op = "mha.torch.scaled_dot_product_attention" if ctx.kind == "sdpa" else _FLASH_OP
            _no_double_backward(op)
            backward = _sdpa_backward if ctx.kind == "sdpa" else _flash_backward
            gq, gk, gv, gs = backward(grad_out.detach(), q, k, v, out, ctx.stats, *ctx.options[1](sinks))
            return None, None, gq, gk, gv, (gs if sinks is not None else None)

    def _run(kind, q, k, v, sinks, forward_args, backward_args):
        if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, sinks)):
            return _Function.apply(kind, (forward_args, backward_args), q, k, v, sinks)
        forward = _sdpa_forward if kind == "sdpa" else _flash_forward
        return forward(q, k, v, *forward_args(sinks))[0]

    def sdpa(q, k, v, mask, sinks, dropout_key, causal, scale, softcap, dropout_p):
        rest = (causal, [scale, softcap, dropout_p])
        return _run("sdpa", q, k, v, sinks, lambda s: (mask, s, dropout_key, *rest),
                    lambda s: (mask, s, dropout_key, *rest))

    def flash(q, k, v, alibi, sinks, cu_seqlens, dropout_key, window, causal, scalars, max_seqlen):
        window = causal_window(window, causal)
        return _run("flash", q, k, v, sinks,
                    lambda s: (alibi, s, cu_seqlens, dropout_key, window, scalars, max_seqlen),
                    lambda s: (alibi, s, cu_seqlens, dropout_key, window, scalars))

    flash_kvcache = _flash_kvcache  # no autograd: the caller refuses inputs that require grad

    OPERATORS = ()


def dropout_key(p):
    """The key of a call's dropout masks as an int64 tensor of one element: drawn from torch's generator
    when p > 0 (torch.manual_seed repeats it; traceable, so compiled models draw it too), else 0."""
    if p > 0:
        return torch.randint(0, 2**62, (1,), dtype=torch.int64)
    return torch.zeros(1, dtype=torch.int64)

