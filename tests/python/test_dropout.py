"""Dropout on the attention weights: rate, scaling, seeding, modes."""
import numpy as np

import mha


def dropped_weights(p, seed, N=16, L=64):
    """With values = identity, DotProductAttention returns dropout(weights)."""
    rng = np.random.default_rng(seed)
    att = mha.DotProductAttention(p, seed=seed)
    q = rng.standard_normal((N, L, 8)).astype(np.float32)
    k = rng.standard_normal((N, L, 8)).astype(np.float32)
    out = att(q, k, np.broadcast_to(np.eye(L, dtype=np.float32), (N, L, L)))
    return out, att.attention_weights


def test_rate_and_scaling():
    for p in (0.1, 0.5, 0.9):
        out, w = dropped_weights(p, 1)
        zero = out == 0
        n = out.size
        # Binomial: 5 sigma, a false alarm once in millions of runs.
        assert abs(zero.mean() - p) <= 5 * np.sqrt(p * (1 - p) / n), (p, zero.mean())
        np.testing.assert_allclose(out[~zero], w[~zero] / (1 - p), rtol=1e-6)


def test_extremes_and_modes():
    out, _ = dropped_weights(1.0, 2)
    assert not out.any()  # p = 1 drops everything, as nn.Dropout(1.0)
    out, w = dropped_weights(0.0, 2)
    np.testing.assert_allclose(out, w, rtol=1e-6, atol=1e-7)


def test_module_seed_repeats_and_eval_is_p0():
    rng = np.random.default_rng(5)
    q, kv = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 9, 8))
    a = mha.MultiHeadAttention(8, 2, dropout=0.5, seed=7)
    b = mha.MultiHeadAttention(8, 2, dropout=0.5, seed=7)
    assert a.training
    np.testing.assert_array_equal(a(q, kv, kv), b(q, kv, kv))
    first = a(q, kv, kv)
    assert not np.array_equal(first, a(q, kv, kv)), "each call draws a new mask"
    plain = mha.MultiHeadAttention(8, 2, dropout=0.0)
    plain.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.eval()(q, kv, kv), plain(q, kv, kv))
    assert not a.training
