"""Masks inside cached calls, against the d2l chapter's decoder loop.

The chapter's module (mha.MultiHeadAttention) takes valid_lens in a cached
call, (B,) or (B, n) for the n new queries, over each row's key axis (its
cached positions, then the new ones). The peer is the chapter's own PyTorch
MultiHeadAttention (tests/python/seed_reference.py) re-projecting each row's
whole state at every call, with the chapter's per-query lengths
min(length, causal limit): query i of n new ones in a row of K keys sees key
j iff j < length and j <= K - n + i. The peer runs one batch row at a time,
on that row's own state, so a row whose every key is masked gets uniform
weights over its own keys (the chapter's -1e6 fill), as mha's cache gives.

The drop-in (mha.TorchMultiheadAttention, grouped heads) takes
nn.MultiheadAttention's key_padding_mask instead, over the same key axis:
(B, S) with S the longest row's key count after the call. Its peer is
torch.nn.MultiheadAttention with the grouped key/value heads repeated, the
row's mask columns and a causal attn_mask; where PyTorch 1.13 gives NaN (a
query with no key left) mha's attention gives zeros, its documented policy,
so the output is out_proj's bias.

Random shapes, ragged rows (a padded prefill, each row rewound to its own
length), steps of 1 to 5 new positions. Error measure: max |mha - ref| /
max |ref| over a call's output; within 1e-5.
"""
import numpy as np
import pytest
import torch

import mha
from seed_reference import make_seed_module, state_dict_numpy


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def random_lengths(rng, shape, key_counts):
    """Lengths around each row's key count: 0, fractional, inside, past the end."""
    out = np.empty(shape, np.float32)
    for idx in np.ndindex(*shape):
        K = key_counts[idx[0]]
        out[idx] = rng.choice([0.0, 0.5, 1.0, K - 1.5, K / 2, K, K + 3, rng.integers(1, K + 1)])
    return np.maximum(out, 0.0).astype(np.float32)


@pytest.mark.parametrize("config", range(4))
def test_valid_lens_in_cached_calls_is_the_chapters_loop(config):
    rng = np.random.default_rng(10 + config)
    B = int(rng.integers(1, 5))
    H = int(rng.choice([1, 2, 4]))
    D = H * int(rng.choice([3, 8, 16]))
    P = int(rng.integers(2, 9))
    dtype = "float32"
    seed_mod = make_seed_module(D, H, D, D, D, bias=bool(config % 2), seed=config).double().eval()
    m = mha.MultiHeadAttention(D, H, bias=bool(config % 2))
    m.load_state_dict(state_dict_numpy(seed_mod))
    m.eval()
    steps = 20
    cache = m.kv_cache(B, P + 5 * steps, dtype=dtype)

    def reference(x_new, states, lens):
        """The chapter's module over each row's whole state, one row at a time."""
        n = x_new.shape[1]
        out = np.empty((B, n, D))
        with torch.no_grad():
            for b in range(B):
                K = len(states[b])
                causal = np.arange(K - n + 1, K + 1, dtype=np.float64)
                row_lens = np.full(n, np.inf) if lens is None else np.broadcast_to(
                    lens[b] if lens.ndim == 2 else lens[b:b + 1], (n,))
                vl = torch.from_numpy(np.minimum(row_lens, causal)[None, :]).double()
                S = torch.from_numpy(states[b][None]).double()
                out[b] = seed_mod(torch.from_numpy(x_new[b:b + 1]).double(), S, S, vl).numpy()[0]
        return out

    # Prefill with lengths, then rewind each row to its own prompt length.
    prompt = rng.standard_normal((B, P, D)).astype(np.float32)
    lens = random_lengths(rng, (B, P), [P] * B)
    got = m(prompt, prompt, prompt, lens, cache=cache)
    errs = [rel_err(got, reference(prompt, list(prompt), lens))]
    prompt_lens = [int(rng.integers(1, P + 1)) for _ in range(B)]
    for b, n in enumerate(prompt_lens):
        cache.truncate(b, n)
    states = [prompt[b, :n] for b, n in enumerate(prompt_lens)]
    for step in range(steps):
        n = int(rng.choice([1, 1, 1, 2, 3, 5]))
        x = rng.standard_normal((B, n, D)).astype(np.float32)
        states = [np.concatenate([s, x[b]]) for b, s in enumerate(states)]
        counts = [len(s) for s in states]
        form = step % 3  # (B,), (B, n), none
        lens = random_lengths(rng, (B,) if form == 0 else (B, n), counts) if form < 2 else None
        got = m(x, x, x, lens, cache=cache)
        assert got.shape == (B, n, D)
        errs.append(rel_err(got, reference(x, states, lens)))
    assert cache.lengths == [len(s) for s in states]
    assert max(errs) <= 1e-5, max(errs)


def test_valid_lens_bfloat16_cache_within_its_rounding():
    """The same masks on a bfloat16 cache: within its rounding of the float32 one."""
    rng = np.random.default_rng(3)
    m = mha.MultiHeadAttention(32, 4, seed=1)
    m.eval()
    c32, c16 = m.kv_cache(2, 40), m.kv_cache(2, 40, dtype="bfloat16")
    for n in (7, 1, 3, 1, 1):
        x = rng.standard_normal((2, n, 32)).astype(np.float32)
        lens = random_lengths(rng, (2, n), [c + n for c in c32.lengths])
        a, b = m(x, x, x, lens, cache=c32), m(x, x, x, lens, cache=c16)
        assert 0 < rel_err(b, a) <= 2e-2


def test_valid_lens_refusals():
    m = mha.MultiHeadAttention(8, 2, seed=0)
    m.eval()
    c = m.kv_cache(2, 8)
    x = np.ones((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"valid_lens"):
        m(x, x, x, np.array([1.0, 2.0, 3.0]), cache=c)  # three rows, the call has two
    with pytest.raises(ValueError, match=r"valid_lens"):
        m(x, x, x, np.array([[1.0, 2.0], [1.0, 2.0]]), cache=c)  # two queries, the call has three
    with pytest.raises(ValueError, match=r"valid_lens"):
        m(x, x, x, np.array([1.0, -1.0]), cache=c)
    assert c.lengths == [0, 0]  # a refused call leaves the cache as it was


def grouped_drop_in(rng, E, H, Hkv, batch_first, policy=None):
    d, Ekv = E // H, Hkv * E // H
    w = {"in_proj_weight": rng.standard_normal((E + 2 * Ekv, E)).astype(np.float32) * 0.5,
         "in_proj_bias": rng.standard_normal(E + 2 * Ekv).astype(np.float32) * 0.1,
         "out_proj.weight": rng.standard_normal((E, E)).astype(np.float32) * 0.5,
         "out_proj.bias": rng.standard_normal(E).astype(np.float32) * 0.1}
    m = mha.TorchMultiheadAttention.from_state_dict(w, num_heads=H, num_kv_heads=Hkv, batch_first=batch_first)
    m.eval()
    heads = [h // (H // Hkv) for h in range(H)]

    def expand(rows):
        return np.concatenate([rows[g * d:(g + 1) * d] for g in heads])

    Wq, Wk, Wv = np.split(w["in_proj_weight"], [E, E + Ekv])
    bq, bk, bv = np.split(w["in_proj_bias"], [E, E + Ekv])
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True).double().eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.from_numpy(np.concatenate([Wq, expand(Wk), expand(Wv)])))
        ref.in_proj_bias.copy_(torch.from_numpy(np.concatenate([bq, expand(bk), expand(bv)])))
        ref.out_proj.weight.copy_(torch.from_numpy(w["out_proj.weight"]))
        ref.out_proj.bias.copy_(torch.from_numpy(w["out_proj.bias"]))
    return m, ref


@pytest.mark.parametrize("batch_first", [True, False])
def test_drop_in_key_padding_mask_is_nn_multihead_attention(batch_first):
    rng = np.random.default_rng(20 + batch_first)
    E, H, Hkv, B = 24, 6, 2, 3
    m, ref = grouped_drop_in(rng, E, H, Hkv, batch_first)

    def layout(x):  # (B, n, E) -> the module's layout, and back
        return x if batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))

    cache = m.kv_cache(B, 120)
    prompt = rng.standard_normal((B, 6, E)).astype(np.float32)
    starts = [6, 2, 4]
    states = [prompt[b, :0] for b in range(B)]
    errs, fully_masked = [], 0
    with torch.no_grad():
        for step in range(24):
            if step == 0:
                x = prompt
            else:
                x = rng.standard_normal((B, int(rng.choice([1, 1, 2, 4])), E)).astype(np.float32)
            n = x.shape[1]
            states = [np.concatenate([s, x[b]]) for b, s in enumerate(states)]
            S = max(len(s) for s in states)
            pad = rng.random((B, S)) < 0.3  # True = padding, PyTorch's convention
            if n > 1:  # row 1 keeps only its last key: the queries before it have none left
                pad[1] = True
                pad[1, len(states[1]) - 1] = False
            got = m(layout(x), layout(x), layout(x), pad if step % 4 else None, cache=cache)
            got = layout(got)
            for b in range(B):
                K = len(states[b])
                causal = torch.from_numpy(np.arange(K)[None, :] > np.arange(K - n, K)[:, None])  # True = masked
                t_S = torch.from_numpy(states[b][None]).double()
                kpm = torch.from_numpy(pad[b:b + 1, :K]) if step % 4 else None
                want = ref(torch.from_numpy(x[b:b + 1]).double(), t_S, t_S, key_padding_mask=kpm,
                           attn_mask=causal, need_weights=False)[0].numpy()[0]
                # No key left: PyTorch gives NaN there (1.13, and 2.x's fast path) or zeros (2.x through
                # its SDPA): read from the masks, not from PyTorch's output.
                masked = causal.numpy() | (pad[b:b + 1, :K] if step % 4 else np.zeros((1, K), bool))
                none_left = masked.all(axis=1)
                fully_masked += int(none_left.sum())
                # mha: attention output 0 (FullyMaskedRows.ZEROS), so the output is out_proj's bias.
                out_bias = ref.out_proj.bias.detach().numpy().astype(np.float32)
                np.testing.assert_array_equal(got[b][none_left], np.broadcast_to(out_bias, got[b][none_left].shape))
                if (~none_left).any():
                    errs.append(rel_err(got[b][~none_left], want[~none_left]))
            if step == 0:
                for b, k in enumerate(starts):
                    cache.truncate(b, k)
                states = [prompt[b, :k] for b, k in enumerate(starts)]
    assert fully_masked > 0  # the policy was exercised
    assert max(errs) <= 1e-5, max(errs)


def test_drop_in_additive_mask_and_uniform_policy_are_the_plain_call():
    """Additive key_padding_mask (PyTorch 1.13 cannot combine one with a
    causal mask) and the uniform policy: a cached call equals the drop-in's
    plain call over the row's whole state with the same mask and
    Causal.BOTTOM_RIGHT (the plain call is held to PyTorch in
    tests/python/test_torch_mha.py)."""
    rng = np.random.default_rng(5)
    E, H, Hkv, B = 16, 4, 2, 2
    m, _ = grouped_drop_in(rng, E, H, Hkv, True)
    m.fully_masked_rows = mha.FullyMaskedRows.UNIFORM
    cache = m.kv_cache(B, 64)
    states = [np.zeros((0, E), np.float32) for _ in range(B)]
    errs = []
    for n in (5, 1, 3, 1, 2, 1):
        x = rng.standard_normal((B, n, E)).astype(np.float32)
        states = [np.concatenate([s, x[b]]) for b, s in enumerate(states)]
        S = len(states[0])
        bias = rng.standard_normal((B, S)).astype(np.float32)
        bias[rng.random((B, S)) < 0.4] = -np.inf
        got = m(x, x, x, bias, cache=cache)
        for b in range(B):
            want, _ = m(x[b:b + 1], states[b][None], states[b][None], key_padding_mask=bias[b:b + 1],
                        need_weights=False, is_causal=mha.Causal.BOTTOM_RIGHT)
            errs.append(rel_err(got[b], want[0]))
    assert max(errs) <= 1e-5, max(errs)


def test_drop_in_mask_refusals():
    rng = np.random.default_rng(6)
    m, _ = grouped_drop_in(rng, 8, 2, 1, True)
    c = m.kv_cache(2, 8)
    x = np.ones((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"key_padding_mask: shape \(2, 4\) is not \(2, 3\)"):
        m(x, x, x, np.zeros((2, 4), bool), cache=c)
    with pytest.raises(TypeError, match="key_padding_mask"):
        m(x, x, x, np.zeros((2, 3), np.int32), cache=c)
    assert c.lengths == [0, 0]


def test_cached_calls_refuse_masks_that_are_not_numbers():
    """The cached overloads read valid_lens and key_padding_mask with the
    plain calls' converters (walked by tests/python/test_bad_types.py)."""
    m = mha.MultiHeadAttention(8, 2, seed=0).eval()
    c = m.kv_cache(2, 8)
    x = np.ones((2, 1, 8), np.float32)
    for bad in ("1", [object(), 1], {"a": 1}):
        with pytest.raises((TypeError, ValueError)):
            m(x, x, x, bad, cache=c)
    rng = np.random.default_rng(7)
    t, _ = grouped_drop_in(rng, 8, 2, 1, True)
    tc = t.kv_cache(2, 8)
    for bad in ("1", [object(), 1]):
        with pytest.raises((TypeError, ValueError)):
            t(x, x, x, bad, cache=tc)
    assert c.lengths == [0, 0] and tc.lengths == [0, 0]


def test_long_prefill_is_the_chapters_loop():
    """A block of more new positions than kernels::decode_forward gives the
    decode kernel (it then runs the fused kernel on the cache), over ragged
    cached rows, with (B, n) lengths: the chapter's module over each row's
    whole state, as above; and a decode step after it."""
    rng = np.random.default_rng(30)
    B, D, H, n = 3, 32, 4, 130
    seed_mod = make_seed_module(D, H, D, D, D, bias=True, seed=4).double().eval()
    m = mha.MultiHeadAttention(D, H, bias=True)
    m.load_state_dict(state_dict_numpy(seed_mod))
    m.eval()
    for dtype, tol in (("float32", 1e-5), ("bfloat16", 2e-2)):
        cache = m.kv_cache(B, 4 + n + 1, dtype=dtype)
        first = rng.standard_normal((B, 4, D)).astype(np.float32)
        m(first, first, first, cache=cache)
        for b, k in enumerate([4, 1, 0]):
            cache.truncate(b, k)
        states = [first[b, :k] for b, k in enumerate([4, 1, 0])]
        errs = []
        for block in (n, 1):
            x = rng.standard_normal((B, block, D)).astype(np.float32)
            states = [np.concatenate([s, x[b]]) for b, s in enumerate(states)]
            lens = random_lengths(rng, (B, block), [len(s) for s in states])
            lens[:, -1] = np.inf  # some queries unmasked but for causality
            got = m(x, x, x, lens, cache=cache)
            with torch.no_grad():
                for b in range(B):
                    K = len(states[b])
                    vl = np.minimum(lens[b].astype(np.float64), np.arange(K - block + 1, K + 1))
                    S = torch.from_numpy(states[b][None]).double()
                    want = seed_mod(torch.from_numpy(x[b:b + 1]).double(), S, S,
                                    torch.from_numpy(vl[None])).numpy()[0]
                    errs.append(rel_err(got[b], want))
        assert max(errs) <= tol, (dtype, max(errs))
