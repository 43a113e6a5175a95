"""NaN and infinity in queries, keys, values or weights: mha gives what the
seed's PyTorch code gives, element for element (NaN where it has NaN, the same
infinities, the same finite numbers elsewhere), with every kernel, never a
crash or a hang. docs/errors.md states the rule; this is its check.

Why the patterns can match exactly: whether a sum or product is NaN or
infinite does not depend on the order of the operations (NaN anywhere -> NaN;
+inf and -inf -> NaN), so kernels that add in different orders still agree
on which elements are non-finite, as long as they do the same operations: a
masked score is replaced (so NaN there vanishes), a masked key's value still
enters the weighted sum with weight 0 (so NaN there spreads: 0 * NaN = NaN).
"""
import numpy as np
import pytest
import torch

import mha
from seed_reference import make_seed_module, state_dict_numpy

KERNELS = list(mha.Kernel.__members__.values())
B, Q, K, DQ, DK, DV, D, H = 2, 3, 5, 6, 4, 3, 8, 2


def run_both(kernel, q, k, v, lens, poison_weight=None, bias=False):
    seed = make_seed_module(D, H, DQ, DK, DV, bias=bias)
    state = state_dict_numpy(seed)
    if poison_weight is not None:
        name, index, value = poison_weight
        state[name][index] = value
        with torch.no_grad():
            dict(seed.named_parameters())[name][index] = value
    seed.eval()
    with torch.no_grad():
        want = seed(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                    None if lens is None else torch.from_numpy(lens)).numpy()
        want_w = seed.attention.attention_weights.reshape(B, H, Q, K).numpy()
    m = mha.MultiHeadAttention(D, H, 0.0, bias=bias)
    m.load_state_dict(state)
    m.eval()
    m.kernel = kernel
    got = m(q, k, v, lens)
    return got, want, m.attention_weights, want_w


def assert_same_pattern(got, want):
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions differ")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg="+inf positions differ")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg="-inf positions differ")
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-6)


def inputs(seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Q, DQ)).astype(np.float32),
            rng.standard_normal((B, K, DK)).astype(np.float32),
            rng.standard_normal((B, K, DV)).astype(np.float32))


# (where, index, value): one poisoned element per case.
CASES = [
    ("queries", (0, 1, 2), np.nan),
    ("queries", (1, 0, 0), np.inf),
    ("queries", (0, 2, 5), -np.inf),
    ("keys", (0, 1, 3), np.nan),        # key 1 of row 0: visible with lens [3, 2]
    ("keys", (0, 4, 0), np.nan),        # key 4 of row 0: masked, its NaN score is replaced
    ("keys", (1, 0, 1), np.inf),
    ("keys", (1, 3, 2), -np.inf),
    ("values", (0, 0, 1), np.nan),
    ("values", (0, 4, 2), np.nan),      # masked key: weight 0, but 0 * NaN = NaN, as in PyTorch
    ("values", (1, 1, 0), np.inf),
    ("values", (1, 4, 0), -np.inf),     # masked key: 0 * -inf = NaN
]


@pytest.mark.parametrize("kernel", KERNELS, ids=str)
@pytest.mark.parametrize("lens", [None, np.array([3, 2], np.float32),
                                  np.array([[1, 5, 0], [2.5, 3, 4]], np.float32)],
                         ids=["no-mask", "per-batch", "per-query"])
@pytest.mark.parametrize("where,index,value", CASES)
def test_nonfinite_inputs_match_the_seed(kernel, lens, where, index, value):
    q, k, v = inputs(1)
    {"queries": q, "keys": k, "values": v}[where][index] = value
    got, want, got_w, want_w = run_both(kernel, q, k, v, lens)
    assert_same_pattern(got, want)
    assert_same_pattern(got_w, want_w)


@pytest.mark.parametrize("kernel", KERNELS, ids=str)
@pytest.mark.parametrize("name,index,value", [
    ("W_q.weight", (3, 1), np.nan), ("W_k.weight", (0, 0), np.inf), ("W_v.weight", (5, 2), -np.inf),
    ("W_o.weight", (2, 7), np.nan), ("W_q.bias", (4,), np.inf), ("W_v.bias", (1,), np.nan),
])
def test_nonfinite_weights_match_the_seed(kernel, name, index, value):
    q, k, v = inputs(2)
    got, want, got_w, want_w = run_both(kernel, q, k, v, np.array([4, 1], np.float32),
                                        poison_weight=(name, index, value), bias=True)
    assert_same_pattern(got, want)
    assert_same_pattern(got_w, want_w)


@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_everything_nonfinite_still_returns(kernel):
    """All NaN, all +inf: a result (all NaN, as PyTorch), not a crash or a hang."""
    for fill in (np.nan, np.inf, -np.inf):
        q, k, v = (np.full(x.shape, fill, np.float32) for x in inputs(3))
        got, want, got_w, want_w = run_both(kernel, q, k, v, np.array([0, 5], np.float32))
        assert_same_pattern(got, want)
        assert_same_pattern(got_w, want_w)


def test_infinite_valid_lens_mask_nothing_and_nan_lens_are_refused():
    """+inf lengths mask nothing, as in PyTorch. A NaN length, which PyTorch
    would silently treat as 'mask every key', is refused (docs/errors.md)."""
    q, k, v = inputs(4)
    got, want, _, _ = run_both(mha.Kernel.BLAS, q, k, v, np.array([np.inf, 2], np.float32))
    assert_same_pattern(got, want)
    m = mha.MultiHeadAttention(D, H, 0.0)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.forward\] valid_lens: entry 0 is NaN"):
        m(q, k, v, np.array([np.nan, 2], np.float32))
