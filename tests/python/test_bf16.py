"""precision='bfloat16' on both modules: the projections' products (forward
and backward) round their two inputs to bfloat16 and sum in float32, and the
projected q, k, v are rounded to bfloat16; attention, parameters and
optimiser steps stay float32 (mha/precision.h).

The peer is the d2l chapter's PyTorch code with each nn.Linear replaced by a
product whose inputs are rounded to bfloat16, forward and backward
(Bf16MatMul, an autograd Function), and q, k, v rounded after it (gradients
passing through the rounding unchanged), everything else as written. ours
and that peer sum in different orders, so an intermediate may round to a
neighbouring bfloat16 in one and not the other: the bound against the peer
is PEER_TOL of the tensor's scale (measured over 120 cases: median 1e-7, 99th
percentile 6e-4, largest 1.05e-3, in a W_o gradient). The float32 module's
output is 1.6e-3 to 1e-2 away (median 3.7e-3; bounded by FP32_TOL), and a
test requires that distance to be there, so a module that ignored the
precision fails.
"""
import numpy as np
import pytest
import torch

import mha
from training_helpers import normalised_error, random_case, seed_module_like

PEER_TOL = 2e-3
FP32_TOL = 5e-2
NUM_CASES = 40


def bf16(x):
    """x rounded to bfloat16 (nearest, ties to even), as float32."""
    return x.to(torch.bfloat16).to(x.dtype)


class Bf16MatMul(torch.autograd.Function):
    """a @ b with both inputs rounded to bfloat16; its backward's products too."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.matmul(bf16(a), bf16(b))

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        g = bf16(grad)
        return torch.matmul(g, bf16(b).transpose(-1, -2)), torch.matmul(bf16(a).transpose(-1, -2), g)


def bf16_mm(a, b):
    return Bf16MatMul.apply(a, b)


class RoundToBf16(torch.autograd.Function):
    """x rounded to bfloat16; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x):
        return bf16(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def bf16_linear(layer, x):
    y = bf16_mm(x, layer.weight.t())
    return y if layer.bias is None else y + layer.bias


def chapter_forward_bf16(t, queries, keys, values, valid_lens):
    """The chapter's MultiHeadAttention.forward, bfloat16 projections and q, k, v."""
    q = t.transpose_qkv(RoundToBf16.apply(bf16_linear(t.W_q, queries)))
    k = t.transpose_qkv(RoundToBf16.apply(bf16_linear(t.W_k, keys)))
    v = t.transpose_qkv(RoundToBf16.apply(bf16_linear(t.W_v, values)))
    if valid_lens is not None:
        valid_lens = torch.repeat_interleave(valid_lens, repeats=t.num_heads, dim=0)
    output = t.attention(q, k, v, valid_lens)
    return bf16_linear(t.W_o, t.transpose_output(output))


def peer_run(t, case):
    inputs = [torch.tensor(case[n], requires_grad=True) for n in ("queries", "keys", "values")]
    lens = None if case["valid_lens"] is None else torch.from_numpy(case["valid_lens"])
    out = chapter_forward_bf16(t, *inputs, lens)
    out.backward(torch.from_numpy(case["grad_output"]))
    params = {n: p.grad.detach().numpy() for n, p in t.named_parameters()}
    return out.detach().numpy(), [x.grad.numpy() for x in inputs], params


def ours_run(case, precision, kernel, seed_value):
    m = mha.MultiHeadAttention(case["num_hiddens"], case["num_heads"], case["dropout"], case["bias"],
                               seed=seed_value, precision=precision)
    m.kernel = kernel
    out = m(case["queries"], case["keys"], case["values"], case["valid_lens"])
    inputs, params = m.backward(case["grad_output"])
    return m, out, inputs, params


def param_error(name, got, want):
    """A parameter gradient's error relative to its layer's weight gradient."""
    scale = np.abs(want[name.replace(".bias", ".weight")]).max()
    scale = max(scale, np.abs(want[name]).max())
    err = np.abs(got[name] - want[name]).max()
    return err / scale if scale > 0 else err


@pytest.mark.parametrize("index", range(NUM_CASES))
def test_bf16_matches_the_chapter_with_bf16_products(index):
    rng = np.random.default_rng(7000 + index)
    case = random_case(rng)
    kernel = (mha.Kernel.FUSED, mha.Kernel.BLAS, mha.Kernel.REFERENCE)[index % 3]
    m, out, inputs, params = ours_run(case, "bf16", kernel, index)
    assert m.precision == "bfloat16"
    mask = m.last_dropout_mask if case["dropout"] > 0 else None
    t = seed_module_like(m, case, mask)
    p_out, p_inputs, p_params = peer_run(t, case)
    where = f"case {index} ({kernel})"
    assert normalised_error(out, p_out) <= PEER_TOL, where
    for name, got, want in zip(("queries", "keys", "values"), inputs, p_inputs):
        assert normalised_error(got, want) <= PEER_TOL, f"{where}: grad {name}"
    assert sorted(params) == sorted(p_params)
    for name in p_params:
        assert param_error(name, params, p_params) <= PEER_TOL, f"{where}: grad {name}"
    # Within FP32_TOL of the float32 module, and not equal to it.
    _, out32, inputs32, params32 = ours_run(case, "float32", kernel, index)
    assert normalised_error(out, out32) <= FP32_TOL, where
    for got, want in zip(inputs, inputs32):
        assert normalised_error(got, want) <= FP32_TOL, where
    for name in params32:
        assert param_error(name, params, params32) <= FP32_TOL, f"{where}: grad {name}"


def test_bf16_differs_from_float32_by_what_bf16_rounding_gives():
    """A module that ignored precision would match float32 exactly."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 16, 24)).astype(np.float32)
    outs = {}
    for precision in ("float32", "bfloat16"):
        m = mha.MultiHeadAttention(32, 4, 0.0, bias=True, seed=1, precision=precision)
        m.eval()
        outs[precision] = m(x, x, x)
    err = normalised_error(outs["bfloat16"], outs["float32"])
    # bfloat16 keeps 8 bits of mantissa: a relative rounding of up to 2^-9 per input.
    assert 1e-4 < err < FP32_TOL, err


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B", [1, 3])
def test_bf16_cached_decoding_is_the_uncached_bf16_loop(B, cache_dtype):
    """Cached calls run the module's precision: a prefill and one-position
    steps match the uncached bfloat16 module called on each query over its
    keys so far (the d2l chapter's decoding loop). Their attention differs
    (the decode kernel in float32, the uncached call's on AMX tiles where
    usable, within 2e-5), and W_o rounds its input to bfloat16, where such a
    difference can flip a rounding: so the bound is PEER_TOL, as against the
    peer (measured 1.2e-4). Both cache dtypes hold the rounded k, v exactly.
    The float32 module's cached calls are well away, so cached calls that
    ignored the precision would fail."""
    rng = np.random.default_rng(13 + B)
    T, P = 18, 5
    X = rng.standard_normal((B, T, 40)).astype(np.float32)
    outs = {}
    for precision in ("bfloat16", "float32"):
        m = mha.MultiHeadAttention(48, 4, 0.0, bias=True, seed=3, precision=precision)
        m.eval()
        loop = np.concatenate([m(X[:, t:t + 1], X[:, :t + 1], X[:, :t + 1]) for t in range(T)], axis=1)
        cache = m.kv_cache(B, T, dtype=cache_dtype)
        steps = [m(X[:, :P], X[:, :P], X[:, :P], cache=cache)]
        steps += [m(X[:, t:t + 1], X[:, t:t + 1], X[:, t:t + 1], cache=cache) for t in range(P, T)]
        outs[precision] = (np.concatenate(steps, axis=1), loop)
    cached, loop = outs["bfloat16"]
    assert normalised_error(cached, loop) <= PEER_TOL
    assert 1e-4 < normalised_error(cached, outs["float32"][0]) < FP32_TOL


@pytest.mark.parametrize("with_lengths", [False, True])
def test_bf16_results_are_the_same_bits_at_one_and_two_threads(with_lengths):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((3, 150, 40)).astype(np.float32)
    kv = rng.standard_normal((3, 170, 40)).astype(np.float32)
    lens = np.array([170, 33, 90], np.float32) if with_lengths else None
    grad = rng.standard_normal((3, 150, 64)).astype(np.float32)
    before = mha.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            mha.set_num_threads(n)
            m = mha.MultiHeadAttention(64, 4, 0.0, bias=True, seed=2, precision="bf16")
            out = m(q, kv, kv, lens)
            inputs, params = m.backward(grad)
            runs.append((out, inputs, params))
    finally:
        mha.set_num_threads(before)
    (o1, i1, p1), (o2, i2, p2) = runs
    assert np.array_equal(o1, o2)
    for a, b in zip(i1, i2):
        assert np.array_equal(a, b)
    for name in p1:
        assert np.array_equal(p1[name], p2[name]), name


def test_bf16_optimiser_steps_move_the_float32_master_weights():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 12)).astype(np.float32)
    grad = rng.standard_normal((2, 9, 16)).astype(np.float32)
    m = mha.MultiHeadAttention(16, 2, 0.0, bias=False, seed=4, precision="bf16")
    m(x, x, x)
    before = {k: v.copy() for k, v in m.state_dict().items()}
    _, grads = m.backward(grad)
    opt = mha.optim.SGD(m, lr=1e-3)
    opt.step()
    after = m.state_dict()
    for name, w in after.items():
        assert w.dtype == np.float32
        # torch.optim.SGD's rule in float32 on the float32 weights: not on
        # bfloat16 copies (whose low 16 bits would be zero).
        np.testing.assert_array_equal(w, before[name] - np.float32(1e-3) * grads[name])
        assert np.any(w.view(np.uint32) & 0xFFFF), name


def test_torch_drop_in_bf16_is_near_float32_and_not_equal():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 20, 32)).astype(np.float32)
    outs = {}
    for precision in ("float32", "bfloat16"):
        m = mha.TorchMultiheadAttention.from_state_dict(state, 4, batch_first=True)
        m.precision = precision
        m.eval()
        outs[precision] = m(x, x, x)[0]
    err = normalised_error(outs["bfloat16"], outs["float32"])
    assert 1e-4 < err < FP32_TOL, err


def test_mha_torch_modules_take_precision_and_differentiate():
    torch.manual_seed(1)
    x = torch.randn(2, 7, 12, requires_grad=True)
    for make in (lambda p: mha.torch.MultiHeadAttention(12, 3, 0.0, precision=p),
                 lambda p: mha.torch.MultiheadAttention(12, 3, batch_first=True, precision=p)):
        grads = {}
        for p in ("float32", "bf16"):
            torch.manual_seed(2)
            m = make(p)
            out = m(x, x, x)
            out = out[0] if isinstance(out, tuple) else out
            x.grad = None
            out.sum().backward()
            grads[p] = x.grad.clone()
            assert m.precision == ("bfloat16" if p == "bf16" else "float32")
        err = normalised_error(grads["bf16"].numpy(), grads["float32"].numpy())
        assert 0 < err < FP32_TOL, err


@pytest.mark.parametrize("bad", ["fp16", "BF16", "", "float64"])
def test_an_unknown_precision_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match=r"MultiHeadAttention.*precision: '" + bad + "' is not a precision"):
        mha.MultiHeadAttention(8, 2, precision=bad)
    m = mha.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="precision"):
        m.precision = bad
    assert m.precision == "float32"
    with pytest.raises(ValueError, match=r"mha.torch.MultiheadAttention\] precision"):
        mha.torch.MultiheadAttention(8, 2, precision=bad)
    with pytest.raises(TypeError, match="precision"):
        mha.torch.MultiHeadAttention(8, 2, 0.0, precision=16)
