"""The functions' numbers at the edges (mha.torch.attention, scaled_dot_product_attention,
attention_with_kv_cache), both torch lines:
- finite inputs never give a silent NaN: scores or sink logits beyond float32 (q, k ~ 1e20, a sink of
  3e38, scale 1e38) raise, naming the inputs and their magnitudes, as the modules do; non-finite inputs
  are computed through (a NaN or inf in the inputs comes back as NaN, no error);
- scale as torch takes it in scaled_dot_product_attention: 0 (uniform weights) and negative scales,
  forward and gradients against plain torch ops in float64 (and torch 2.x's own function where it
  exists), within 1e-5 of each tensor's scale; NaN, inf and beyond float32 refused;
- a scale or softcap that float32 cannot hold (1e-50, 1e-46, 1e39, 1e300) is refused, not rounded to 0
  (softcap off) or inf;
- scaled_dot_product_attention's floating attn_mask: NaN and +inf refused, -inf takes the key out."""
import math

import pytest
import torch

import mha.torch as mt
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

TOL = 1e-5


def inputs(seed=0, B=2, L=5, S=7, H=2, d=8):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, n, H, d, generator=g) for n in (L, S, S))


def sdpa_inputs(seed=0):
    return tuple(x.transpose(1, 2).contiguous() for x in inputs(seed))


def cache_call(q, k, v, **kw):
    B, S, H, d = k.shape
    with torch.no_grad():
        return mt.attention_with_kv_cache(q[:, -1:], k.clone(), v.clone(), cache_seqlens=S, **kw)


CALLS = {
    "attention": (lambda q, k, v, **kw: mt.attention(q, k, v, **kw), inputs),
    "sdpa": (lambda q, k, v, **kw: mt.scaled_dot_product_attention(q, k, v, **kw), sdpa_inputs),
    "kv_cache": (cache_call, inputs),
}


@pytest.mark.parametrize("name", ["attention", "sdpa"])
def test_scores_beyond_float32_from_finite_inputs_raise(name):
    call, make = CALLS[name]
    q, k, v = make()
    with pytest.raises(ValueError, match=r"give scores that overflow float32 \(largest magnitudes: .*\d\.\d+e\+20"):
        call(q * 1e20, k * 1e20, v)
    if name != "sdpa":  # torch's sdpa has no sinks (the Hugging Face backend's do: below)
        with pytest.raises(ValueError, match=r"q, k, v and sinks give scores or sink logits that overflow.*3e\+38"):
            call(q, k, v, sinks=torch.tensor([3e38, 0.0]))
        with pytest.raises(ValueError, match=r"overflow float32 .*; scale 1e\+38\)"):
            call(q, k, v, scale=1e38)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_non_finite_inputs_are_computed_through(name):
    call, make = CALLS[name]
    q, k, v = make()
    for bad in (float("nan"), float("inf")):
        v2 = v.clone()
        v2.view(-1)[3] = bad
        out = call(q, k, v2)
        assert not bool(torch.isfinite(out).all()), "a non-finite value reaches the output"
        q2 = q.clone()
        q2[:, -1, 0, 0] = bad  # the last query: the cached call's
        assert not bool(torch.isfinite(call(q2, k, v)).all())


def reference_sdpa(q, k, v, scale):
    s = q.double() @ k.double().transpose(-2, -1) * scale
    return torch.softmax(s, -1) @ v.double()


@pytest.mark.parametrize("scale", [0.0, -0.5, -3.0, 1e-40, -1e-45])
def test_sdpa_takes_zero_and_negative_scales_as_torch(scale):
    q, k, v = (x.requires_grad_(True) for x in sdpa_inputs(3))
    out = mt.scaled_dot_product_attention(q, k, v, scale=scale)
    want = reference_sdpa(q, k, v, scale)
    g = torch.randn(out.shape, dtype=torch.float64)
    got_grads = torch.autograd.grad(out, (q, k, v), g.float())
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    for a, b, what in zip((out, *got_grads), (want, *want_grads), ("out", "grad q", "grad k", "grad v")):
        err = float((a.double() - b).abs().max())
        assert err <= TOL * max(1.0, float(b.abs().max())), f"scale {scale}: {what} error {err:.3g}"
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        peer = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
        assert float((out - peer).abs().max()) <= TOL * max(1.0, float(peer.abs().max()))


@pytest.mark.parametrize("scale, words", [(float("nan"), "scale: nan"), (float("inf"), "scale: inf"),
                                          (1e39, "scale: 1e+39"), (-1e39, "scale: -1e+39")])
def test_sdpa_refuses_scales_float32_cannot_hold(scale, words):
    q, k, v = sdpa_inputs()
    with pytest.raises(ValueError, match=re_escape(f"[mha.torch.scaled_dot_product_attention] {words}; wanted a "
                                                   "finite number that float32 holds")):
        mt.scaled_dot_product_attention(q, k, v, scale=scale)


def re_escape(s):
    import re
    return re.escape(s)


@pytest.mark.parametrize("name", ["attention", "kv_cache"])
@pytest.mark.parametrize("option, value, words", [
    ("scale", 1e-50, "scale: 1e-50 is 0 in float32"), ("scale", 1e39, "scale: 1e+39 overflows in float32"),
    ("softcap", 1e-46, "softcap: 1e-46 is 0 in float32"), ("softcap", 1e300, "softcap: 1e+300 overflows in float32"),
    ("softcap", 2e38, "softcap: 2e+38 overflows in float32")])
def test_options_float32_cannot_hold_are_refused(name, option, value, words):
    call, make = CALLS[name]
    with pytest.raises(ValueError, match=re_escape(words)):
        call(*make(), **{option: value})


def test_the_smallest_and_largest_float32_softcaps_still_run():
    q, k, v = inputs(5)
    for softcap in (1.2e-38, 1e38):
        out = mt.attention(q, k, v, softcap=softcap)
        assert bool(torch.isfinite(out).all())
    big = mt.attention(q, k, v, softcap=1e38)
    close = float((big - mt.attention(q, k, v)).abs().max())
    assert close <= TOL, "a huge softcap is no cap"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_sdpa_refuses_nan_and_plus_inf_in_a_float_mask(bad):
    q, k, v = sdpa_inputs()
    mask = torch.zeros(5, 7)
    mask[1, 2] = bad
    with pytest.raises(ValueError, match=r"attn_mask: holds NaN or \+inf"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    mask[1, 2] = -math.inf  # takes the key out
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keep = torch.ones(5, 7, dtype=torch.bool)
    keep[1, 2] = False
    assert float((out - mt.scaled_dot_product_attention(q, k, v, attn_mask=keep)).abs().max()) <= 1e-6


# ---- a NaN stays NaN under every mask ------------------------------------------------------------------
# A NaN query row (or key) makes every score it takes part in NaN, so the rows that see it are NaN, masks
# or not; the rows that do not see it are finite. (Before: under a causal mask or a window the kernels'
# running maxima skipped the NaN lanes and the row read as fully masked: zeros.)

def nan_at(x, *index):
    x = x.clone()
    x[index] = float("nan")
    return x


@pytest.mark.parametrize("mask", ["causal", "window", "none"])
def test_a_nan_query_row_stays_nan_under_masks(mask):
    q, k, v = inputs(7, L=6, S=6)
    opts = {"causal": dict(causal=True), "window": dict(window=(1, 0)), "none": {}}[mask]
    out = mt.attention(nan_at(q, 0, 3, 1, 2), k, v, **opts)
    assert bool(torch.isnan(out[0, 3, 1]).all()), "the NaN query's row"
    rest = torch.ones(out.shape[:3], dtype=torch.bool)
    rest[0, 3, 1] = False
    assert bool(torch.isfinite(out[rest]).all()), "every other row"


def test_a_nan_key_reaches_exactly_the_rows_that_see_it():
    q, k, v = inputs(8, L=6, S=6)
    out = mt.attention(q, nan_at(k, 1, 2, 0, 5), v, causal=True)  # key 2 of head 0: queries 2.. see it
    assert bool(torch.isnan(out[1, 2:, 0]).all()) and bool(torch.isfinite(out[1, :2, 0]).all())
    assert bool(torch.isfinite(out[0]).all()) and bool(torch.isfinite(out[:, :, 1]).all())


def test_sdpa_is_causal_and_the_drop_in_keep_a_nan_row():
    q, k, v = sdpa_inputs(9)
    out = mt.scaled_dot_product_attention(nan_at(q, 1, 0, 4, 3), k[:, :, :5], v[:, :, :5], is_causal=True)
    assert bool(torch.isnan(out[1, 0, 4]).all()) and int(torch.isnan(out).sum()) == out.shape[-1]
    m = mt.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    with torch.no_grad():
        y, _ = m(nan_at(x, 0, 2, 7), x, x, attn_mask=causal, need_weights=False)
        y2, _ = m(nan_at(x, 0, 2, 7), x, x, is_causal=True, attn_mask=causal, need_weights=False)
    for out in (y, y2):
        assert bool(torch.isnan(out[0, 2]).all()), "the NaN query's row (through W_o: every column)"
        assert bool(torch.isfinite(out[0, [0, 1, 3, 4]]).all()) and bool(torch.isfinite(out[1]).all())


@pytest.mark.parametrize("new_queries", [1, 3, 40])  # 40: a long prefill, the fused kernel on the cache
def test_the_cached_call_keeps_nan_queries_and_keys(new_queries):
    g = torch.Generator().manual_seed(4)
    B, S, H, d = 2, 64, 2, 8
    k_cache, v_cache = torch.randn(B, S, H, d, generator=g), torch.randn(B, S, H, d, generator=g)
    q = torch.randn(B, new_queries, H, d, generator=g)
    lens = torch.tensor([S, S - 10])
    with torch.no_grad():
        out = mt.attention_with_kv_cache(nan_at(q, 0, new_queries - 1, 1, 0), k_cache, v_cache,
                                         cache_seqlens=lens, causal=True, window=(3, 0))
        assert bool(torch.isnan(out[0, -1, 1]).all()) and int(torch.isnan(out).sum()) == d
        key = int(lens[1]) - 1  # the last cached key of row 1: only the last query's window holds it...
        out = mt.attention_with_kv_cache(q, nan_at(k_cache, 1, key, 0, 0), v_cache, cache_seqlens=lens,
                                         causal=True, window=(0, 0))  # ...and with window (0, 0) it is all
        assert bool(torch.isnan(out[1, -1, 0]).all()) and int(torch.isnan(out).sum()) == d
