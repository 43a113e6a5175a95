"""Cached decoding (mha.KVCache) against the d2l chapter's decoder loop.

The chapter's Transformer decoder predicts one position at a time: its state
holds every earlier input, each step concatenates the new one to it and runs
attention of the new query over all of them, projecting every earlier
position again. Here that loop runs on the chapter's own PyTorch
MultiHeadAttention (tests/python/seed_reference.py), in float64, with ragged
batch rows (states padded, valid_lens = each row's length), and beside it
mha's cached decoding: a padded prefill, each row rewound to its own length,
then one new position per row per step.

The drop-in (mha.TorchMultiheadAttention with num_kv_heads < num_heads) runs
the same loop against torch.nn.MultiheadAttention (key_padding_mask for the
padding), whose key and value heads are the grouped ones repeated: PyTorch
has no grouped heads, and query head h reads key/value head h // (H / Hkv).

Error measure: max |mha - reference| / max |reference| over a step's output;
float32 caches within 1e-5 at every step, bfloat16 caches within 2e-2.
"""
import numpy as np
import pytest
import torch

import mha
from seed_reference import make_seed_module, state_dict_numpy

STEPS = 66


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def padded(states):
    L = max(len(s) for s in states)
    D = states[0].shape[1]
    out = np.zeros((len(states), L, D), np.float32)
    for b, s in enumerate(states):
        out[b, :len(s)] = s
    return out, np.array([len(s) for s in states])


def textbook_loop(dtype):
    rng = np.random.default_rng(0)
    B, P, D, H = 3, 7, 32, 4
    prompt_lens = [5, 2, 7]
    seed_mod = make_seed_module(D, H, D, D, D, bias=True, seed=1).double().eval()
    m = mha.MultiHeadAttention(D, H, bias=True)
    m.load_state_dict(state_dict_numpy(seed_mod))
    m.eval()
    cache = m.kv_cache(B, P + STEPS, dtype=dtype)
    assert cache.dtype == dtype and cache.capacity == P + STEPS

    prompt = rng.standard_normal((B, P, D)).astype(np.float32)
    pre = m(prompt, prompt, prompt, cache=cache)
    assert cache.lengths == [P] * B
    for b, n in enumerate(prompt_lens):
        cache.truncate(b, n)
    assert cache.lengths == prompt_lens
    errs = []
    with torch.no_grad():
        # The prefill's real positions: the chapter's causal valid lengths (B, Q).
        causal = torch.arange(1, P + 1, dtype=torch.float64).repeat(B, 1)
        t_prompt = torch.from_numpy(prompt).double()
        pre_ref = seed_mod(t_prompt, t_prompt, t_prompt, causal).numpy()
        for b, n in enumerate(prompt_lens):
            errs.append(rel_err(pre[b, :n], pre_ref[b, :n]))
        states = [prompt[b, :n] for b, n in enumerate(prompt_lens)]
        for _ in range(STEPS):
            x = rng.standard_normal((B, 1, D)).astype(np.float32)
            states = [np.concatenate([s, x[b]]) for b, s in enumerate(states)]
            S, lens = padded(states)
            t_S = torch.from_numpy(S).double()
            ref = seed_mod(torch.from_numpy(x).double(), t_S, t_S, torch.from_numpy(lens).double()).numpy()
            got = m(x, x, x, cache=cache)
            assert got.shape == (B, 1, D)
            errs.append(rel_err(got, ref))
    assert cache.lengths == [n + STEPS for n in prompt_lens]
    return errs


def test_cached_decoding_is_the_chapters_loop_float32():
    errs = textbook_loop("float32")
    assert len(errs) >= 64 + 3
    assert max(errs) <= 1e-5, max(errs)


def test_cached_decoding_bfloat16_within_its_rounding():
    errs = textbook_loop("bfloat16")
    # Keys and values rounded to 8 mantissa bits (relative 2^-9 each).
    assert max(errs) <= 2e-2, max(errs)
    assert max(errs) > 1e-5  # the rounding is real: not a float32 cache in disguise


@pytest.mark.parametrize("batch_first", [True, False])
def test_drop_in_grouped_heads_is_nn_multihead_attention(batch_first):
    rng = np.random.default_rng(1)
    E, H, Hkv, B = 16, 4, 2, 2
    d, Ekv = E // H, Hkv * E // H
    w = {"in_proj_weight": rng.standard_normal((E + 2 * Ekv, E)).astype(np.float32) * 0.5,
         "in_proj_bias": rng.standard_normal(E + 2 * Ekv).astype(np.float32) * 0.1,
         "out_proj.weight": rng.standard_normal((E, E)).astype(np.float32) * 0.5,
         "out_proj.bias": rng.standard_normal(E).astype(np.float32) * 0.1}
    m = mha.TorchMultiheadAttention.from_state_dict(w, num_heads=H, num_kv_heads=Hkv, batch_first=batch_first)
    m.eval()
    # nn.MultiheadAttention with every key/value head repeated for its query heads.
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

    def layout(x):  # (B, n, E) -> the module's layout
        return x if batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))

    cache = m.kv_cache(B, 3 + STEPS)
    assert cache.num_kv_heads == Hkv and cache.head_dim == d
    prompt = rng.standard_normal((B, 3, E)).astype(np.float32)
    m(layout(prompt), layout(prompt), layout(prompt), cache=cache)
    starts = [3, 1]
    for b, n in enumerate(starts):
        cache.truncate(b, n)
    states = [prompt[b, :n] for b, n in enumerate(starts)]
    errs = []
    with torch.no_grad():
        for _ in range(STEPS):
            x = rng.standard_normal((B, 1, E)).astype(np.float32)
            states = [np.concatenate([s, x[b]]) for b, s in enumerate(states)]
            S, lens = padded(states)
            pad = torch.from_numpy(np.arange(S.shape[1])[None, :] >= lens[:, None])  # True = padding
            t_S = torch.from_numpy(S).double()
            expected = ref(torch.from_numpy(x).double(), t_S, t_S, key_padding_mask=pad,
                           need_weights=False)[0].numpy()
            got = m(layout(x), layout(x), layout(x), cache=cache)
            got = got if batch_first else got.transpose(1, 0, 2)
            errs.append(rel_err(got, expected))
    assert max(errs) <= 1e-5, max(errs)


def cached_module():
    m = mha.MultiHeadAttention(16, 2, bias=True, seed=3)
    m.eval()
    return m


def test_truncate_reorder_reset():
    rng = np.random.default_rng(2)
    m = cached_module()
    x0 = rng.standard_normal((3, 4, 16)).astype(np.float32)
    x1 = rng.standard_normal((3, 1, 16)).astype(np.float32)
    a, b = m.kv_cache(3, 8), m.kv_cache(3, 8)
    m(x0, x0, x0, cache=a)
    m(x0, x0, x0, cache=b)
    m(x1, x1, x1, cache=a)
    for row in range(3):
        a.truncate(row, 4)  # the step of x1 rejected
    np.testing.assert_array_equal(m(x1, x1, x1, cache=a), m(x1, x1, x1, cache=b))

    a.truncate(2, 2)
    k2, v2 = a.keys(2), a.values(2)
    assert k2.shape == (2, 2, 8)
    a.reorder([2, 0, 2])
    assert a.lengths == [2, 5, 2]
    np.testing.assert_array_equal(a.keys(0), k2)
    np.testing.assert_array_equal(a.values(2), v2)

    a.reset()
    assert a.lengths == [0, 0, 0]
    fresh = m.kv_cache(3, 8)
    np.testing.assert_array_equal(m(x0, x0, x0, cache=a), m(x0, x0, x0, cache=fresh))
    assert "lengths=[4, 4, 4]" in repr(a)


def test_refusals():
    m = cached_module()
    c = m.kv_cache(2, 4)
    x = np.ones((2, 3, 16), np.float32)
    m(x, x, x, cache=c)
    with pytest.raises(ValueError, match="do not fit row 0"):
        m(x, x, x, cache=c)
    assert c.lengths == [3, 3]
    with pytest.raises(ValueError, match="made by another MultiHeadAttention object"):
        other = cached_module()
        other(x[:, :1], x[:, :1], x[:, :1], cache=c)
    with pytest.raises(ValueError, match="evaluation mode only"):
        m.train()
        m(x[:, :1], x[:, :1], x[:, :1], cache=c)
    m.eval()
    with pytest.raises(ValueError, match="batch size 2; the call has 1"):
        m(x[:1, :1], x[:1, :1], x[:1, :1], cache=c)
    with pytest.raises(ValueError, match="wanted 'float32' or 'bfloat16'"):
        m.kv_cache(2, 4, dtype="float16")
    # A cache too large for the memory limit is refused before it is allocated.
    mha.set_memory_limit(1 << 20)
    try:
        with pytest.raises(ValueError, match="above the memory limit"):
            m.kv_cache(64, 4096)
    finally:
        mha.set_memory_limit(0)
