"""mha.torch.attention_with_kv_cache (flash_attn_with_kvcache's conventions) against a composition of plain
torch ops in float64 (test_attention_function.reference, written from FlashAttention's documented rules):
row b's keys are its cache_seqlens[b] cached ones followed by the call's new ones, the band and ALiBi
aligned to the bottom right of each row, a row with no keys giving zeros. On random shapes, grouped heads,
every score option, float32 and bfloat16 caches (the reference reads the bfloat16-rounded keys, as the
cache stores them): float32 within 1e-5 of each output's scale. The caches after the call: the new keys
in their slots (rounded to the cache's dtype), every other slot untouched. Token-by-token decoding equals
the uncached causal attention over the whole sequence. Bad input: clear errors, and the caches unchanged.
Both torch lines (torch 2.x's operator, compile and export: test_torch2_library.py)."""
import numpy as np
import pytest
import torch

from mha.torch import attention, attention_with_kv_cache
from test_attention_function import reference
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

TOL = 1e-5


def close(a, b, what):
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
    assert err <= TOL * scale, f"{what}: error {err:.3g} > {TOL * scale:.3g}"


def stored(x, dtype):
    """x as a cache of `dtype` stores it, read back as float32."""
    return x.to(dtype).float()


def case(seed):
    rng = np.random.default_rng(seed)
    Hkv = int(rng.choice([1, 2, 3]))
    H = Hkv * int(rng.choice([1, 2]))
    B = int(rng.integers(1, 4))
    d = int(rng.choice([4, 8, 16, 40]))
    dv = int(rng.choice([d, 8]))
    n = int(rng.choice([0, 1, 1, 3, 7]))  # new keys of the call (0: attend over the cache as it is)
    capacity = int(rng.integers(n + 1, n + 40))
    lens = [int(rng.integers(0, capacity - n + 1)) for _ in range(B)]
    if rng.integers(0, 4) == 0:
        lens[0] = 0  # a row with no cached keys
    causal = bool(rng.integers(0, 2))
    Lq = n if (n and rng.integers(0, 3)) else int(rng.integers(1, 4))
    if causal:  # a causal call needs 0 or at least Lq keys in each row
        lens = [max(x, Lq - n) if x + n else x for x in lens]
        lens = [min(x, capacity - n) for x in lens]
        if any(0 < x + n < Lq for x in lens):
            causal = False
    side = lambda: int(rng.choice([-1, 0, 2, 5, 100]))  # noqa: E731
    opts = dict(causal=causal)
    if rng.integers(0, 2):
        opts["window"] = (side(), side())
    if rng.integers(0, 3) == 0:
        opts["alibi_slopes"] = torch.tensor(rng.uniform(0.05, 0.5, H), dtype=torch.float32)
    if rng.integers(0, 3) == 0:
        opts["softcap"] = float(rng.choice([1.0, 5.0]))
    if rng.integers(0, 3) == 0:
        opts["sinks"] = torch.tensor(rng.standard_normal(H), dtype=torch.float32)
    if rng.integers(0, 3) == 0:
        opts["scale"] = float(rng.uniform(0.1, 0.6))
    dtype = torch.bfloat16 if rng.integers(0, 3) == 0 else torch.float32
    t = lambda *s: torch.tensor(rng.standard_normal(s), dtype=torch.float32)  # noqa: E731
    history_k, history_v = t(B, capacity, Hkv, d), t(B, capacity, Hkv, dv)
    q = t(B, Lq, H, d)
    new = (t(B, n, Hkv, d), t(B, n, Hkv, dv)) if n else (None, None)
    return B, capacity, Hkv, d, dv, lens, opts, dtype, history_k, history_v, q, new


def make_caches(B, capacity, Hkv, d, dv, lens, dtype, history_k, history_v):
    """Caches of `dtype` whose row b holds history[b, :lens[b]] and a marker (7.0) in every other slot."""
    k_cache = torch.full((B, capacity, Hkv, d), 7.0, dtype=dtype)
    v_cache = torch.full((B, capacity, Hkv, dv), 7.0, dtype=dtype)
    for b, L in enumerate(lens):
        k_cache[b, :L] = history_k[b, :L].to(dtype)
        v_cache[b, :L] = history_v[b, :L].to(dtype)
    return k_cache, v_cache


@pytest.mark.parametrize("seed", range(40))
def test_matches_the_plain_ops_over_each_rows_keys(seed):
    B, capacity, Hkv, d, dv, lens, opts, dtype, hk, hv, q, (k, v) = case(seed)
    k_cache, v_cache = make_caches(B, capacity, Hkv, d, dv, lens, dtype, hk, hv)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    seqlens = torch.tensor(lens, dtype=torch.int32 if seed % 2 else torch.int64)
    with torch.no_grad():
        out = attention_with_kv_cache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, **opts)
    assert out.shape == (*q.shape[:3], dv) and out.dtype == torch.float32
    assert seqlens.tolist() == lens, "cache_seqlens is the caller's to advance"
    n = 0 if k is None else k.shape[1]
    ref_opts = {x: opts[x] for x in ("causal", "window", "softcap", "scale") if x in opts}
    for b, L in enumerate(lens):
        K = torch.cat([stored(hk[b, :L], dtype)] + ([stored(k[b], dtype)] if n else []))
        V = torch.cat([stored(hv[b, :L], dtype)] + ([stored(v[b], dtype)] if n else []))
        want = reference(q[b:b + 1], K[None], V[None], alibi=opts.get("alibi_slopes"), sinks=opts.get("sinks"),
                         **ref_opts)[0]
        close(out[b], want, f"row {b} ({L} cached, {n} new keys)")
        # The new keys sit in slots L .. L + n - 1; every other slot is as it was.
        if n:
            assert torch.equal(k_cache[b, L:L + n], k[b].to(dtype))
            assert torch.equal(v_cache[b, L:L + n], v[b].to(dtype))
        keep = torch.ones(capacity, dtype=torch.bool)
        keep[L:L + n] = False
        assert torch.equal(k_cache[b, keep], before_k[b, keep])
        assert torch.equal(v_cache[b, keep], before_v[b, keep])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_token_by_token_equals_the_uncached_causal_call(dtype):
    rng = torch.Generator().manual_seed(3)
    B, T, P, H, Hkv, d = 2, 23, 9, 4, 2, 16
    q, k, v = (torch.randn(B, T, h, d, generator=rng) for h in (H, Hkv, Hkv))
    k_cache, v_cache = torch.zeros(B, 32, Hkv, d, dtype=dtype), torch.zeros(B, 32, Hkv, d, dtype=dtype)
    seqlens = torch.zeros(B, dtype=torch.int32)
    steps = []
    with torch.no_grad():
        steps.append(attention_with_kv_cache(q[:, :P], k_cache, v_cache, k[:, :P], v[:, :P],
                                             cache_seqlens=seqlens, causal=True, window=(6, 0)))
        seqlens += P
        for t in range(P, T):
            steps.append(attention_with_kv_cache(q[:, t:t + 1], k_cache, v_cache, k[:, t:t + 1], v[:, t:t + 1],
                                                 cache_seqlens=seqlens, causal=True, window=(6, 0)))
            seqlens += 1
        whole = attention(q, stored(k, dtype), stored(v, dtype), causal=True, window=(6, 0))
    close(torch.cat(steps, 1), whole, "decoded against whole")


def test_dtypes_and_an_int_cache_seqlens():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 1, 4, 8, generator=g)
    k_cache, v_cache = torch.randn(2, 10, 4, 8, generator=g), torch.randn(2, 10, 4, 8, generator=g)
    with torch.no_grad():
        out32 = attention_with_kv_cache(q, k_cache, v_cache, cache_seqlens=6)
        out16 = attention_with_kv_cache(q.bfloat16(), k_cache, v_cache, cache_seqlens=torch.tensor([6, 6]))
    assert out16.dtype == torch.bfloat16
    close(out16.float(), attention_with_kv_cache(q.bfloat16().float(), k_cache, v_cache, cache_seqlens=6).bfloat16()
          .float(), "bfloat16 q")
    want = reference(q, k_cache[:, :6], v_cache[:, :6])
    close(out32, want, "int cache_seqlens")


def _call(**over):
    g = torch.Generator().manual_seed(7)
    args = dict(q=torch.randn(2, 1, 4, 8, generator=g), k_cache=torch.zeros(2, 6, 2, 8),
                v_cache=torch.zeros(2, 6, 2, 8), k=torch.randn(2, 1, 2, 8, generator=g),
                v=torch.randn(2, 1, 2, 8, generator=g), cache_seqlens=torch.tensor([2, 5]))
    args.update(over)
    with torch.no_grad():
        return attention_with_kv_cache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("k"),
                                       args.pop("v"), **args)


@pytest.mark.parametrize("over, error, words", [
    (dict(cache_seqlens=torch.tensor([2, 6])), ValueError, "row 1 holds 6 keys"),
    (dict(cache_seqlens=torch.tensor([-1, 0])), ValueError, "0 <= cache_seqlens[b]"),
    (dict(cache_seqlens=torch.tensor([2.0, 1.0])), TypeError, "cache_seqlens: dtype torch.float32"),
    (dict(cache_seqlens=torch.tensor([2])), ValueError, "cache_seqlens: shape (1,)"),
    (dict(cache_seqlens="2"), TypeError, "cache_seqlens"),
    (dict(k_cache=torch.zeros(2, 6, 2, 8, dtype=torch.float16)), TypeError, "k_cache: dtype torch.float16"),
    (dict(v_cache=torch.zeros(2, 6, 2, 8, dtype=torch.bfloat16)), TypeError, "v_cache: dtype torch.bfloat16"),
    (dict(k_cache=torch.zeros(2, 2, 6, 8).transpose(1, 2)), ValueError, "k_cache: not contiguous"),
    (dict(k_cache=torch.zeros(2, 6, 3, 8), v_cache=torch.zeros(2, 6, 3, 8)), ValueError, "3 heads do not divide"),
    (dict(k_cache=torch.zeros(2, 6, 2, 4)), ValueError, "k_cache, v_cache: shapes"),
    (dict(v=None), ValueError, "k given alone"),
    (dict(k=torch.zeros(2, 1, 1, 8)), ValueError, "k, v: shapes"),
    (dict(q=torch.zeros(2, 3, 4, 8), causal=True, cache_seqlens=torch.tensor([0, 1])), ValueError,
     "row 0 has 1 keys for 3 causal queries"),
    (dict(window=(1, -2)), ValueError, "window: (1, -2)"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(sinks=torch.tensor([0.0, float("nan"), 0.0, 0.0])), ValueError, "sinks"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, "alibi_slopes: shape (3,)"),
    (dict(scale=0.0), ValueError, "scale: 0"),
    (dict(q=torch.zeros(2, 1, 4, 8, dtype=torch.float64)), TypeError, "q: dtype torch.float64"),
])
def test_bad_input_is_refused_and_the_caches_stay_as_they_were(over, error, words):
    k_cache = over.get("k_cache", torch.zeros(2, 6, 2, 8))
    v_cache = over.get("v_cache", torch.zeros(2, 6, 2, 8))
    over = dict(over, k_cache=k_cache, v_cache=v_cache)
    before = (k_cache.clone(), v_cache.clone())
    with pytest.raises(error) as e:
        _call(**over)
    assert "[mha.torch.attention_with_kv_cache]" in str(e.value) and words in str(e.value), str(e.value)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_inputs_that_require_grad_are_refused_outside_no_grad():
    q = torch.randn(1, 1, 2, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="no backward"):
        attention_with_kv_cache(q, torch.zeros(1, 4, 2, 4), torch.zeros(1, 4, 2, 4), cache_seqlens=2)
