"""mha.torch.scaled_dot_product_attention against a plain-op reference in float64:
softmax(q k^T * scale + mask) v, a boolean mask read as True = takes part
(masked_fill(-inf) where False), is_causal as torch.ones(L, S).tril(), GQA by
repeat_interleave of key/value heads, and a query whose every key is masked
giving zeros. Forward and every gradient (torch.autograd.grad), on random
shapes; float32 within 1e-5 of each tensor's scale (max |reference|, at least 1)."""
import math
import threading

import numpy as np
import pytest
import torch

from mha.torch import scaled_dot_product_attention as sdpa
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

TOL = 1e-5


def reference(q, k, v, mask=None, causal=False, scale=None, gqa=False, weights_scale=None):
    q, k, v = q.double(), k.double(), v.double()
    if gqa and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        r = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3)
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    L, S = s.shape[-2:]
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal:
        keep = keep.tril()
    s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    dead = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    if weights_scale is not None:
        p = p * weights_scale
    return p @ v


def close(a, b, what):
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
    assert err <= TOL * scale, f"{what}: error {err:.3g} > {TOL * scale:.3g}"


def draw(rng, index):
    rank = int(rng.choice([2, 3, 4, 5]))
    L, S, E, Ev = (int(rng.choice([1, 2, 5, 7, 16, 33])) for _ in range(4))
    lead = [int(rng.integers(1, 4)) for _ in range(rank - 2)]
    gqa = rank >= 3 and rng.integers(0, 3) == 0
    kv_lead = list(lead)
    if gqa:
        H = int(rng.choice([2, 4, 6]))
        lead[-1] = H
        kv_lead = list(lead)
        kv_lead[-1] = int(rng.choice([d for d in (1, 2, 3) if H % d == 0]))
    t = lambda *s: torch.tensor(rng.standard_normal(s), dtype=torch.float32, requires_grad=True)  # noqa: E731
    q, k, v = t(*lead, L, E), t(*kv_lead, S, E), t(*kv_lead, S, Ev)
    kind = rng.integers(0, 5)
    mask, causal = None, False
    shape = [*lead, L, S]
    bshape = [d if rng.integers(0, 2) else 1 for d in shape]  # a broadcastable shape
    if rng.integers(0, 2):
        bshape = bshape[int(rng.integers(0, len(bshape))):]  # fewer leading dimensions
    if kind == 1:
        mask = torch.tensor(rng.random(bshape) < 0.7)
    elif kind == 2:
        mask = torch.tensor(rng.standard_normal(bshape), dtype=torch.float32)
        mask = mask.masked_fill(torch.tensor(rng.random(bshape) < 0.2), float("-inf"))
    elif kind == 3:
        causal = True
    scale = None if rng.integers(0, 2) else float(rng.uniform(0.05, 1.0))
    return q, k, v, mask, causal, scale, bool(gqa)


@pytest.mark.parametrize("index", range(60))
def test_forward_and_gradients_match_the_plain_ops(index):
    rng = np.random.default_rng(1000 + index)
    q, k, v, mask, causal, scale, gqa = draw(rng, index)
    out = sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    want = reference(q, k, v, mask, causal, scale, gqa)
    assert out.shape == want.shape and out.dtype == torch.float32
    close(out, want, f"case {index} output")
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(index))
    got = torch.autograd.grad((out * g).sum(), (q, k, v))
    ref = torch.autograd.grad((want * g.double()).sum(), (q, k, v))
    for a, b, n in zip(got, ref, "qkv"):
        close(a, b, f"case {index} grad {n}")


def test_fully_masked_rows_give_zeros_and_no_gradient():
    q, k, v = (torch.randn(2, 3, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    out = sdpa(q, k, v, attn_mask=mask)
    assert torch.equal(out[:, 1], torch.zeros(2, 4)) and torch.isfinite(out).all()
    gq, = torch.autograd.grad(out.sum(), q)
    assert torch.equal(gq[:, 1], torch.zeros(2, 4))


def test_dropout_is_repeatable_and_matches_its_mask():
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    torch.manual_seed(5)
    a = sdpa(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    b = sdpa(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b)
    assert not torch.allclose(a, sdpa(q, k, v, dropout_p=0.5))
    torch.testing.assert_close(sdpa(q, k, v, dropout_p=0.0), reference(q, k, v).float(), rtol=1e-5, atol=1e-5)
    # With p = 1 every weight is dropped: zeros.
    assert torch.equal(sdpa(q, k, v, dropout_p=1.0), torch.zeros(1, 2, 6, 8))
    # The output is some dropped-and-rescaled weights times v: recover the mask from v = identity.
    eye = torch.eye(6).expand(1, 2, 6, 6)
    torch.manual_seed(7)
    w = sdpa(q, k[..., :8], eye.contiguous(), dropout_p=0.4)  # (1, 2, 6, 6): the weights after dropout
    plain = reference(q, k[..., :8], eye).float()
    kept = w != 0
    torch.testing.assert_close(w[kept], plain[kept] / 0.6, rtol=1e-5, atol=1e-6)
    # and the backward uses the same mask: d out / d v = weights^T
    vv = eye.clone().requires_grad_(True)
    torch.manual_seed(7)
    out = sdpa(q, k[..., :8], vv, dropout_p=0.4)
    gv, = torch.autograd.grad(out.sum(), vv)
    torch.testing.assert_close(gv, w.transpose(-2, -1) @ torch.ones(1, 2, 6, 6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_compute_in_float32(dtype):
    q, k, v = (torch.randn(2, 3, 5, 8).to(dtype) for _ in range(3))
    out = sdpa(q, k, v)
    assert out.dtype == dtype
    torch.testing.assert_close(out, reference(q.float(), k.float(), v.float()).to(dtype), rtol=0, atol=1e-2)


def test_threads_get_their_own_gradients():
    rng = np.random.default_rng(3)
    cases = [tuple(torch.tensor(rng.standard_normal((2, 2, int(L), 8)), dtype=torch.float32)
                   for _ in range(3)) for L in rng.integers(1, 20, 8)]

    def run(c):
        q, k, v = (x.clone().requires_grad_(True) for x in c)
        out = sdpa(q, k, v, is_causal=True)
        return (out.detach(), *torch.autograd.grad(out.square().sum(), (q, k, v)))

    serial = [run(c) for c in cases]
    results, errors = [None] * 8, []

    def worker(i):
        try:
            for _ in range(3):
                results[i] = run(cases[i])
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a, b in zip(results, serial):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_errors_name_the_argument():
    q, k = torch.ones(2, 3, 4), torch.ones(2, 5, 4)
    with pytest.raises(TypeError, match=r"query: dtype torch\.float64.*x\.float\(\)"):
        sdpa(q.double(), k, k)
    with pytest.raises(ValueError, match=r"attn_mask and is_causal: both given"):
        sdpa(q, k, k, attn_mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match=r"attn_mask: shape \(4, 5\) does not broadcast to \(2, 3, 5\)"):
        sdpa(q, k, k, attn_mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key: leading dimensions \(1, 5\)"):
        sdpa(torch.ones(1, 4, 3, 4), torch.ones(1, 5, 5, 4), torch.ones(1, 5, 5, 4), enable_gqa=True)
    with pytest.raises(ValueError, match=r"or enable_gqa=True"):
        sdpa(torch.ones(1, 4, 3, 4), torch.ones(1, 2, 5, 4), torch.ones(1, 2, 5, 4))
    with pytest.raises(NotImplementedError, match=r"attn_mask: requires grad"):
        sdpa(q, k, k, attn_mask=torch.zeros(3, 5, requires_grad=True))
    with pytest.raises(TypeError, match=r"attn_mask: dtype torch\.int64"):
        sdpa(q, k, k, attn_mask=torch.ones(3, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"\] dropout_p: got str"):
        sdpa(q, k, k, dropout_p="0.1")
    with pytest.raises(RuntimeError, match=r"create_graph=True"):
        qg = q.clone().requires_grad_(True)
        torch.autograd.grad(sdpa(qg, k, k).sum(), qg, create_graph=True)


@pytest.mark.parametrize("which", ["query", "key", "value", "output"])
def test_changing_a_saved_tensor_in_place_fails_the_backward(which):
    # The call keeps no copies of q, k, v or its output for the backward: it saves them as PyTorch's
    # own functions do, so a change in place in between fails there instead of giving the
    # gradients of other values. Without the change the gradients match the reference.
    g = torch.Generator().manual_seed(6100)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g, requires_grad=True) for _ in range(3))
    x = {n: t.detach().clone().requires_grad_() for n, t in zip(("query", "key", "value"), (q, k, v))}
    out = sdpa(x["query"] * 1.0, x["key"] * 1.0, x["value"] * 1.0)  # non-leaf inputs may change in place
    want = reference(q, k, v)
    close(out.detach(), want.float().detach(), "out")
    grads = torch.autograd.grad(want, (q, k, v), torch.ones_like(want))
    inputs = [t * 1.0 for t in (x["query"], x["key"], x["value"])]
    out2 = sdpa(*inputs)
    if which == "output":
        out2.mul_(2.0)
    else:
        inputs[("query", "key", "value").index(which)].add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out2.sum().backward()
    got = torch.autograd.grad(out, (x["query"], x["key"], x["value"]), torch.ones_like(out))
    for name, a, b in zip("qkv", got, grads):
        close(a, b.float(), f"grad {name}")
