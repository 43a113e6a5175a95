"""Head gates, head_mask and head importance on mha.torch's modules (the d2l
chapter's exercise 2 on torch models), against torch computations: a gated
head's output equals the reference with that head's columns of W_o scaled by
its gate (W_o is linear in the heads' concatenation), and the gates' gradients
equal torch.autograd's through that reference. Float32: rtol 1e-4, atol 1e-5."""
import pytest
import torch
from torch import nn

import mha.torch as mt
import seed_reference as seed
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)


def gated_reference(m, gates):
    """nn.MultiheadAttention whose out_proj columns of head h are scaled by gates[h] (differentiably)."""
    ref = nn.MultiheadAttention(m.embed_dim, m.num_heads, batch_first=m.batch_first)
    ref.load_state_dict(m.state_dict())
    d = m.embed_dim // m.num_heads
    scale = gates.repeat_interleave(d)
    w = ref.out_proj.weight.detach()

    def run(x):
        q, k, v = x, x, x
        out, _ = nn.functional.multi_head_attention_forward(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), m.embed_dim, m.num_heads,
            ref.in_proj_weight, ref.in_proj_bias, None, None, False, 0.0, w * scale, ref.out_proj.bias,
            training=False, need_weights=False)
        return out.transpose(0, 1)
    return run


def test_gates_and_head_mask_scale_heads_and_get_gradients():
    torch.manual_seed(0)
    m = mt.MultiheadAttention(12, 3, batch_first=True)
    x = torch.randn(2, 5, 12)
    gates = torch.tensor([0.5, 0.0, 2.0], requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 0.25])
    m.head_gates = gates
    out, _ = m(x, x, x, need_weights=False, head_mask=mask)
    ref_gates = torch.tensor([0.5, 0.0, 2.0], requires_grad=True)
    want = gated_reference(m, ref_gates * mask)(x)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    g = torch.randn(out.shape)
    (out * g).sum().backward()
    (want * g).sum().backward()
    torch.testing.assert_close(gates.grad, ref_gates.grad, rtol=1e-4, atol=1e-5)
    m.head_gates = None
    plain, _ = m(x, x, x)
    torch.testing.assert_close(plain, gated_reference(m, torch.ones(3))(x), rtol=1e-4, atol=1e-5)


def test_chapter_module_gates_match_a_scaled_w_o():
    torch.manual_seed(1)
    m = mt.MultiHeadAttention(12, 3, 0.0)
    x = torch.randn(2, 4, 12)
    m(x, x, x, None)
    ref = seed.MultiHeadAttention(12, 3, 0.0)
    ref(x, x, x, None)
    ref.load_state_dict(m.state_dict())
    gates = torch.tensor([1.0, 0.0, 3.0])
    m.head_gates = gates
    with torch.no_grad():
        ref.W_o.weight.mul_(gates.repeat_interleave(4))
    torch.testing.assert_close(m(x, x, x, None), ref(x, x, x, None), rtol=1e-4, atol=1e-5)


def test_importance_by_gradient_and_ablation():
    torch.manual_seed(2)
    m = mt.MultiheadAttention(8, 4, batch_first=True)
    x, y = torch.randn(3, 6, 8), torch.randn(3, 6, 8)

    def loss():
        return (m(x, x, x, need_weights=False)[0] - y).square().mean()

    grad = mt.head_importance(m, loss)
    abl = mt.head_importance(m, loss, method="ablation")
    assert m.head_gates is None and grad.shape == abl.shape == (4,)
    # ablation by hand: the loss with one head's gate at 0
    for h in range(4):
        gates = torch.ones(4)
        gates[h] = 0
        m.head_gates = gates
        with torch.no_grad():
            dropped = loss()
        m.head_gates = None
        with torch.no_grad():
            assert abs(float(dropped - loss()) - float(abl[h])) < 1e-6
    # gradient importance by finite differences of the gates
    eps = 1e-2
    for h in range(4):
        up, down = torch.ones(4), torch.ones(4)
        up[h] += eps
        down[h] -= eps
        with torch.no_grad():
            m.head_gates = up
            lu = float(loss())
            m.head_gates = down
            ld = float(loss())
        m.head_gates = None
        assert abs(abs(lu - ld) / (2 * eps) - float(grad[h])) < 1e-3


def test_cached_calls_use_the_gates_too():
    torch.manual_seed(3)
    m = mt.MultiheadAttention(8, 2, batch_first=True).eval()
    m.head_gates = torch.tensor([1.0, 0.0])
    x = torch.randn(1, 3, 8)
    cache = m.kv_cache(1, 4)
    with torch.no_grad():
        cached, _ = m(x, x, x, cache=cache)
        plain, _ = m(x, x, x, is_causal=True, attn_mask=None, need_weights=False)
    torch.testing.assert_close(cached, plain, rtol=1e-5, atol=1e-6)


def test_bad_gates_are_refused():
    m = mt.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match=r"head_gates: shape \(3,\)"):
        m.head_gates = torch.ones(3)
    x = torch.ones(3, 2, 8)
    with pytest.raises(ValueError, match=r"head_mask: shape \(2, 2\) has 4 values; wanted one per head \(2\)"):
        m(x, x, x, head_mask=torch.ones(2, 2))


def test_chapter_module_prune_heads_matches_the_c_plus_plus_module():
    """Pruned heads: the torch module computes what mha's own pruned module computes on the same
    weights (which holds its pruning to the d2l chapter's module in tests/python/test_prune.py)."""
    import mha
    import numpy as np
    torch.manual_seed(4)
    m = mt.MultiHeadAttention(12, 4, 0.0, bias=True)
    x = torch.randn(2, 5, 12)
    m(x, x, x, None)
    ref = mha.MultiHeadAttention(12, 4, 0.0, bias=True)
    ref.load_state_dict({k: v.detach().numpy() for k, v in m.state_dict().items()})
    m.prune_heads([1])
    m.prune_heads(torch.tensor([3]))
    ref.prune_heads([1, 3])
    assert m.num_heads == 2 and m.kept_heads == [0, 2]
    assert m.W_q.weight.shape == (6, 12) and m.W_o.weight.shape == (12, 6)
    ref.eval()
    want = ref(x.numpy(), x.numpy(), x.numpy())
    got = m(x, x, x, None)
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    got.sum().backward()  # the smaller Parameters train
    assert m.W_q.weight.grad.shape == (6, 12)
    m.eval()
    cache = m.kv_cache(2, 8)
    with torch.no_grad():
        cached = m(x, x, x, None, cache=cache)
    np.testing.assert_allclose(cached.numpy(), ref(x.numpy(), x.numpy(), x.numpy(), cache=ref.kv_cache(2, 8)),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"prune_heads\] heads: .*already pruned"):
        m.prune_heads([1])


def test_a_lazy_chapter_module_is_built_narrower():
    torch.manual_seed(5)
    m = mt.MultiHeadAttention(8, 2, 0.0)
    m.prune_heads([0])
    x = torch.randn(1, 3, 5)
    out = m(x, x, x, None)
    assert out.shape == (1, 3, 8) and m.W_q.weight.shape == (4, 5) and m.W_o.weight.shape == (8, 4)


@pytest.mark.parametrize("bias_kv", [False, True])
def test_drop_in_prune_heads(bias_kv):
    """The pruned drop-in: what mha's own pruned drop-in computes, and what nn.MultiheadAttention
    computes from its state dict (the removed heads' rows and columns are zero); gradients are zero
    there; cached calls and per-head masks follow the kept heads."""
    import mha
    import numpy as np
    torch.manual_seed(6)
    m = mt.MultiheadAttention(12, 4, batch_first=True, add_bias_kv=bias_kv)
    ref = mha.TorchMultiheadAttention.from_state_dict({k: v.detach().numpy() for k, v in m.state_dict().items()},
                                                     4, batch_first=True)
    m.prune_heads([2])
    m.prune_heads([0])
    ref.prune_heads([0, 2])
    assert m.kept_heads == [1, 3] and m.num_heads == 4
    x = torch.randn(2, 5, 12, requires_grad=True)
    am = torch.randn(2 * 4, 5, 5 + bias_kv)[:, :, :5]  # per head as built
    out, w = m(x, x, x, attn_mask=am, average_attn_weights=False)
    ref.train()
    want, want_w = ref(x.detach().numpy(), x.detach().numpy(), x.detach().numpy(), attn_mask=am.numpy(),
                       average_attn_weights=False)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.detach().numpy(), want_w, rtol=1e-5, atol=1e-6)
    peer = nn.MultiheadAttention(12, 4, batch_first=True, add_bias_kv=bias_kv)
    peer.load_state_dict(m.state_dict())
    peer_out, _ = peer(x, x, x, attn_mask=am, need_weights=False)
    torch.testing.assert_close(out, peer_out, rtol=1e-4, atol=1e-5)
    out.square().sum().backward()
    removed = torch.tensor([c for h in (0, 2) for c in range(h * 3, h * 3 + 3)])
    assert torch.count_nonzero(m.in_proj_weight.grad[:12][removed]) == 0
    assert torch.count_nonzero(m.out_proj.weight.grad[:, removed]) == 0
    assert torch.count_nonzero(m.out_proj.weight.grad) > 0
    if not bias_kv:  # (a module with bias_k cannot decode with a cache)
        m.eval()
        with torch.no_grad():
            cached, _ = m(x, x, x, cache=m.kv_cache(2, 8))
            plain, _ = m(x, x, x, is_causal=True, need_weights=False)
        torch.testing.assert_close(cached, plain, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"prune_heads\] heads: .*already pruned"):
        m.prune_heads([2])
