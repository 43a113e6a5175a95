"""mha.torch.MultiheadAttention against torch.nn.MultiheadAttention (PyTorch 1.13).

Each case draws the constructor's options (layout, bias, add_bias_kv,
add_zero_attn, kdim/vdim, heads), boolean or float masks with at least one
kept key per row (PyTorch gives NaN for a fully masked row, mha does not),
and compares outputs, weights and every gradient (query, key, value, each
parameter by PyTorch's name) by the project's gradient bound
    max|ours - peer| <= 1e-5 scale + 4 max|f32 - exact|
peer: nn.MultiheadAttention in float32, exact: the same module in float64
(scale: max|peer|, a bias gradient: the larger of its own and its weight's).
Dropout: PyTorch's mask cannot be matched, so dropout is checked against the
float64 reference of test_torch_mha_backward fed our mask.
"""
import numpy as np
import pytest
import torch
from torch import nn

import mha.torch as mt
from torch_mha_reference import reference_mha
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

SCALE_TOL = 1e-5
FLOOR_FACTOR = 4.0


def weights_of(name):
    return {"in_proj_bias": ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"),
            "out_proj.bias": ("out_proj.weight",)}.get(name, ())


def assert_within_bound(ours, f32, f64, what):
    assert sorted(ours) == sorted(f32), what
    for name in f32:
        got = np.asarray(ours[name], np.float64)
        want = np.asarray(f32[name], np.float64)
        exact = np.asarray(f64[name], np.float64)
        assert got.shape == want.shape, f"{what}: {name} shape {got.shape} vs {want.shape}"
        scale = float(np.abs(want).max(initial=0.0))
        for w in weights_of(name):
            if w in f32:
                scale = max(scale, float(np.abs(f32[w]).max(initial=0.0)))
        floor = float(np.abs(want - exact).max(initial=0.0))
        err = float(np.abs(got - want).max(initial=0.0))
        bound = SCALE_TOL * scale + FLOOR_FACTOR * floor
        assert err <= bound, f"{what}: {name}: error {err:.3g} > bound {bound:.3g} (scale {scale:.3g})"


def draw(rng):
    H = int(rng.integers(1, 5))
    E = H * int(rng.integers(1, 7))
    c = dict(E=E, H=H, bias=bool(rng.integers(0, 2)), add_bias_kv=bool(rng.integers(0, 2)),
             add_zero_attn=bool(rng.integers(0, 2)), batch_first=bool(rng.integers(0, 2)),
             kdim=None, vdim=None, B=int(rng.integers(1, 4)), L=int(rng.choice([1, 2, 5, 7])),
             S=int(rng.choice([1, 3, 6, 8])), unbatched=bool(rng.integers(0, 5) == 0))
    if rng.integers(0, 2):
        c["kdim"], c["vdim"] = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    # The combinations PyTorch 1.13 accepts (it refuses a float key padding mask beside
    # another mask, and reads a float one beside a boolean one differently).
    combos = [("none", "none"), ("bool", "none"), ("float", "none"), ("none", "bool"),
              ("none", "float"), ("none", "bool3"), ("bool", "bool"), ("bool", "bool3")]
    c["kpm"], c["am"] = combos[int(rng.integers(0, len(combos)))]
    c["need_weights"] = bool(rng.integers(0, 2))
    c["average"] = bool(rng.integers(0, 2))
    return c


def make_inputs(rng, c):
    B, L, S = c["B"], c["L"], c["S"]
    kd, vd = c["kdim"] or c["E"], c["vdim"] or c["E"]

    def shaped(T, W):
        x = rng.standard_normal((B, T, W)).astype(np.float32)
        if c["unbatched"]:
            return x[0]
        return x if c["batch_first"] else x.transpose(1, 0, 2).copy()

    q, k, v = shaped(L, c["E"]), shaped(S, kd), shaped(S, vd)
    # Masks keep key 0 for every row, so that no row is fully masked.
    kpm = am = None
    nb = 1 if c["unbatched"] else B
    if c["kpm"] != "none":
        m = rng.random((nb, S)) < 0.4
        m[:, 0] = False
        kpm = torch.from_numpy(m if c["kpm"] == "bool" else np.where(m, -1e4, rng.standard_normal(m.shape)).astype(np.float32))
        if c["unbatched"]:
            kpm = kpm[0]
    if c["am"] != "none":
        shape = (L, S) if c["am"] != "bool3" else ((c["H"], L, S) if c["unbatched"] else (B * c["H"], L, S))
        m = rng.random(shape) < 0.4
        m[..., 0] = False
        am = torch.from_numpy(m if c["am"] != "float" else np.where(m, -1e4, rng.standard_normal(shape)).astype(np.float32))
    g = rng.standard_normal(q.shape[:-1] + (c["E"],)).astype(np.float32)
    return q, k, v, kpm, am, g


def module_pair(c, seed_value):
    kw = dict(dropout=0.0, bias=c["bias"], add_bias_kv=c["add_bias_kv"], add_zero_attn=c["add_zero_attn"],
              kdim=c["kdim"], vdim=c["vdim"], batch_first=c["batch_first"])
    torch.manual_seed(seed_value)
    theirs = nn.MultiheadAttention(c["E"], c["H"], **kw)
    torch.manual_seed(seed_value)
    ours = mt.MultiheadAttention(c["E"], c["H"], **kw)
    return ours, theirs


def grads_of(module, q, k, v, kpm, am, g, c, dtype):
    x = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in (q, k, v)]
    kpm_ = kpm.to(dtype) if kpm is not None and kpm.is_floating_point() else kpm
    am_ = am.to(dtype) if am is not None and am.is_floating_point() else am
    out, w = module(*x, key_padding_mask=kpm_, need_weights=c["need_weights"], attn_mask=am_,
                    average_attn_weights=c["average"])
    out.backward(torch.from_numpy(g).to(dtype))
    d = {"query": x[0].grad.numpy(), "key": x[1].grad.numpy(), "value": x[2].grad.numpy()}
    d.update({n: p.grad.numpy() for n, p in module.named_parameters()})
    return out.detach().numpy(), (None if w is None else w.detach().numpy()), d


@pytest.mark.parametrize("index", range(60))
def test_matches_nn_multihead_attention(index):
    rng = np.random.default_rng(9100 + index)
    c = draw(rng)
    ours, theirs = module_pair(c, index)
    for (n, p), (n2, p2) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert n == n2 and torch.equal(p, p2), n  # same names, same initialisation
    assert list(ours.state_dict()) == list(theirs.state_dict())
    q, k, v, kpm, am, g = make_inputs(rng, c)
    out, w, grads = grads_of(ours, q, k, v, kpm, am, g, c, torch.float32)
    t_out, t_w, f32 = grads_of(theirs, q, k, v, kpm, am, g, c, torch.float32)
    t64 = theirs.double()
    e_out, e_w, f64 = grads_of(t64, q, k, v, kpm, am, g, c, torch.float64)
    what = f"case {index} {c}"
    assert_within_bound({"out": out}, {"out": t_out}, {"out": e_out}, what)
    assert (w is None) == (t_w is None), what
    if w is not None:
        assert_within_bound({"w": w}, {"w": t_w}, {"w": e_w}, what)
    assert_within_bound(grads, f32, f64, what)


def test_dropout_gradients_use_the_forwards_mask():
    rng = np.random.default_rng(3)
    torch.manual_seed(0)
    ours = mt.MultiheadAttention(12, 3, dropout=0.3, bias=True, batch_first=True)
    q = torch.tensor(rng.standard_normal((2, 5, 12)), dtype=torch.float32, requires_grad=True)
    kv = torch.tensor(rng.standard_normal((2, 7, 12)), dtype=torch.float32, requires_grad=True)
    g = torch.tensor(rng.standard_normal((2, 5, 12)), dtype=torch.float32)
    out, _ = ours(q, kv, kv, need_weights=False)
    mask = torch.from_numpy(ours._last_context.dropout_mask)
    assert set(np.unique(mask.numpy())) <= {0.0, 1 / 0.7, np.float32(1 / 0.7)}
    out.backward(g)
    ours_g = {"q": q.grad.numpy(), "kv": kv.grad.numpy()}
    ours_g.update({n: p.grad.numpy() for n, p in ours.named_parameters()})

    def peer(dtype):
        state = {n: p.detach().to(dtype).requires_grad_() for n, p in ours.named_parameters()}
        x = q.detach().to(dtype).requires_grad_()
        y = kv.detach().to(dtype).requires_grad_()
        o, _ = reference_mha(state, 3, x, y, y, dropout_mask=mask.to(dtype))
        o.backward(g.to(dtype))
        d = {"q": x.grad.numpy(), "kv": y.grad.numpy()}
        d.update({n: p.grad.numpy() for n, p in state.items()})
        return d

    assert_within_bound(ours_g, peer(torch.float32), peer(torch.float64), "dropout")


def test_replaces_self_attn_of_a_transformer_encoder_layer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    ours_layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    ours_layer.self_attn = mt.MultiheadAttention(16, 4, dropout=0.0, batch_first=True)
    ours_layer.load_state_dict(layer.state_dict())  # torch's state dict loads into it
    x = torch.randn(3, 9, 16)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 6:] = True
    a = layer(x, src_key_padding_mask=pad)
    b = ours_layer(x, src_key_padding_mask=pad)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.square().sum().backward()
    b.square().sum().backward()
    for (n, p), (_, p2) in zip(layer.named_parameters(), ours_layer.named_parameters()):
        torch.testing.assert_close(p2.grad, p.grad, rtol=1e-4, atol=1e-5, msg=n)
    # ... and back: its state dict loads into torch's module.
    back = nn.MultiheadAttention(16, 4, batch_first=True)
    back.load_state_dict(ours_layer.self_attn.state_dict())
    for n, p in back.state_dict().items():
        assert torch.equal(p, ours_layer.self_attn.state_dict()[n]), n


def test_optimiser_steps_track_torch():
    torch.manual_seed(4)
    ours, theirs = module_pair(dict(E=8, H=2, bias=True, add_bias_kv=False, add_zero_attn=False,
                                    kdim=None, vdim=None, batch_first=False), 4)
    oo = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ot = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(5, 2, 8)
    ptr_out, ptr_in = ours.out_proj.weight.data_ptr(), ours.in_proj_weight.data_ptr()
    for _ in range(4):
        for m, o in ((ours, oo), (theirs, ot)):
            o.zero_grad()
            m(x, x, x)[0].square().mean().backward()
            o.step()
    for n, p in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[n], p, rtol=1e-4, atol=1e-6)
    # Calls read the Parameters in place: none was given another storage.
    assert ours.out_proj.weight.data_ptr() == ptr_out and ours.in_proj_weight.data_ptr() == ptr_in
    with torch.no_grad():
        torch.testing.assert_close(ours(x, x, x)[0], theirs(x, x, x)[0], rtol=1e-4, atol=1e-5)


def test_errors_and_no_grad():
    m = mt.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 3, 8)
    with pytest.raises(TypeError, match="float32"):
        m(x.double(), x, x)
    with pytest.raises(ValueError, match="CPU"):
        m(x, torch.empty(2, 3, 8, device="meta"), x)
    with torch.inference_mode():
        out, w = m(x, x, x)
    assert out.grad_fn is None and w.shape == (2, 3, 3)
    out, w = m(x, x, x, need_weights=False)
    assert w is None
    with pytest.raises(TypeError, match="float32"):
        mt.MultiheadAttention(8, 2, dtype=torch.float64)


def test_non_contiguous_inputs_and_deepcopy():
    torch.manual_seed(6)
    ours, theirs = module_pair(dict(E=12, H=3, bias=True, add_bias_kv=True, add_zero_attn=False,
                                    kdim=None, vdim=None, batch_first=True), 6)
    base = torch.randn(7, 2, 12)
    xs = []
    for m in (ours, theirs):
        x = base.clone().requires_grad_()
        q = x.transpose(0, 1)  # (2, 7, 12), not contiguous
        assert not q.is_contiguous()
        out, _ = m(q, q[:, ::2], q[:, ::2])
        out.square().sum().backward()
        xs.append((out.detach(), x.grad))
    torch.testing.assert_close(xs[0][0], xs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xs[0][1], xs[1][1], rtol=1e-4, atol=1e-5)
    import copy
    c = copy.deepcopy(ours)
    x = torch.randn(2, 4, 12)
    torch.testing.assert_close(c(x, x, x)[0], ours(x, x, x)[0])
    with torch.no_grad():
        c.in_proj_weight.mul_(0.5)  # an in-place change of the packed weight reaches mha
        theirs.load_state_dict(c.state_dict())
    torch.testing.assert_close(c(x, x, x)[0], theirs(x, x, x)[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(c(x, x, x)[0], ours(x, x, x)[0])


def test_called_twice_before_backward_with_dropout():
    """Two calls, one loss: the first call's backward redoes its forward with its own mask."""
    rng = np.random.default_rng(8)
    torch.manual_seed(1)
    ours = mt.MultiheadAttention(8, 2, dropout=0.5, bias=True, batch_first=True)
    a = [torch.tensor(rng.standard_normal((2, 5, 8)), dtype=torch.float32, requires_grad=True)
         for _ in range(2)]
    kpm = torch.tensor([[False] * 5, [False, False, True, True, True]])
    o1, _ = ours(a[0], a[0], a[0], key_padding_mask=kpm, need_weights=False)
    m1 = torch.from_numpy(ours._last_context.dropout_mask.copy())
    o2, _ = ours(o1, a[1], a[1], need_weights=False)
    m2 = torch.from_numpy(ours._last_context.dropout_mask.copy())
    assert not torch.equal(m1, m2)
    (o1.sum() + o2.square().sum()).backward()
    got = {"a0": a[0].grad.numpy(), "a1": a[1].grad.numpy()}
    got.update({n: p.grad.numpy() for n, p in ours.named_parameters()})

    def peer(dtype):
        state = {n: p.detach().to(dtype).requires_grad_() for n, p in ours.named_parameters()}
        x = [y.detach().to(dtype).requires_grad_() for y in a]
        keep = (~kpm)[:, None, None, :]
        p1, _ = reference_mha(state, 2, x[0], x[0], x[0], keep=keep, dropout_mask=m1.to(dtype))
        p2, _ = reference_mha(state, 2, p1, x[1], x[1], dropout_mask=m2.to(dtype))
        (p1.sum() + p2.square().sum()).backward()
        d = {"a0": x[0].grad.numpy(), "a1": x[1].grad.numpy()}
        d.update({n: p.grad.numpy() for n, p in state.items()})
        return d

    assert_within_bound(got, peer(torch.float32), peer(torch.float64), "two calls")
