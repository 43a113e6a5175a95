"""Parity with the seed's PyTorch code (Debian's PyTorch 1.13).

Every case draws a shape, widths, heads, bias and a valid_lens description,
builds the seed's module, loads its exact weights into ours, and compares the
output and the attention weights. Tolerance: |ours - torch| <= 1e-5 * |torch|
+ 1e-6 (the float32 rounding of two different summation orders).
"""
import numpy as np
import pytest
import torch

import mha
from seed_reference import make_seed_module, state_dict_numpy

RTOL, ATOL = 1e-5, 1e-6
# Lengths 1..70 with 1, primes and values one off a power of two.
LENGTHS = [1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 37, 61, 63, 64, 65, 67, 70]


def random_case(rng):
    B = int(rng.integers(1, 5))
    Q = int(rng.choice(LENGTHS))
    K = int(rng.choice(LENGTHS))
    H = int(rng.integers(1, 9))
    d = int(rng.choice([1, 2, 3, 5, 7, 8, 13, 16]))  # odd head dims among them
    widths = [int(rng.integers(1, 40)) for _ in range(3)]
    bias = bool(rng.integers(0, 2))
    kind = rng.choice(["none", "batch", "query", "batch_int"])
    if kind == "none":
        lens = None
    elif kind == "batch_int":
        lens = rng.integers(0, K + 4, size=B)  # int64: 0 and > K included
    elif kind == "batch":
        lens = rng.uniform(0, K + 3, size=B).astype(np.float32)
        lens[rng.random(B) < 0.25] = 0.0
    else:
        lens = rng.uniform(0, K + 3, size=(B, Q)).astype(np.float32)
        lens[rng.random((B, Q)) < 0.15] = 0.0
        integral = rng.random((B, Q)) < 0.3
        lens[integral] = np.floor(lens[integral])
    return B, Q, K, H, d, widths, bias, lens


def compare(rng, kernel=None):
    B, Q, K, H, d, (dq, dk, dv), bias, lens = random_case(rng)
    D = H * d
    seed_mod = make_seed_module(D, H, dq, dk, dv, bias, seed=int(rng.integers(1 << 30)))
    seed_mod.eval()
    ours = mha.MultiHeadAttention(D, H, dropout=0.0, bias=bias)
    ours.load_state_dict(state_dict_numpy(seed_mod))
    ours.eval()
    if kernel is not None:
        ours.kernel = kernel
    q = rng.standard_normal((B, Q, dq)).astype(np.float32)
    k = rng.standard_normal((B, K, dk)).astype(np.float32)
    v = rng.standard_normal((B, K, dv)).astype(np.float32)
    with torch.no_grad():
        t_lens = None if lens is None else torch.from_numpy(np.asarray(lens))
        expected = seed_mod(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), t_lens).numpy()
        expected_w = seed_mod.attention.attention_weights.reshape(B, H, Q, K).numpy()
    got = ours(q, k, v, lens)
    desc = f"B{B} Q{Q} K{K} H{H} d{d} widths {dq},{dk},{dv} bias {bias} lens {None if lens is None else np.asarray(lens).shape}"
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=desc)
    np.testing.assert_allclose(ours.attention_weights, expected_w, rtol=RTOL, atol=ATOL, err_msg=desc)
    return lens


def test_parity_with_seed_on_random_cases():
    rng = np.random.default_rng(2024)
    kinds = {"none": 0, "1d": 0, "2d": 0}
    for _ in range(240):
        lens = compare(rng)
        kinds["none" if lens is None else f"{np.asarray(lens).ndim}d"] += 1
    assert min(kinds.values()) >= 30, kinds  # every valid_lens kind well covered


@pytest.mark.parametrize("kernel", [mha.Kernel.REFERENCE, mha.Kernel.BLAS])
def test_every_kernel_matches_the_seed(kernel):
    rng = np.random.default_rng(7)
    for _ in range(40):
        compare(rng, kernel)


def test_seed_check_shape_and_weights():
    attention = mha.MultiHeadAttention(100, 5, 0.5)
    X = np.ones((2, 4, 100), np.float32)
    Y = np.ones((2, 6, 100), np.float32)
    out = attention(X, Y, Y, np.array([3, 2]))
    assert out.shape == (2, 4, 100)
    w = attention.attention_weights
    assert w.shape == (2, 5, 4, 6)
    np.testing.assert_allclose(w[0, :, :, :3], 1 / 3, rtol=1e-6)
    np.testing.assert_array_equal(w[0, :, :, 3:], 0.0)
    np.testing.assert_allclose(w[1, :, :, :2], 1 / 2, rtol=1e-6)


def test_masked_softmax_matches_seed():
    from seed_reference import masked_softmax
    rng = np.random.default_rng(3)
    for lens in [None, np.array([0.0, 2.5, 9.0]), rng.uniform(0, 8, (3, 5)).astype(np.float32)]:
        X = rng.standard_normal((3, 5, 6)).astype(np.float32)
        expected = masked_softmax(torch.from_numpy(X.copy()), None if lens is None else torch.from_numpy(lens)).numpy()
        np.testing.assert_allclose(mha.masked_softmax(X, lens), expected, rtol=RTOL, atol=ATOL)


def test_dot_product_attention_matches_seed_with_value_width():
    from seed_reference import DotProductAttention
    rng = np.random.default_rng(4)
    q = rng.standard_normal((3, 4, 5)).astype(np.float32)
    k = rng.standard_normal((3, 7, 5)).astype(np.float32)
    v = rng.standard_normal((3, 7, 9)).astype(np.float32)
    lens = np.array([0, 3, 10])
    peer = DotProductAttention(0.0).eval()
    expected = peer(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(lens)).detach().numpy()
    ours = mha.DotProductAttention(0.0).eval()
    np.testing.assert_allclose(ours(q, k, v, lens), expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ours.attention_weights, peer.attention_weights.numpy(), rtol=RTOL, atol=ATOL)
