"""mha.torch.MultiHeadAttention against the d2l chapter's PyTorch module.

Both modules are built after the same torch.manual_seed, so their lazy layers
draw the same weights (checked). Outputs and every gradient (queries, keys,
values, each parameter) are compared by the project's gradient bound
(tests/python/test_torch_mha_backward.py):
    max|ours - peer| <= 1e-5 scale + 4 max|f32 - exact|
peer: the chapter's module in float32 autograd; exact: the same in float64;
scale: max|peer| (a bias gradient: the larger of its own and its weight's).
Dropout: the chapter's nn.Dropout draws another mask, so the peer is fed the
mask our call used (MultiHeadAttention._last_context.dropout_mask).
"""
import copy

import numpy as np
import pytest
import torch

import mha.torch as mt
import seed_reference as seed
from training_helpers import FixedDropout, random_case
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

SCALE_TOL = 1e-5
FLOOR_FACTOR = 4.0


def scale_of(name, grads):
    s = float(np.abs(grads[name]).max(initial=0.0))
    if name.endswith(".bias"):
        s = max(s, float(np.abs(grads[name.replace(".bias", ".weight")]).max(initial=0.0)))
    return s


def assert_within_bound(ours, f32, f64, what):
    """ours, f32, f64: dicts name -> array (ours and the chapter's module in float32/float64)."""
    assert sorted(ours) == sorted(f32), what
    for name in f32:
        got = np.asarray(ours[name], np.float64)
        want = np.asarray(f32[name], np.float64)
        exact = np.asarray(f64[name], np.float64)
        assert got.shape == want.shape, f"{what}: {name} shape {got.shape} vs {want.shape}"
        scale = scale_of(name, f32) if "." in name else float(np.abs(want).max(initial=0.0))
        floor = float(np.abs(want - exact).max(initial=0.0))
        err = float(np.abs(got - want).max(initial=0.0))
        bound = SCALE_TOL * scale + FLOOR_FACTOR * floor
        assert err <= bound, f"{what}: {name}: error {err:.3g} > bound {bound:.3g} (scale {scale:.3g})"


def chapter_module(case, seed_value):
    torch.manual_seed(seed_value)
    return seed.MultiHeadAttention(case["num_hiddens"], case["num_heads"], case["dropout"],
                                   bias=case["bias"])


def ours_module(case, seed_value):
    torch.manual_seed(seed_value)
    return mt.MultiHeadAttention(case["num_hiddens"], case["num_heads"], case["dropout"],
                                 bias=case["bias"])


def run_with_grads(module, case, dtype, calls=1):
    """out, {name: grad} of inputs and parameters, after out.backward(grad_output)."""
    inputs = [torch.tensor(case[n], dtype=dtype, requires_grad=True)
              for n in ("queries", "keys", "values")]
    lens = None if case["valid_lens"] is None else torch.from_numpy(case["valid_lens"])
    out = module(*inputs, lens)
    out.backward(torch.from_numpy(case["grad_output"]).to(dtype))
    grads = {n: x.grad.detach().numpy() for n, x in zip(("queries", "keys", "values"), inputs)}
    grads.update({n: p.grad.detach().numpy() for n, p in module.named_parameters()})
    return out.detach().numpy(), grads


def peer_like(ours, case, mask, dtype):
    t = chapter_module(case, 0)
    q, k, v = (case[n] for n in ("queries", "keys", "values"))
    with torch.no_grad():
        t(torch.zeros(1, 1, q.shape[2]), torch.zeros(1, 1, k.shape[2]), torch.zeros(1, 1, v.shape[2]), None)
    t.load_state_dict({n: p.detach().clone() for n, p in ours.state_dict().items()})
    t = t.to(dtype)
    if mask is not None:
        B, h, Q, K = mask.shape
        t.attention.dropout = FixedDropout(torch.from_numpy(mask).reshape(B * h, Q, K).to(dtype))
    return t


@pytest.mark.parametrize("index", range(40))
def test_output_and_gradients_match_the_chapter(index):
    rng = np.random.default_rng(7000 + index)
    case = random_case(rng, max_len=37)
    ours = ours_module(case, index)
    out, grads = run_with_grads(ours, case, torch.float32)
    # Same torch.manual_seed, same lazy draws: the chapter's module gets the same
    # weights (with dropout, the chapter's nn.Dropout draws from torch's generator
    # between W_v's and W_o's initialisation, so only W_q, W_k, W_v match then).
    ref = chapter_module(case, index)
    with torch.no_grad():
        ref(*(torch.from_numpy(case[n]) for n in ("queries", "keys", "values")), None)
    for name, p in ref.state_dict().items():
        if case["dropout"] == 0 or not name.startswith("W_o"):
            assert torch.equal(p, ours.state_dict()[name]), name
    mask = ours._last_context.dropout_mask if case["dropout"] > 0 else None
    f32_out, f32 = run_with_grads(peer_like(ours, case, mask, torch.float32), case, torch.float32)
    f64_out, f64 = run_with_grads(peer_like(ours, case, mask, torch.float64), case, torch.float64)
    assert_within_bound({"out": out}, {"out": f32_out}, {"out": f64_out}, f"case {index}")
    assert_within_bound(grads, f32, f64, f"case {index}")


def test_state_dict_keys_lazy_layers_and_repr_are_the_chapters():
    torch.manual_seed(0)
    ours = mt.MultiHeadAttention(100, 5, 0.5)
    torch.manual_seed(0)
    ref = seed.MultiHeadAttention(100, 5, 0.5)
    assert repr(ours) == repr(ref)  # LazyLinear(in_features=0, ...) before the first call
    X, Y = torch.ones(2, 4, 100), torch.ones(2, 6, 100)
    vl = torch.tensor([3, 2])
    assert ours(X, Y, Y, vl).shape == (2, 4, 100)
    ref(X, Y, Y, vl)
    assert repr(ours) == repr(ref)
    assert list(ours.state_dict()) == ["W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"]
    assert all(isinstance(p, torch.nn.Parameter) for p in ours.parameters())
    assert ours.attention.attention_weights.shape == (10, 4, 6)
    assert ours.attention_weights.shape == (2, 5, 4, 6)
    # Uniform over the first valid_len keys (inputs of ones).
    w = ours.attention.attention_weights
    torch.testing.assert_close(w, ref.attention.attention_weights, rtol=1e-5, atol=1e-6)
    # bias=True: the chapter's names with .bias.
    m = mt.MultiHeadAttention(8, 2, 0.0, bias=True)
    m(torch.ones(1, 2, 3), torch.ones(1, 2, 5), torch.ones(1, 2, 7))
    assert sorted(m.state_dict()) == sorted(
        f"W_{x}.{y}" for x in "qkvo" for y in ("weight", "bias"))
    assert m.W_k.weight.shape == (8, 5)


def test_parameters_keep_their_storage_and_optimisers_work():
    rng = np.random.default_rng(1)
    case = random_case(rng, max_len=16)
    case["dropout"] = 0.0
    x = [torch.from_numpy(case[n]) for n in ("queries", "keys", "values")]
    lens = None if case["valid_lens"] is None else torch.from_numpy(case["valid_lens"])
    ours = ours_module(case, 3)
    ours(*x, lens)
    ref = chapter_module(case, 3)
    ref(*x, lens)  # same draws
    before = {name: p.data_ptr() for name, p in ours.named_parameters()}
    ours(*x, lens)
    for name, p in ours.named_parameters():
        assert p.data_ptr() == before[name], name  # calls read the Parameters in place
    # An optimiser built after the first call (lazy layers), as with the chapter's module.
    opt_o = torch.optim.Adam(ours.parameters(), lr=1e-2)
    opt_r = torch.optim.Adam(ref.parameters(), lr=1e-2)
    g = torch.from_numpy(case["grad_output"])
    for _ in range(3):
        for m, opt in ((ours, opt_o), (ref, opt_r)):
            opt.zero_grad()
            (m(*x, lens) * g).sum().backward()
            opt.step()
    for name, p in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], p, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours(*x, lens), ref(*x, lens), rtol=1e-4, atol=1e-5)


def test_state_dicts_load_both_ways():
    torch.manual_seed(5)
    ref = seed.MultiHeadAttention(12, 3, 0.0, bias=True)
    X, Y = torch.randn(2, 3, 4), torch.randn(2, 5, 6)
    ref(X, Y, Y, None)
    ours = mt.MultiHeadAttention(12, 3, 0.0, bias=True)
    ours.load_state_dict(ref.state_dict())  # lazy layers take their shapes from it
    torch.testing.assert_close(ours(X, Y, Y, None), ref(X, Y, Y, None), rtol=1e-5, atol=1e-6)
    # After linking, load_state_dict copies into the shared buffers.
    ref2 = seed.MultiHeadAttention(12, 3, 0.0, bias=True)
    ref2(X, Y, Y, None)
    ours.load_state_dict(ref2.state_dict())
    torch.testing.assert_close(ours(X, Y, Y, None), ref2(X, Y, Y, None), rtol=1e-5, atol=1e-6)
    ref3 = seed.MultiHeadAttention(12, 3, 0.0, bias=True)
    ref3(X, Y, Y, None)
    ref3.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(X, Y, Y, None), ref3(X, Y, Y, None), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_a_module_called_twice_before_backward(dropout):
    """A shared layer: two calls, one loss. Each call's backward runs from its own
    context (its own dropout mask)."""
    rng = np.random.default_rng(11)
    ours = mt.MultiHeadAttention(12, 3, dropout, bias=True)
    a = [torch.tensor(rng.standard_normal((2, 5, 6)), dtype=torch.float32, requires_grad=True)
         for _ in range(2)]
    lens = [torch.tensor([3, 5]), torch.tensor([[1, 2, 3, 4, 5], [0, 5, 2, 2, 1]])]
    g = [torch.tensor(rng.standard_normal((2, 5, 12)), dtype=torch.float32) for _ in range(2)]
    out1 = ours(a[0], a[0], a[0], lens[0])
    mask1 = ours._last_context.dropout_mask.copy()
    out2 = ours(out1[..., :6], a[1], a[1], lens[1])  # the second call reads the first's output
    mask2 = ours._last_context.dropout_mask.copy()
    ((out1 * g[0]).sum() + (out2 * g[1]).sum()).backward()
    ours_grads = {"a0": a[0].grad.numpy(), "a1": a[1].grad.numpy()}
    ours_grads.update({n: p.grad.numpy() for n, p in ours.named_parameters()})

    def peer(dtype):
        t = seed.MultiHeadAttention(12, 3, dropout, bias=True)
        t(torch.zeros(1, 1, 6), torch.zeros(1, 1, 6), torch.zeros(1, 1, 6), None)
        t.load_state_dict(ours.state_dict())
        t = t.to(dtype)
        x = [y.detach().to(dtype).requires_grad_() for y in a]
        t.attention.dropout = FixedDropout(torch.from_numpy(mask1).reshape(6, 5, 5).to(dtype))
        o1 = t(x[0], x[0], x[0], lens[0])
        t.attention.dropout = FixedDropout(torch.from_numpy(mask2).reshape(6, 5, 5).to(dtype))
        o2 = t(o1[..., :6], x[1], x[1], lens[1])
        ((o1 * g[0].to(dtype)).sum() + (o2 * g[1].to(dtype)).sum()).backward()
        d = {"a0": x[0].grad.numpy(), "a1": x[1].grad.numpy()}
        d.update({n: p.grad.numpy() for n, p in t.named_parameters()})
        return d

    assert_within_bound(ours_grads, peer(torch.float32), peer(torch.float64), "two calls")


def test_gradients_accumulate_and_no_grad_keeps_no_graph():
    torch.manual_seed(2)
    m = mt.MultiHeadAttention(8, 2, 0.0)
    x = torch.randn(3, 4, 5, requires_grad=True)
    with torch.inference_mode():  # a first call there materialises normal parameters
        m(x, x, x)
    m(x, x, x).sum().backward()
    first = {n: p.grad.clone() for n, p in m.named_parameters()}
    m(x, x, x).sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[n])
    with torch.no_grad():
        y = m(x, x, x)
    assert y.grad_fn is None and not y.requires_grad
    with torch.inference_mode():
        z = m(x, x, x)
    assert z.grad_fn is None
    torch.testing.assert_close(y, z)
    # Non-contiguous inputs give the numbers of their contiguous copies.
    xt = torch.randn(4, 3, 5).transpose(0, 1)
    assert not xt.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(m(xt, xt, xt), m(xt.contiguous(), xt.contiguous(), xt.contiguous()))


def test_train_and_eval_switch_dropout():
    torch.manual_seed(0)
    m = mt.MultiHeadAttention(16, 4, 0.5)
    x = torch.randn(2, 6, 16)
    m.eval()
    e1, e2 = m(x, x, x), m(x, x, x)
    torch.testing.assert_close(e1, e2, rtol=0, atol=0)
    m.train()
    torch.manual_seed(1)
    t1 = m(x, x, x)
    torch.manual_seed(1)
    t2 = m(x, x, x)  # torch.manual_seed makes mha's masks repeatable
    t3 = m(x, x, x)
    torch.testing.assert_close(t1, t2, rtol=0, atol=0)
    assert not torch.allclose(t1, e1) and not torch.allclose(t1, t3)
    mask = m._last_context.dropout_mask
    assert set(np.unique(mask)) <= {0.0, 2.0}


def test_inputs_that_mha_does_not_take_are_named():
    m = mt.MultiHeadAttention(8, 2, 0.0)
    x = torch.randn(1, 2, 3)
    with pytest.raises(TypeError, match=r"queries: dtype torch\.float64.*x\.float\(\)"):
        m(x.to(torch.float64), x, x)
    with pytest.raises(ValueError, match=r"keys: a tensor on meta.*CPU"):
        m(x, torch.empty(1, 2, 3, device="meta"), x)
    with pytest.raises(ValueError, match=r"values: shape \(2, 3\) has 2 dimensions"):
        m(x, x, x[0])
    m(x, x, x)
    with pytest.raises(ValueError):  # another width after the first call
        m(torch.randn(1, 2, 4), x, x)


def test_deepcopy_gives_an_independent_module():
    torch.manual_seed(0)
    m = mt.MultiHeadAttention(8, 2, 0.0)
    x = torch.randn(2, 3, 4)
    y = m(x, x, x)
    c = copy.deepcopy(m)
    torch.testing.assert_close(c(x, x, x), y)
    with torch.no_grad():
        c.W_o.weight.mul_(2)
    torch.testing.assert_close(m(x, x, x), y)
    torch.testing.assert_close(c(x, x, x), 2 * y)


def test_an_optimiser_built_before_the_first_call_trains_the_same_parameters():
    ours = mt.MultiHeadAttention(8, 2, 0.0)
    ref = seed.MultiHeadAttention(8, 2, 0.0)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, ref)]  # lazy parameters
    x = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        for m, o in zip((ours, ref), opts):
            if step == 0:
                torch.manual_seed(9)  # the same draws for both first calls
            o.zero_grad()
            m(x, x, x, None).square().sum().backward()
            o.step()
    for n, p in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[n], p, rtol=1e-4, atol=1e-5)
