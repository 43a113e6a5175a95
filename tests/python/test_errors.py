"""Bad input gives ValueError naming the operation, argument and shapes."""
import numpy as np
import pytest

import mha


def ones(*shape):
    return np.ones(shape, np.float32)


def test_construction_errors():
    with pytest.raises(ValueError, match=r"num_hiddens: 100 is not divisible by num_heads 3"):
        mha.MultiHeadAttention(100, 3)
    with pytest.raises(ValueError, match="dropout"):
        mha.MultiHeadAttention(8, 2, dropout=-0.1)


@pytest.mark.parametrize("args, message", [
    ((ones(2, 3, 4), ones(3, 5, 6), ones(3, 5, 6), None), r"keys: batch size 3 differs from queries' 2"),
    ((ones(2, 3, 4), ones(2, 5, 6), ones(2, 4, 6), None), r"values: shape \(2, 4, 6\) has 4 positions but keys \(2, 5, 6\) have 5"),
    ((ones(2, 3, 4), ones(2, 5, 6), ones(2, 5, 6), np.array([1, 2, 3])), r"valid_lens: shape \(3,\)"),
    ((ones(2, 3, 4), ones(2, 5, 6), ones(2, 5, 6), np.ones((2, 4))), r"valid_lens: shape \(2, 4\)"),
    ((ones(2, 3, 4), ones(2, 5, 6), ones(2, 5, 6), np.ones((2, 3, 1))), r"valid_lens: shape \(2, 3, 1\) is neither"),
    ((ones(2, 3, 4), ones(2, 5, 6), ones(2, 5, 6), np.array([1, -1])), r"valid_lens: entry 1 is -1"),
    ((ones(2, 3, 4), ones(2, 5, 6), ones(2, 5, 6), np.array([np.nan, 1])), r"valid_lens: entry 0 is NaN"),
    ((ones(3, 4), ones(2, 5, 6), ones(2, 5, 6), None), r"queries: shape \(3, 4\) is not \(B, Q, Dq\)"),
])
def test_forward_errors(args, message):
    m = mha.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.forward\] " + message):
        m(*args)


def test_second_call_with_another_width():
    m = mha.MultiHeadAttention(8, 2)
    m(ones(1, 2, 4), ones(1, 3, 6), ones(1, 3, 6))
    with pytest.raises(ValueError, match=r"queries: width 5 \(shape \(1, 2, 5\)\) differs from W_q's input width 4"):
        m(ones(1, 2, 5), ones(1, 3, 6), ones(1, 3, 6))


def test_load_state_dict_errors():
    m = mha.MultiHeadAttention(4, 2)
    good = {n: ones(4, 4) for n in ("W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight")}
    m.load_state_dict(good)
    with pytest.raises(ValueError, match="missing parameter 'W_o.weight'"):
        m.load_state_dict({k: v for k, v in good.items() if k != "W_o.weight"})
    with pytest.raises(ValueError, match=r"W_k.weight: shape \(3, 4\) is not \(4, in\)"):
        m.load_state_dict({**good, "W_k.weight": ones(3, 4)})
    with pytest.raises(ValueError, match="unexpected parameter 'W_q.bias'"):
        m.load_state_dict({**good, "W_q.bias": ones(4)})
