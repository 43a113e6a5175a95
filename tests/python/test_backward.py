"""MultiHeadAttention.backward against PyTorch autograd run on the seed's code.

Tolerance: for every gradient (and the output), max |ours - peer| must be at
most 1e-5 of max |peer|, where the peer is the seed's module in float32 and
again in float64. A bias gradient's scale is the larger of its own and its
layer's weight gradient: W_k.bias's exact gradient is 0 (a constant added to
every key shifts each score row by a constant, which softmax ignores), so
only rounding is left in it. Measured over these cases, the largest errors
are about 2e-6 (ours and float32 PyTorch alike, against float64).
"""
import numpy as np
import pytest
import torch

import mha
from training_helpers import normalised_error, random_case, seed_gradients, seed_module_like

TOL = 1e-5
NUM_CASES = 120


def scale_of(name, grads):
    s = np.abs(grads[name]).max() if grads[name].size else 0.0
    if name.endswith(".bias"):
        s = max(s, np.abs(grads[name.replace(".bias", ".weight")]).max())
    return s


def run_ours(case, kernel, seed):
    m = mha.MultiHeadAttention(case["num_hiddens"], case["num_heads"], case["dropout"],
                               case["bias"], seed=seed)
    m.kernel = kernel
    out = m(case["queries"], case["keys"], case["values"], case["valid_lens"])
    (gq, gk, gv), params = m.backward(case["grad_output"])
    return m, out, (gq, gk, gv), params


@pytest.mark.parametrize("index", range(NUM_CASES))
def test_gradients_match_seed_autograd(index):
    rng = np.random.default_rng(1000 + index)
    case = random_case(rng)
    for kernel in (mha.Kernel.BLAS, mha.Kernel.REFERENCE):
        m, out, inputs, params = run_ours(case, kernel, seed=index)
        mask = m.last_dropout_mask if case["dropout"] > 0 else None
        for dtype in (torch.float32, torch.float64):
            t = seed_module_like(m, case, mask, dtype)
            t_inputs, t_params, t_out = seed_gradients(t, case, dtype)
            where = f"case {index}, {kernel}, {dtype}"
            assert normalised_error(out, t_out) <= TOL, where
            for name, ours, theirs in zip(("queries", "keys", "values"), inputs, t_inputs):
                assert ours.shape == theirs.shape, where
                assert normalised_error(ours, theirs) <= TOL, f"{where}: grad {name}"
            assert sorted(params) == sorted(t_params), where
            for name in t_params:
                err = np.abs(params[name] - t_params[name]).max()
                scale = scale_of(name, t_params)
                err = err / scale if scale > 0 else err  # all-zero (e.g. every length 0): exact
                assert err <= TOL, f"{where}: grad {name}: {err:.2e}"


def test_the_cases_cover_the_awkward_shapes():
    """The random cases include what the parity claims to cover."""
    seen = dict(Q1=False, K1=False, odd_head=False, zero_len=False, frac_len=False,
                long_len=False, none=False, batch=False, query=False, bias=False, nobias=False,
                dropout=False, heads8=False)
    for index in range(NUM_CASES):
        c = random_case(np.random.default_rng(1000 + index))
        B, Q, _ = c["queries"].shape
        K = c["keys"].shape[1]
        lens = c["valid_lens"]
        seen["Q1"] |= Q == 1
        seen["K1"] |= K == 1
        seen["odd_head"] |= (c["num_hiddens"] // c["num_heads"]) % 2 == 1
        seen["heads8"] |= c["num_heads"] == 8
        seen["none"] |= lens is None
        seen["batch"] |= lens is not None and lens.ndim == 1
        seen["query"] |= lens is not None and lens.ndim == 2
        if lens is not None:
            seen["zero_len"] |= bool((lens == 0).any())
            seen["frac_len"] |= bool((lens % 1 != 0).any())
            seen["long_len"] |= bool((lens > K).any())
        seen["bias"] |= c["bias"]
        seen["nobias"] |= not c["bias"]
        seen["dropout"] |= c["dropout"] > 0
    assert all(seen.values()), seen


def test_the_dropout_mask_is_the_one_used():
    """The mask is 0 or 1/(1-p), drops about p, and the output is (P*mask) V."""
    p = 0.4
    m = mha.MultiHeadAttention(12, 3, dropout=p, seed=5)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 20, 7)).astype(np.float32)
    out = m(X, X, X)
    mask = m.last_dropout_mask
    assert mask.shape == (4, 3, 20, 20)
    assert set(np.unique(mask)) <= {0.0, np.float32(1 / (1 - p))}
    assert abs((mask == 0).mean() - p) < 0.05
    case = dict(num_hiddens=12, num_heads=3, bias=False, dropout=p, queries=X, keys=X, values=X,
                valid_lens=None, grad_output=np.ones((4, 20, 12), np.float32))
    _, _, t_out = seed_gradients(seed_module_like(m, case, mask), case)
    assert normalised_error(out, t_out) <= TOL
    m.eval()
    m(X, X, X)
    assert (m.last_dropout_mask == 1).all()


def test_gradients_accumulate_until_zero_grad():
    rng = np.random.default_rng(3)
    m = mha.MultiHeadAttention(8, 2, bias=True, seed=1)
    X = rng.standard_normal((2, 5, 3)).astype(np.float32)
    G = rng.standard_normal((2, 5, 8)).astype(np.float32)
    m(X, X, X)
    _, first = m.backward(G)
    m(X, X, X)
    _, second = m.backward(G)
    for name in first:
        np.testing.assert_allclose(second[name], 2 * first[name], rtol=1e-6, atol=1e-7)
    m.zero_grad()
    assert all((g == 0).all() for g in m.grads().values())
    assert sorted(m.grads()) == sorted(m.state_dict())


@pytest.mark.parametrize("per_query", [False, True])
def test_masked_keys_get_exactly_zero_gradient(per_query):
    rng = np.random.default_rng(4)
    B, Q, K = 3, 6, 11
    for bias in (False, True):
        for dropout in (0.0, 0.5):
            m = mha.MultiHeadAttention(12, 4, dropout=dropout, bias=bias, seed=2)
            q = rng.standard_normal((B, Q, 5)).astype(np.float32)
            k = rng.standard_normal((B, K, 7)).astype(np.float32)
            v = rng.standard_normal((B, K, 9)).astype(np.float32)
            lens = np.array([4, 1, 7.5], np.float32)
            if per_query:
                # Each query a different length; the row's longest bounds its keys.
                lens = np.minimum(lens[:, None] - np.arange(Q)[None, :] % 2, K).astype(np.float32)
                lens = np.maximum(lens, 1)
            m(q, k, v, lens)
            (_, gk, gv), _ = m.backward(rng.standard_normal((B, Q, 12)).astype(np.float32))
            longest = lens if lens.ndim == 1 else lens.max(axis=1)
            for b in range(B):
                masked = np.arange(K) >= longest[b]
                assert masked.any() and not masked.all()
                assert (gk[b, masked] == 0).all(), (b, bias, dropout)
                assert (gv[b, masked] == 0).all(), (b, bias, dropout)
                assert np.abs(gv[b, ~masked]).max() > 0


def test_backward_errors_name_the_problem():
    m = mha.MultiHeadAttention(8, 2)
    X = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.backward\] no training-mode forward"):
        m.backward(np.ones((2, 3, 8), np.float32))
    m(X, X, X)
    with pytest.raises(ValueError, match=r"grad_output: shape \(2, 3, 7\) is not the output's \(2, 3, 8\)"):
        m.backward(np.ones((2, 3, 7), np.float32))
    m.eval()
    m(X, X, X)
    with pytest.raises(ValueError, match="training-mode"):
        m.backward(np.ones((2, 3, 8), np.float32))
    with pytest.raises(ValueError, match=r"set_grads\] W_q.weight: shape \(3, 3\)"):
        m.set_grads({"W_q.weight": np.ones((3, 3), np.float32)})
