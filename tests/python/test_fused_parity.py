"""The default (fused) path of mha.MultiHeadAttention against the seed's
PyTorch code, and against mha's own reference kernel.

Tolerance (float32): |mha - seed| <= 1e-5 |seed| + 1e-6 per element, for
outputs and attention weights. Both sides run their products on OpenBLAS but
in different orders (mha stacks W_q, W_k, W_v into one product for
self-attention, and accumulates attention in key tiles), so they agree to
float32 rounding, not bitwise.
"""
import numpy as np
import pytest
import torch

import mha
from seed_reference import make_seed_module, state_dict_numpy

RTOL, ATOL = 1e-5, 1e-6


def close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want) - (ATOL + RTOL * np.abs(want))
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert (err <= 0).all(), (f"{what}: {got[worst]} vs seed {want[worst]} at {worst} "
                              f"(tolerance {ATOL + RTOL * abs(want[worst]):.3g})")


def random_lengths(rng, shape, K):
    """Every kind of length: 0 (uniform over all keys), fractional, exact, >= K."""
    kinds = rng.integers(0, 5, size=shape)
    lens = np.where(kinds == 0, 0.0, rng.integers(1, K + 1, size=shape).astype(np.float64))
    lens = np.where(kinds == 1, lens - 0.5, lens)
    lens = np.where(kinds == 2, K + 3.0, lens)
    return lens.astype(np.float32)


def run_both(rng, B, Q, K, D, H, dq, dk, dv, lens_kind, bias, self_attention=False, kv_same=False):
    seed = make_seed_module(D, H, dq, dk, dv, bias, seed=int(rng.integers(1 << 30))).eval()
    ours = mha.MultiHeadAttention(D, H, 0.0, bias)
    ours.load_state_dict(state_dict_numpy(seed))
    X = rng.standard_normal((B, Q, dq)).astype(np.float32)
    if self_attention:
        Kx = Vx = X
    else:
        Kx = rng.standard_normal((B, K, dk)).astype(np.float32)
        Vx = Kx if kv_same else rng.standard_normal((B, K, dv)).astype(np.float32)
    lens = None
    if lens_kind == "batch":
        lens = random_lengths(rng, (B,), K)
    elif lens_kind == "query":
        lens = random_lengths(rng, (B, Q), K)
    with torch.no_grad():
        want = seed(torch.from_numpy(X), torch.from_numpy(Kx), torch.from_numpy(Vx),
                    None if lens is None else torch.from_numpy(lens)).numpy()
        want_w = seed.attention.attention_weights.reshape(B, H, Q, -1).numpy()
    got = ours(X, Kx, Vx, lens)
    return ours, got, want, want_w, (X, Kx, Vx, lens)


def awkward_cases():
    rng = np.random.default_rng(2024)
    lengths = [1, 2, 7, 47, 48, 49, 63, 64, 65, 97, 130]
    cases = []
    for i in range(36):
        H = int(rng.choice([1, 2, 3, 4]))
        d = int(rng.choice([1, 5, 16, 20, 33]))
        mode = ["self", "cross", "kv"][i % 3]
        Q = int(rng.choice(lengths))
        K = Q if mode == "self" else int(rng.choice(lengths))
        dq = H * d if mode == "self" else int(rng.integers(1, 40))
        cases.append(dict(B=int(rng.integers(1, 4)), Q=Q, K=K, D=H * d, H=H, dq=dq,
                          dk=dq if mode == "self" else int(rng.integers(1, 40)),
                          dv=0, lens_kind=["none", "batch", "query"][(i // 3) % 3],
                          bias=bool(i % 2), mode=mode))
    for c in cases:
        c["dv"] = c["dk"] if c["mode"] != "cross" else int(rng.integers(1, 40))
    return cases


@pytest.mark.parametrize("case", awkward_cases(), ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_fused_module_matches_the_seed(case):
    rng = np.random.default_rng(hash(tuple(case.values())) % (1 << 32))
    c = dict(case)
    mode = c.pop("mode")
    ours, got, want, want_w, _ = run_both(rng, **c, self_attention=mode == "self",
                                          kv_same=mode == "kv")
    assert ours.kernel == mha.Kernel.FUSED, "the fused kernel is the default"
    close(got, want, "output")
    close(ours.attention_weights, want_w, "attention_weights")


def test_weights_of_a_subset_equal_the_seeds():
    rng = np.random.default_rng(5)
    ours, _, _, want_w, _ = run_both(rng, 3, 70, 90, 24, 4, 24, 24, 24, "query", False)
    got = ours.attention_weights_of([2, 0], [3, 1])
    close(got, want_w[[2, 0]][:, [3, 1]], "weights of rows [2, 0], heads [3, 1]")
    # All rows and heads by default, the same as the property.
    np.testing.assert_array_equal(ours.attention_weights_of(), ours.attention_weights)


def test_weights_subset_rejects_bad_indices():
    rng = np.random.default_rng(6)
    ours, *_ = run_both(rng, 2, 5, 6, 8, 2, 8, 8, 8, "batch", False)
    with pytest.raises(ValueError, match=r"attention_weights.*batch_rows.*2"):
        ours.attention_weights_of([2], None)
    with pytest.raises(ValueError, match=r"attention_weights.*heads.*-1"):
        ours.attention_weights_of(None, [-1])


def test_fused_and_reference_kernels_agree_with_padding_skipped():
    # Padded positions hold large values: the seed gives them weight 0, and
    # the fused path does not even project them.
    rng = np.random.default_rng(8)
    B, L, D, H = 3, 97, 32, 4
    X = rng.standard_normal((B, L, D)).astype(np.float32)
    lens = np.array([40, 97, 3], np.float32)
    for b in range(B):
        X[b, int(lens[b]):] = 1e3
    outs = {}
    for kernel in (mha.Kernel.REFERENCE, mha.Kernel.FUSED):
        m = mha.MultiHeadAttention(D, H, 0.0, False, seed=3).eval()
        m.kernel = kernel
        outs[kernel] = (m(X, X, X, lens), m.attention_weights)
    close(outs[mha.Kernel.FUSED][0], outs[mha.Kernel.REFERENCE][0], "output")
    close(outs[mha.Kernel.FUSED][1], outs[mha.Kernel.REFERENCE][1], "weights")


def test_bitwise_the_same_at_one_and_two_threads():
    rng = np.random.default_rng(9)
    X = rng.standard_normal((2, 150, 64)).astype(np.float32)
    lens = rng.integers(0, 151, size=(2, 150)).astype(np.float32)
    saved = mha.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            mha.set_num_threads(n)
            m = mha.MultiHeadAttention(64, 4, 0.3, False, seed=1)  # training: dropout on
            results.append((m(X, X, X, lens), m.attention_weights))
    finally:
        mha.set_num_threads(saved)
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
