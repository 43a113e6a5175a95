"""The modules' calls as torch.compile and torch.export trace them (torch >= 2.4).

Eagerly, mha.torch's modules run projections, attention and backward inside
mha (python/bindings/torch_calls.cpp), through an autograd Function that keeps the
call's C++ context: nothing a graph can hold. When torch.compile or
torch.export traces a module, its call is written instead as torch's linear
layers around mha's attention operator (torch.ops.mha.sdpa,
python/mha/_torch_ops.py), with the masks built by torch's ops: the same
function to float32 rounding, forward and gradients
(tests/python/test_torch2_library.py compares it with the eager call).
Options this form does not cover are refused by name.

    drop_in(module, query, key, value, masks, need_weights, average, head_mask, precision)
        -> (out, weights or None)
    chapter(module, queries, keys, values, valid_lens, masks, head_mask, precision) -> out

masks: the call's _torch_call._CallMasks (masks as given, is_causal, window, score options). The
modules' cached calls over a TensorKVCache (drop_in_cached, chapter_cached) run the same way,
eagerly or traced.
"""
import math

import torch
from torch.nn import functional as F

from . import _core, _torch_ops
from ._torch_cache import tensor_cache_lock


def tracing(*tensors):
    """Whether torch.compile or torch.export is tracing this call (torch >= 2.4 only)."""
    if not _torch_ops.HAS_LIBRARY:
        return False
    compiler = torch.compiler
    if compiler.is_compiling() or (hasattr(compiler, "is_exporting") and compiler.is_exporting()):
        return True
    from torch._subclasses.fake_tensor import FakeTensor
    return any(isinstance(t, FakeTensor) for t in tensors)


def _refuse(op, what):
    hint = ("; a compiled decoder keeps its cache as tensors: mha.torch.attention_with_kv_cache"
            if what == "cache" else "")
    raise NotImplementedError(f"[{op}] {what} under torch.compile / torch.export: the traced form of mha's "
                              "modules (python/mha/_torch_traced.py) does not take it; call the module eagerly "
                              f"(or keep it out of the compiled region with torch.compiler.disable){hint}")


def causal_kind(is_causal):
    """is_causal as the modules take it (a bool, or an mha.Causal) -> an mha.Causal."""
    if isinstance(is_causal, _core.Causal):
        return is_causal
    return _core.Causal.TOP_LEFT if is_causal else _core.Causal.NONE


def score_masks(B, H, L, S, Kt, kpm=None, am=None, causal=_core.Causal.NONE, window=None):
    """The masks of one call over (B, H or 1, L, Kt) scores, Kt >= S keys of which the first S are the
    given ones (the others appended by bias_k / add_zero_attn): (masked, additive), masked a boolean
    tensor (True = masked out) and additive a float tensor or None. kpm (B, S) and am (L, S) or
    (B*H, L, S) follow nn.MultiheadAttention (bool True = masked, floats added); causal and window
    count the given keys only, which appended keys stay visible to (as mha's kernels mask them)."""
    masked = torch.zeros(B, 1, L, Kt, dtype=torch.bool)
    additive = None

    def padded(t, fill):  # a mask over the S given keys, extended over the appended ones
        if t.shape[-1] == Kt:
            return t
        return torch.cat([t, torch.full((*t.shape[:-1], Kt - t.shape[-1]), fill, dtype=t.dtype)], -1)

    def add(t):
        return t if additive is None else additive + t

    if kpm is not None:
        t = kpm.detach()
        if t.dtype == torch.bool:
            masked = masked | padded(t, False)[:, None, None, :]
        else:
            additive = add(padded(t.float(), 0.0)[:, None, None, :])
    if am is not None:
        a = am.detach()
        a = a[None, None] if a.dim() == 2 else a.reshape(-1, H, L, S)
        if a.dtype in (torch.bool, torch.uint8):
            masked = masked | padded(a.bool(), False)
        else:
            additive = add(padded(a.float(), 0.0))
    i = torch.arange(L)[:, None]
    j = torch.arange(Kt)[None, :]
    given = j < S
    if causal != _core.Causal.NONE:
        last_key = i if causal == _core.Causal.TOP_LEFT else i + S - L
        masked = masked | ((j > last_key) & given)
    if window is not None:  # bottom-right aligned, FlashAttention's window_size
        left, right = window
        diag = i + S - L
        outside = ((left >= 0) & (j < diag - left)) | ((right >= 0) & (j > diag + right))
        masked = masked | (outside & given)
    return masked, additive


def _sdpa_mask(masked, additive):
    """One mask for the operator: boolean (True = takes part) without floats, else additive with -inf."""
    if additive is None:
        return ~masked
    return additive.expand(torch.broadcast_shapes(additive.shape, masked.shape)).masked_fill(
        masked, float("-inf")).contiguous()


def _weights(q, k, mask, softcap, sinks, scale):
    """softmax weights (B, H, L, Kt) of q k^T with the operator's mask (a row with no live key: zeros)."""
    s = q @ k.transpose(-2, -1) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if sinks is not None:
        B, H, L, _ = s.shape
        return torch.softmax(torch.cat([s, sinks.float().reshape(1, H, 1, 1).expand(B, H, L, 1)], -1), -1)[..., :-1]
    dead = torch.isneginf(s).all(-1, keepdim=True)
    return torch.where(dead, torch.zeros_like(s), torch.softmax(s.masked_fill(dead, 0.0), -1))


def _check_common(op, module, head_mask, precision):
    if module.head_gates is not None or head_mask is not None:
        _refuse(op, "head_gates / head_mask")
    if module._rotary is not None:
        _refuse(op, "rotary")
    if precision is not None and precision != "float32":
        _refuse(op, f"precision {precision!r} (bfloat16 and float16 inputs, or precision='bfloat16')")


def _drop_in_projections(module, query, key, value):
    """nn.MultiheadAttention's inputs as (B, L, E) batch-first and projected: (batched, q, k, v)."""
    batched = query.dim() == 3
    if not batched:
        query, key, value = (x.unsqueeze(0) for x in (query, key, value))
    elif not module.batch_first:
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    if module.in_proj_weight is not None:
        wq, wk, wv = module.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
    bq = bk = bv = None
    if module.in_proj_bias is not None:
        bq, bk, bv = module.in_proj_bias.chunk(3)
    return batched, F.linear(query.float(), wq, bq), F.linear(key.float(), wk, bk), F.linear(value.float(), wv, bv)


def _drop_in_output(module, heads, batched, dtype):
    """out_proj of the heads' concatenation (B, L, E), in the caller's layout and dtype."""
    out = F.linear(heads, module.out_proj.weight, module.out_proj.bias).to(dtype)
    if not batched:
        return out.squeeze(0)
    return out if module.batch_first else out.transpose(0, 1)


def drop_in(module, query, key, value, masks, need_weights, average, head_mask, precision):
    """mha.torch.MultiheadAttention's call (no cache) as traced: nn.MultiheadAttention's projections,
    bias_k / bias_v and add_zero_attn, its masks (masks: _torch_call._CallMasks), mha's attention
    operator, out_proj."""
    op = "mha.torch.MultiheadAttention"
    _check_common(op, module, head_mask, precision)
    key_padding_mask, attn_mask = masks.given
    alibi_slopes, softcap, sinks = masks.alibi_slopes, masks.softcap, masks.sinks
    if module._kept() is not None:
        _refuse(op, "a module with pruned heads")
    if alibi_slopes is not None:
        _refuse(op, "alibi_slopes")
    if module._fully_masked_rows != _core.FullyMaskedRows.ZEROS:
        _refuse(op, "fully_masked_rows other than ZEROS")
    if any(isinstance(m, _core.Mask) for m in (key_padding_mask, attn_mask)):
        _refuse(op, "an mha.Mask (pass the mask as a tensor)")
    p = float(module.dropout) if module.training else 0.0
    if need_weights and p > 0.0:
        _refuse(op, "need_weights=True with dropout in training")
    E, H = module.embed_dim, module.num_heads
    d = E // H
    batched, q, k, v = _drop_in_projections(module, query, key, value)
    B, L, S = q.shape[0], q.shape[1], k.shape[1]
    if module.bias_k is not None:
        k = torch.cat([k, module.bias_k.reshape(1, 1, E).expand(B, 1, E)], 1)
        v = torch.cat([v, module.bias_v.reshape(1, 1, E).expand(B, 1, E)], 1)
    if module.add_zero_attn:
        k = torch.cat([k, k.new_zeros(B, 1, E)], 1)
        v = torch.cat([v, v.new_zeros(B, 1, E)], 1)
    Kt = k.shape[1]
    q, k, v = (x.reshape(B, -1, H, d).transpose(1, 2).contiguous() for x in (q, k, v))
    kpm = None if key_padding_mask is None else torch.as_tensor(key_padding_mask)
    am = None if attn_mask is None else torch.as_tensor(attn_mask)
    if kpm is not None and not batched:
        kpm = kpm.unsqueeze(0)
    masked, additive = score_masks(B, H, L, S, Kt, kpm, am, causal_kind(masks.is_causal), masks.window)
    mask = _sdpa_mask(masked, additive)
    scale = 1.0 / math.sqrt(d)
    softcap = 0.0 if softcap is None else float(softcap)
    sinks = None if sinks is None else sinks.float().contiguous()
    out = _torch_ops.sdpa(q, k, v, mask, sinks, _torch_ops.dropout_key(p), False, scale, softcap, p)
    out = _drop_in_output(module, out.transpose(1, 2).reshape(B, L, E), batched, query.dtype)
    w = None
    if need_weights:
        w = _weights(q, k, mask, softcap, sinks, scale)
        w = w.mean(1) if average else w
        w = w if batched else w.squeeze(0)
    return out, w


def chapter(module, queries, keys, values, valid_lens, masks, head_mask, precision):
    """The d2l chapter's module as traced: W_q, W_k, W_v, the chapter's masked softmax (keys past a
    row's valid length out; a row with length 0 averages every value, as the -1e6 fill gives), dropout
    on the weights, W_o. masks: _torch_call._CallMasks (its window and score options)."""
    op = "mha.torch.MultiHeadAttention"
    _check_common(op, module, head_mask, precision)
    window, softcap, sinks, alibi_slopes = masks.window, masks.softcap, masks.sinks, masks.alibi_slopes
    if module.kept_heads != list(range(module.original_num_heads)):
        _refuse(op, "a module with pruned heads")
    if alibi_slopes is not None:
        _refuse(op, "alibi_slopes")
    H = module.num_heads
    q, k, v = module.W_q(queries), module.W_k(keys), module.W_v(values)
    B, Q, D = q.shape
    K = k.shape[1]
    d = D // H
    q, k, v = (x.reshape(B, -1, H, d).transpose(1, 2).contiguous() for x in (q, k, v))
    masked, _ = score_masks(B, 1, Q, K, K, window=window)
    if valid_lens is not None:
        lens = torch.as_tensor(valid_lens).to(torch.float32)
        lens = lens[:, None].expand(B, Q) if lens.dim() == 1 else lens
        masked = masked | (torch.arange(K, dtype=torch.float32)[None, None, None, :] >= lens[:, None, :, None])
    # A row with no key left: the chapter's -1e6 fill makes its weights uniform, which zero scores give.
    dead = masked.all(-1, keepdim=True)                                   # (B, 1, Q, 1)
    q = q.masked_fill(dead, 0.0)
    masked = masked & ~dead
    p = float(module.attention.dropout.p) if module.training else 0.0
    out = _torch_ops.sdpa(q, k, v, ~masked, None if sinks is None else sinks.float().contiguous(),
                          _torch_ops.dropout_key(p), False, 1.0 / math.sqrt(d),
                          0.0 if softcap is None else float(softcap), p)
    return module.W_o(out.transpose(1, 2).reshape(B, Q, D))


# ---- cached calls over a TensorKVCache (python/mha/_torch_cache.py), eager or traced --------------

def _cached_attention(op, module, q, k, v, cache, masks):
    """q, k, v (B, n, E) projected -> (B, n, E): the new keys and values written at each row's length,
    the queries over the row's keys (causal over the new positions, a window over each row's keys,
    masks: _torch_call._CallMasks), the lengths advanced by n."""
    window = masks.window
    from .torch_kv_cache import attention_with_kv_cache  # (it imports this module)
    if module.training:
        raise ValueError(f"[{op}] cache: cached calls run in evaluation mode only (this module is in training "
                         "mode); call eval() first")
    B, n, E = q.shape
    H, d = cache.key.shape[2], cache.key.shape[3]
    if H * d != E or module.num_heads != H:
        raise ValueError(f"[{op}] cache: {H} heads of width {d}; the module has {module.num_heads} heads of "
                         f"{E} features: make the cache with this module's tensor_kv_cache()")
    if cache.key.shape[0] != B:
        raise ValueError(f"[{op}] cache: batch size {cache.key.shape[0]}; the call has {B} batch rows")
    if window is not None:  # the cached call is causal: a window's right side cannot pass the query
        left, right = window
        window = (left, 0 if right < 0 else min(right, 0))
    q, k, v = (x.reshape(B, n, H, d) for x in (q, k, v))
    if not tracing(q):  # threads sharing the cache append in turn (_torch_cache.tensor_cache_lock)
        with tensor_cache_lock(cache):
            return _append_and_attend(attention_with_kv_cache, q, k, v, cache, window, masks)
    return _append_and_attend(attention_with_kv_cache, q, k, v, cache, window, masks)


def _append_and_attend(attention_with_kv_cache, q, k, v, cache, window, masks):
    """q, k, v (B, n, H, d) -> (B, n, H*d): the cached call and the lengths' advance, one step."""
    B, n, H, d = q.shape
    out = attention_with_kv_cache(q, cache.key, cache.value, k, v, cache_seqlens=cache.lengths, causal=True,
                                  window=window, softcap=masks.softcap, sinks=masks.sinks,
                                  alibi_slopes=masks.alibi_slopes)
    cache.lengths.add_(n)
    return out.reshape(B, n, H * d)


def drop_in_cached(module, query, key, value, cache, masks, head_mask, precision):
    """mha.torch.MultiheadAttention's cached call over a TensorKVCache: nn.MultiheadAttention's
    projections, mha's cached operator, out_proj -> attn_output (the weights are None, as every
    cached call's)."""
    op = "mha.torch.MultiheadAttention"
    _check_common(op, module, head_mask, precision)
    key_padding_mask, attn_mask = masks.given
    for name, given in (("key_padding_mask", key_padding_mask is not None), ("attn_mask", attn_mask is not None),
                        ("a module with pruned heads", module._kept() is not None),
                        ("bias_k / add_zero_attn", module.bias_k is not None or module.add_zero_attn)):
        if given:
            raise NotImplementedError(f"[{op}] {name} in a cached call over an mha.torch.TensorKVCache; use "
                                      "an mha.KVCache (kv_cache()) for it, eagerly")
    batched, q, k, v = _drop_in_projections(module, query, key, value)
    return _drop_in_output(module, _cached_attention(op, module, q, k, v, cache, masks), batched, query.dtype)


def chapter_cached(module, queries, keys, values, valid_lens, cache, masks, head_mask, precision):
    """The d2l chapter's module's cached call over a TensorKVCache: W_q, W_k, W_v, mha's cached
    operator, W_o."""
    op = "mha.torch.MultiHeadAttention"
    _check_common(op, module, head_mask, precision)
    if valid_lens is not None or module.kept_heads != list(range(module.original_num_heads)):
        name = "valid_lens" if valid_lens is not None else "a module with pruned heads"
        raise NotImplementedError(f"[{op}] {name} in a cached call over an mha.torch.TensorKVCache; use an "
                                  "mha.KVCache (kv_cache()) for it, eagerly")
    y = _cached_attention(op, module, module.W_q(queries.float()), module.W_k(keys.float()),
                          module.W_v(values.float()), cache, masks)
    return module.W_o(y).to(queries.dtype)
