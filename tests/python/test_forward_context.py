"""Explicit forward contexts (mha.ForwardContext): a call's backward and its
attention weights come from its context, in any order, on both modules; the
module keeps nothing of such a call. Each result is held bitwise to the
stateful API run right after the same call (same kernels, same order of sums)."""
import numpy as np
import pytest

import mha


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("kernel", [mha.Kernel.FUSED, mha.Kernel.BLAS])
def test_backward_of_each_context_in_any_order_is_the_stateful_backward(kernel):
    rng = np.random.default_rng(0)
    X1, X2 = rand(rng, 2, 5, 12), rand(rng, 3, 4, 12)
    lens2 = np.array([1, 4, 2], np.float32)
    G1, G2 = rand(rng, 2, 5, 12), rand(rng, 3, 4, 12)

    def module():
        m = mha.MultiHeadAttention(12, 3, dropout=0.2, bias=True, seed=5)
        m.kernel = kernel
        m.head_gates = np.array([1.0, 0.5, -2.0], np.float32)
        return m

    # Stateful: each backward right after its forward.
    s = module()
    s(X1, X1, X1)
    (a1, _, _), _ = s.backward(G1)
    w1 = s.attention_weights
    s(X2, X2, X2, lens2)
    (a2, _, _), _ = s.backward(G2)
    want_params = s.grads()
    want_gate_grad = s.head_gate_grad.copy()

    # Contexts: both forwards first, then the backwards in reverse order.
    m = module()
    out1, c1 = m.forward_with_context(X1, X1, X1)
    out2, c2 = m.forward_with_context(X2, X2, X2, lens2)
    (b2, _, _), _ = m.backward(c2, G2)
    (b1, _, _), got = m.backward(c1, G1)
    np.testing.assert_array_equal(b1, a1)
    np.testing.assert_array_equal(b2, a2)
    for name, g in want_params.items():
        np.testing.assert_allclose(got[name], g, rtol=1e-6, atol=1e-7)  # sums in another order
    np.testing.assert_allclose(m.head_gate_grad, want_gate_grad, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(c1.attention_weights(), w1)
    assert c1.differentiable and c1.batch_size == 2 and c1.num_heads == 3
    assert (c2.num_queries, c2.num_keys) == (4, 4)
    # The same dropout draws as the stateful calls, in call order.
    assert c1.dropout_mask.shape == (2, 3, 5, 5) and (c1.dropout_mask == 0).any()
    # The module kept nothing of either call.
    with pytest.raises(ValueError, match="no forward call yet"):
        m.attention_weights


def test_weights_of_some_rows_and_heads_come_from_the_context():
    rng = np.random.default_rng(1)
    m = mha.MultiHeadAttention(16, 4).eval()
    X = rand(rng, 3, 6, 16)
    lens = np.array([[1, 2, 3, 4, 5, 6], [6, 6, 6, 6, 6, 6], [0, 1, 0, 2, 0, 3]], np.float32)
    _, ctx = m.forward_with_context(X, X, X, lens)
    m(X, X, X, lens)  # the same call, stateful
    np.testing.assert_array_equal(ctx.attention_weights([2, 0], [3, 1]), m.attention_weights_of([2, 0], [3, 1]))
    np.testing.assert_array_equal(ctx.attention_weights(None, [2]), m.attention_weights[:, [2]])
    assert not ctx.differentiable
    with pytest.raises(ValueError, match=r"ForwardContext.attention_weights\] batch_rows: entry 1 is 3; the call had rows 0..2"):
        ctx.attention_weights([0, 3], [0])
    with pytest.raises(ValueError, match=r"context: the call ran in evaluation mode"):
        m.backward(ctx, np.ones((3, 6, 16), np.float32))


def test_a_context_differentiates_only_with_its_module_as_it_was():
    rng = np.random.default_rng(2)
    X = rand(rng, 2, 3, 8)
    m, other = mha.MultiHeadAttention(8, 2), mha.MultiHeadAttention(8, 2)
    _, ctx = m.forward_with_context(X, X, X)
    other(X, X, X)
    with pytest.raises(ValueError, match=r"context: comes from another module's call"):
        other.backward(ctx, np.ones((2, 3, 8), np.float32))
    with pytest.raises(ValueError, match=r"grad_output: shape \(2, 3, 7\) is not the output's \(2, 3, 8\)"):
        m.backward(ctx, np.ones((2, 3, 7), np.float32))
    m.prune_heads([0])
    with pytest.raises(ValueError, match=r"context: the call ran with 2 heads; the module has 1 since prune_heads"):
        m.backward(ctx, np.ones((2, 3, 8), np.float32))


@pytest.mark.parametrize("kernel", [mha.Kernel.FUSED, mha.Kernel.BLAS])
def test_drop_in_contexts(kernel):
    rng = np.random.default_rng(3)
    E, h = 12, 3
    state = {"in_proj_weight": rand(rng, 3 * E, E) * 0.3, "in_proj_bias": rand(rng, 3 * E),
             "out_proj.weight": rand(rng, E, E) * 0.3, "out_proj.bias": rand(rng, E),
             "bias_k": rand(rng, 1, 1, E), "bias_v": rand(rng, 1, 1, E)}
    q1, k1 = rand(rng, 4, 2, E), rand(rng, 6, 2, E)  # sequence-first, PyTorch's default
    q2 = rand(rng, 3, 1, E)
    kpm = np.zeros((2, 6), bool)
    kpm[1, 4:] = True
    G1, G2 = rand(rng, 4, 2, E), rand(rng, 3, 1, E)

    def module():
        m = mha.TorchMultiheadAttention.from_state_dict(state, h, batch_first=False)
        m.kernel = kernel
        return m

    s = module()
    want1, want_w1 = s(q1, k1, k1, key_padding_mask=kpm, average_attn_weights=False)
    (a1, b1, c1), _ = s.backward(G1)
    s(q2, q2, q2, is_causal=True)
    (a2, _, _), want = s.backward(G2)

    m = module()
    out1, w1, ctx1 = m.forward_with_context(q1, k1, k1, key_padding_mask=kpm, average_attn_weights=False)
    out2, _, ctx2 = m.forward_with_context(q2, q2, q2, is_causal=True)
    np.testing.assert_array_equal(out1, want1)
    np.testing.assert_array_equal(ctx1.attention_weights(), w1)
    assert ctx1.num_keys == 7  # bias_k appended
    (g2, _, _), _ = m.backward(ctx2, G2)
    (g1, gk1, gv1), got = m.backward(ctx1, G1)
    for x, y in ((g1, a1), (gk1, b1), (gv1, c1), (g2, a2)):
        np.testing.assert_array_equal(x, y)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
