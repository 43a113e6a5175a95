"""Head gates, gradient importance and pruning on the drop-in
(TorchMultiheadAttention), which it runs on the same engine as the d2l
chapter's module. Held to PyTorch 1.13's nn.MultiheadAttention: a gate g_h
scales head h's columns of out_proj.weight; pruning head h is zeroing them.
Tolerances: 1e-5 relative to the largest magnitude (2e-5 for gradients)."""
import numpy as np
import pytest
import torch

import mha

from torch_threads import one_torch_thread  # noqa: F401  (fixture)

KERNELS = [mha.Kernel.FUSED, mha.Kernel.BLAS, mha.Kernel.REFERENCE]


def close(got, want, rel):
    want = np.asarray(want)
    scale = max(np.abs(want).max(initial=0.0), 1e-3)
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale)


def draw(rng, bias_kv=False):
    B, L, S, h, d = rng.integers(1, 4), rng.integers(1, 6), rng.integers(1, 7), int(rng.choice([2, 3, 4])), int(rng.choice([2, 4]))
    E = h * d
    bias = bool(rng.random() < 0.5)
    batch_first = bool(rng.random() < 0.5)
    t = torch.nn.MultiheadAttention(E, h, bias=bias, add_bias_kv=bias_kv, batch_first=batch_first)
    with torch.no_grad():  # from rng, so that each case is the same every run
        for p in t.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32)) * 0.5)
    shape = (lambda n: (B, n, E)) if batch_first else (lambda n: (n, B, E))
    f32 = np.float32
    x = dict(q=rng.standard_normal(shape(L)).astype(f32), k=rng.standard_normal(shape(S)).astype(f32),
             v=rng.standard_normal(shape(S)).astype(f32))
    return t, x, dict(B=B, L=L, S=S, h=h, d=d, E=E, batch_first=batch_first)


def ours_of(t, c, kernel):
    m = mha.TorchMultiheadAttention.from_state_dict(t.state_dict(), c["h"], batch_first=c["batch_first"])
    m.kernel = kernel
    return m


def scaled_columns(t, scale, d):
    """t's out_proj.weight with head h's columns multiplied by scale[h]
    (a torch tensor, so that autograd sees the gates)."""
    W = t.out_proj.weight
    return W * scale.repeat_interleave(d)[None, :]


def torch_forward(t, x, W_o, attn_mask=None):
    """nn.MultiheadAttention's forward with out_proj.weight replaced by W_o."""
    q, k, v = (torch.from_numpy(x[n]).requires_grad_() for n in "qkv")
    out, w = torch.nn.functional.multi_head_attention_forward(
        q if not t.batch_first else q.transpose(0, 1), k if not t.batch_first else k.transpose(0, 1),
        v if not t.batch_first else v.transpose(0, 1), t.embed_dim, t.num_heads, t.in_proj_weight, t.in_proj_bias,
        t.bias_k, t.bias_v, t.add_zero_attn, 0.0, W_o, t.out_proj.bias, training=False,
        need_weights=True, attn_mask=attn_mask, average_attn_weights=False)
    if t.batch_first:
        out = out.transpose(0, 1)
    return (q, k, v), out, w


@pytest.mark.parametrize("index", range(12))
def test_gates_scale_heads_and_their_gradient_is_autograds(index, one_torch_thread):
    rng = np.random.default_rng(8200 + index)
    t, x, c = draw(rng, bias_kv=index % 3 == 0)
    gates = torch.from_numpy(rng.uniform(-1, 2, c["h"]).astype(np.float32)).requires_grad_()
    inputs, want, _ = torch_forward(t, x, scaled_columns(t, gates, c["d"]))
    G = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.from_numpy(G))
    for kernel in KERNELS:
        m = ours_of(t, c, kernel)
        m.head_gates = gates.detach().numpy()
        out, _ = m(x["q"], x["k"], x["v"])
        close(out, want.detach().numpy(), 1e-5)
        (gq, gk, gv), _ = m.backward(G)
        for got, ref in zip((gq, gk, gv), inputs):
            close(got, ref.grad.numpy(), 2e-5)
        close(m.head_gate_grad, gates.grad.numpy(), 2e-5)
        m.zero_grad()
        assert not m.head_gate_grad.any()


@pytest.mark.parametrize("index", range(12))
def test_pruned_heads_are_zero_columns_of_out_proj(index, one_torch_thread):
    rng = np.random.default_rng(8300 + index)
    t, x, c = draw(rng, bias_kv=index % 3 == 0)
    h, d, B, L, S = c["h"], c["d"], c["B"], c["L"], c["S"]
    remove = sorted(rng.choice(h, size=rng.integers(1, h), replace=False).tolist())
    keep = [i for i in range(h) if i not in remove]
    on = torch.tensor([0.0 if i in remove else 1.0 for i in range(h)])
    am = None
    if index % 2:  # one mask slice per head as built, pruned heads' slices dropped
        am = rng.random((B * h, L, S)) < 0.3
        am[..., 0] = False
    t_am = None if am is None else torch.from_numpy(am)
    inputs, want, want_w = torch_forward(t, x, scaled_columns(t, on, d).detach(), t_am)
    G = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.from_numpy(G))
    for kernel in KERNELS:
        m = ours_of(t, c, kernel)
        m.prune_heads(remove)
        assert m.num_heads == len(keep) and list(m.kept_heads) == keep and m.original_num_heads == h
        out, w = m(x["q"], x["k"], x["v"], attn_mask=am, average_attn_weights=False)
        close(out, want.detach().numpy(), 1e-5)
        close(w, want_w.detach().numpy()[:, keep], 1e-5)  # the kept heads' weights
        (gq, gk, gv), _ = m.backward(G)
        for got, ref in zip((gq, gk, gv), inputs):
            close(got, ref.grad.numpy(), 2e-5)
        # state_dict() keeps PyTorch's shapes: nn.MultiheadAttention loads it
        # and computes the pruned module's outputs.
        t2 = torch.nn.MultiheadAttention(c["E"], h, bias=t.in_proj_bias is not None,
                                         add_bias_kv=t.bias_k is not None, batch_first=c["batch_first"])
        t2.load_state_dict({k: torch.from_numpy(v) for k, v in m.state_dict().items()})
        _, again, _ = torch_forward(t2, x, t2.out_proj.weight, t_am)
        close(again.detach().numpy(), out, 1e-5)
        grads = m.grads()
        assert grads.keys() == m.state_dict().keys()
        assert grads["out_proj.weight"].shape == (c["E"], c["E"])
        for r in remove:  # the pruned heads' rows and columns stay zero
            assert not grads["out_proj.weight"][:, r * d:(r + 1) * d].any()
            assert not grads["in_proj_weight"][r * d:(r + 1) * d].any()


def test_pruning_is_refused_with_a_clear_error():
    rng = np.random.default_rng(1)
    E, h = 8, 4
    state = {"in_proj_weight": rng.standard_normal((3 * E, E)).astype(np.float32),
             "out_proj.weight": rng.standard_normal((E, E)).astype(np.float32)}
    m = mha.TorchMultiheadAttention.from_state_dict(state, h, batch_first=True)
    with pytest.raises(ValueError, match=r"TorchMultiheadAttention.prune_heads\] heads: entry 0 is 4; heads are numbered 0 .. 3"):
        m.prune_heads([4])
    with pytest.raises(ValueError, match=r"removing all 4 remaining heads"):
        m.prune_heads([0, 1, 2, 3])
    m.prune_heads([1])
    with pytest.raises(ValueError, match=r"head 1, which was already pruned"):
        m.prune_heads([1])
    with pytest.raises(ValueError, match=r"set_head_gates\] gates: shape \(4,\) is not \(3,\)"):
        m.head_gates = np.ones(4, np.float32)
    grouped = {"in_proj_weight": rng.standard_normal((E + 2 * E // 2, E)).astype(np.float32),
               "out_proj.weight": rng.standard_normal((E, E)).astype(np.float32)}
    g = mha.TorchMultiheadAttention.from_state_dict(grouped, h, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"groups its 4 query heads over 2 key/value heads"):
        g.prune_heads([0])
    x = np.ones((1, 2, E), np.float32)
    with pytest.raises(ValueError, match=r"attn_mask: shape \(3, 2, 2\) is not \(4, 2, 2\)"):
        m(x, x, x, attn_mask=np.zeros((3, 2, 2), bool))  # one slice per head as built
