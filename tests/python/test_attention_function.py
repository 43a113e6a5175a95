"""mha.torch.attention against a composition of plain torch ops in float64, written here from
FlashAttention's documented conventions: scores q k^T * scale; softcap * tanh(s / softcap); ALiBi
-slope_h * |i + Lk - Lq - j|; the band i + Lk - Lq - left <= j <= i + Lk - Lq + right (causal: right 0)
as masked_fill(-inf); a sink column concatenated to the logits, softmaxed, then dropped; a query with no
key giving zeros; grouped heads by repeat_interleave; a packed batch as block-diagonal masks over its
sequences (positions counted within each). Forward and every gradient (q, k, v, sinks) by
torch.autograd.grad on random shapes, float32 within 1e-5 of each tensor's scale; a packed batch against
its sequences one by one; dropout against the plain ops with mha's own mask read back; the errors."""
import math

import numpy as np
import pytest
import torch

import mha
from mha.torch import attention
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

TOL = 1e-5


def band(Lq, Lk, causal, window, starts=None):
    """keep[i, j] of FlashAttention's bottom-right band; starts[i]: row i's sequence (packed), or None."""
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = torch.arange(Lq)[:, None]
    j = torch.arange(Lk)[None, :]
    diag = i + Lk - Lq
    keep = torch.ones(Lq, Lk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= diag - left
    if right >= 0:
        keep &= j <= diag + right
    if starts is not None:
        keep &= starts[:, None] == starts[None, :]
    return keep


def reference(q, k, v, causal=False, window=None, alibi=None, softcap=None, sinks=None, scale=None,
              starts=None, multipliers=None):
    """q (B, Lq, H, d), k (B, Lk, Hkv, d), v (B, Lk, Hkv, dv) -> (B, Lq, H, dv), in float64."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv != H:
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    Lq, Lk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        dist = (torch.arange(Lq)[:, None] + Lk - Lq - torch.arange(Lk)[None, :]).abs().double()
        s = s - alibi.double()[None, :, None, None] * dist
    s = s.masked_fill(~band(Lq, Lk, causal, window, starts), float("-inf"))
    dead = torch.isneginf(s).all(-1, keepdim=True)
    if sinks is not None:
        col = sinks.double()[None, :, None, None].expand(s.shape[0], H, Lq, 1)
        p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    if multipliers is not None:
        p = p * multipliers
    return (p @ v).transpose(1, 2)


def close(a, b, what):
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
    assert err <= TOL * scale, f"{what}: error {err:.3g} > {TOL * scale:.3g}"


def check(kwargs, ref_kwargs, q, k, v, sinks=None):
    """attention(**kwargs) against reference(**ref_kwargs): forward and the gradients of q, k, v (and sinks)."""
    inputs = [q, k, v] + ([sinks] if sinks is not None else [])
    out = attention(q, k, v, sinks=sinks, **kwargs)
    want = reference(q, k, v, sinks=sinks, **ref_kwargs)
    close(out, want, "out")
    g = torch.randn(out.shape, dtype=torch.float64)
    got = torch.autograd.grad(out, inputs, g.float())
    wanted = torch.autograd.grad(want, inputs, g)
    for name, a, b in zip(("q", "k", "v", "sinks"), got, wanted):
        close(a, b, f"grad {name}")


def tensors(rng, B, Lq, Lk, H, Hkv, d, dv, spread=1.0):
    t = lambda *s: torch.tensor(rng.standard_normal(s) * spread, dtype=torch.float32, requires_grad=True)  # noqa
    return t(B, Lq, H, d), t(B, Lk, Hkv, d), t(B, Lk, Hkv, dv)


def heads(rng):
    Hkv = int(rng.choice([1, 2, 3]))
    return Hkv * int(rng.choice([1, 2])), Hkv


def window_of(rng, Lq, Lk):
    side = lambda: int(rng.choice([-1, 0, 1, 3, Lk // 2, Lq + Lk + 5]))  # noqa: E731 (0 and wider than L)
    return None if rng.integers(0, 4) == 0 else (side(), side())


# ---- what the kernels honour on every branch: window, causal, scale, grouped heads ----

@pytest.mark.parametrize("index", range(40))
def test_window_causal_scale_and_grouped_heads_match_the_plain_ops(index):
    rng = np.random.default_rng(3000 + index)
    Lq, Lk = (int(rng.choice([1, 2, 5, 7, 16, 33, 70])) for _ in range(2))
    H, Hkv = heads(rng)
    d, dv = int(rng.choice([1, 3, 8, 17])), int(rng.choice([2, 8, 9]))
    q, k, v = tensors(rng, int(rng.integers(1, 3)), Lq, Lk, H, Hkv, d, dv)
    causal = bool(rng.integers(0, 2))
    window = window_of(rng, Lq, Lk)
    scale = None if rng.integers(0, 2) else float(rng.uniform(0.05, 1.0))
    kw = dict(causal=causal, window=window, scale=scale)
    check(kw, kw, q, k, v)


@pytest.mark.parametrize("index", range(20))
def test_a_packed_batch_matches_the_plain_ops_with_blocks(index):
    rng = np.random.default_rng(4000 + index)
    lengths = [int(rng.choice([0, 1, 1, 2, 5, 17, 40])) for _ in range(int(rng.integers(1, 7)))]
    if sum(lengths) == 0:
        lengths.append(3)
    T = sum(lengths)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    starts = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    H, Hkv = heads(rng)
    q, k, v = (x.squeeze(0).detach().requires_grad_() for x in tensors(rng, 1, T, T, H, Hkv, 8, 5))
    causal = bool(rng.integers(0, 2))
    window = None if rng.integers(0, 2) else (int(rng.choice([0, 2, 50])), int(rng.choice([-1, 0, 3])))
    out = attention(q, k, v, causal=causal, window=window, cu_seqlens=cu, max_seqlen=max(lengths))
    want = reference(q[None], k[None], v[None], causal=causal, window=window, starts=starts)[0]
    close(out, want, "out")
    g = torch.randn(out.shape, dtype=torch.float64)
    for name, a, b in zip("qkv", torch.autograd.grad(out, (q, k, v), g.float()),
                          torch.autograd.grad(want, (q, k, v), g)):
        close(a, b, f"grad {name}")


def one_by_one(q, k, v, cu, **kw):
    """Each sequence of a packed batch run alone (as (1, L, H, d)), concatenated."""
    outs = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e > s:
            outs.append(attention(q[None, s:e], k[None, s:e], v[None, s:e], **kw)[0])
    return torch.cat(outs)


def packed_case(seed, score_options=False):
    rng = np.random.default_rng(seed)
    lengths = [int(rng.choice([1, 1, 3, 9, 30, 64])) for _ in range(int(rng.integers(1, 6)))]
    T = sum(lengths)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    H, Hkv = heads(rng)
    q, k, v = (x.squeeze(0).detach().requires_grad_() for x in tensors(rng, 1, T, T, H, Hkv, 16, 16))
    kw = dict(causal=bool(rng.integers(0, 2)), window=None if rng.integers(0, 2) else (5, int(rng.choice([-1, 2]))))
    sinks = None
    if score_options:
        kw["softcap"] = float(rng.choice([0.5, 30.0]))
        kw["alibi_slopes"] = torch.tensor(rng.uniform(-0.5, 0.5, H), dtype=torch.float32)
        sinks = torch.tensor(rng.standard_normal(H), dtype=torch.float32, requires_grad=True)
    return q, k, v, cu, kw, sinks


@pytest.mark.parametrize("seed", range(8))
def test_a_packed_batch_equals_its_sequences_one_by_one(seed):
    q, k, v, cu, kw, _ = packed_case(5000 + seed)
    out = attention(q, k, v, cu_seqlens=cu, **kw)
    alone = one_by_one(q, k, v, cu, **kw)
    close(out, alone, "out")
    g = torch.randn(out.shape)
    for name, a, b in zip("qkv", torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(alone, (q, k, v), g)):
        close(a, b, f"grad {name}")


@pytest.mark.parametrize("seed", range(4))
def test_without_autograd_inputs_are_read_in_place_and_left_alone(seed):
    # Under no_grad the call reads q, k, v where they lie (views of larger tensors, transposed,
    # bfloat16 widened): the same output as with autograd, and the inputs unchanged.
    g = torch.Generator().manual_seed(5200 + seed)
    B, Lq, Lk, H, d = 2, 7 + seed, 9 + 2 * seed, 4, 8
    base = torch.randn(B, H, Lq + 3, d, generator=g)
    q = base[:, :, 1:Lq + 1].transpose(1, 2)  # (B, Lq, H, d), not contiguous
    k = torch.randn(B, Lk, H, d, generator=g).bfloat16()
    v = torch.randn(B, Lk, 2 * H, d, generator=g)[:, :, ::2]
    kw = dict(causal=seed % 2 == 0, window=(3, 1) if seed > 1 else None)
    before = [x.clone() for x in (q, k, v)]
    with torch.no_grad():
        out = attention(q, k, v, **kw)
    with_grad = attention(q.detach().requires_grad_(), k, v, **kw)
    assert torch.equal(out, with_grad.detach())
    close(out, reference(q, k, v, **kw).float(), "out")
    for x, y in zip((q, k, v), before):
        assert torch.equal(x, y)
    q, k, v, cu, kw, _ = packed_case(5300 + seed)
    with torch.no_grad():
        packed = attention(q, k, v, cu_seqlens=cu, **kw)
    close(packed, one_by_one(q, k, v, cu, **kw).detach(), "packed out")


def test_max_seqlen_is_checked_not_needed():
    q, k, v, cu, kw, _ = packed_case(5100)
    longest = int((cu[1:] - cu[:-1]).max())
    a = attention(q, k, v, cu_seqlens=cu, **kw)
    b = attention(q, k, v, cu_seqlens=cu, max_seqlen=longest + 10, **kw)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"\[mha.torch.attention\] max_seqlen: .* below the longest sequence"):
        attention(q, k, v, cu_seqlens=cu, max_seqlen=longest - 1)


def test_a_query_with_no_key_gets_zeros_and_no_gradient():
    torch.manual_seed(0)
    q = torch.randn(1, 6, 2, 4, requires_grad=True)
    k = torch.randn(1, 3, 2, 4, requires_grad=True)
    v = torch.randn(1, 3, 2, 4, requires_grad=True)
    out = attention(q, k, v, causal=True)  # queries 0..2 of 6 precede every key (bottom right)
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))
    (gq,) = torch.autograd.grad(out.sum(), q)
    assert torch.equal(gq[:, :3], torch.zeros_like(gq[:, :3]))
    assert torch.isfinite(gq).all()


# ---- dropout: FlashAttention's (applied whenever dropout_p > 0), mha's mask ----

def test_dropout_is_the_plain_ops_with_the_mask_the_call_drew():
    B, L, S, H, d, p = 2, 9, 13, 2, 8, 0.3
    torch.manual_seed(1)
    q = torch.randn(B, L, H, d, requires_grad=True)
    k = torch.randn(B, S, H, d, requires_grad=True)
    # With v = the identity over the keys, out holds the dropped weights: P * M.
    eye = torch.eye(S)[None, :, None, :].expand(B, S, H, S).contiguous()
    torch.manual_seed(7)
    pm = attention(q, k, eye, causal=True, dropout_p=p).detach().transpose(1, 2)  # (B, H, L, S)
    plain = reference(q, k, eye, causal=True).detach().transpose(1, 2)
    m = torch.where(plain > 0, pm.double() / plain, torch.zeros_like(plain))
    kept = m[plain > 1e-6]
    assert bool(((kept.abs() < 1e-4) | ((kept - 1 / (1 - p)).abs() < 1e-4)).all()), "a multiplier not 0 or 1/(1-p)"
    assert 0.15 < float((kept.abs() < 1e-4).double().mean()) < 0.45
    m = torch.where(m.abs() < 1e-4, 0.0, 1 / (1 - p))
    v = torch.randn(B, S, H, 5, requires_grad=True)
    torch.manual_seed(7)  # the same key, so the same mask
    check(dict(causal=True, dropout_p=p), dict(causal=True, multipliers=m), q, k, v)


def test_dropout_one_drops_everything():
    q = torch.randn(1, 4, 2, 8)
    assert torch.equal(attention(q, q, q, dropout_p=1.0), torch.zeros(1, 4, 2, 8))


def test_bfloat16_in_bfloat16_out():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 5, 2, 8).bfloat16().requires_grad_() for _ in range(3))
    out = attention(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    want = reference(q.float(), k.float(), v.float(), causal=True)
    assert float((out.double() - want).abs().max()) < 2e-2
    (gq,) = torch.autograd.grad(out.float().sum(), q)
    assert gq.dtype == torch.bfloat16


def test_each_call_keeps_its_own_context():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 7, 2, 4, requires_grad=True) for _ in range(3))
    a = attention(q, k, v, causal=True)
    b = attention(q, k, v, window=(1, 1))
    ga = torch.autograd.grad(a.sum(), q)[0]
    gb = torch.autograd.grad(b.sum(), q)[0]
    close(ga, torch.autograd.grad(reference(q, k, v, causal=True).sum(), q)[0], "grad q of a")
    close(gb, torch.autograd.grad(reference(q, k, v, window=(1, 1)).sum(), q)[0], "grad q of b")


# ---- score options: softcap, ALiBi, sinks (honoured once the kernels take them) ----

def _kernels_take(option):
    """Whether the kernels honour a score option (they ignore one they do not know)."""
    torch.manual_seed(11)
    q, k, v = (torch.randn(1, 5, 2, 4) * 3 for _ in range(3))
    kw = {"softcap": dict(softcap=0.5), "alibi": dict(alibi_slopes=torch.tensor([0.7, -0.4])),
          "sinks": dict(sinks=torch.tensor([2.0, 3.0]))}[option]
    return not torch.allclose(attention(q, k, v, **kw), attention(q, k, v))


SCORES = pytest.mark.skipif(not all(_kernels_take(o) for o in ("softcap", "alibi", "sinks")),
                            reason="the kernels do not honour softcap / alibi_slopes / sinks yet")


@SCORES
@pytest.mark.parametrize("index", range(40))
def test_score_options_alone_and_in_pairs_match_the_plain_ops(index):
    rng = np.random.default_rng(6000 + index)
    Lq, Lk = (int(rng.choice([1, 3, 7, 16, 33, 65])) for _ in range(2))
    H, Hkv = heads(rng)
    q, k, v = tensors(rng, int(rng.integers(1, 3)), Lq, Lk, H, Hkv, int(rng.choice([4, 8, 17])), 8, spread=2.0)
    options = ["softcap", "alibi", "sinks", "causal", "window"]
    chosen = [options[index % 3]] if index < 12 else list(rng.choice(options, 2, replace=False))
    kw, sinks = {}, None
    if "softcap" in chosen:
        kw["softcap"] = float(rng.choice([0.3, 2.0, 50.0]))  # small (saturating) and large
    if "alibi" in chosen:
        kw["alibi_slopes"] = torch.tensor(rng.uniform(-1.0, 1.0, H), dtype=torch.float32)  # both signs
    if "sinks" in chosen:
        big = index % 2 == 0  # sinks that dominate every row
        sinks = torch.tensor(rng.standard_normal(H) + (8.0 if big else 0.0), dtype=torch.float32,
                             requires_grad=True)
    if "causal" in chosen:
        kw["causal"] = True
    if "window" in chosen:
        kw["window"] = window_of(rng, Lq, Lk) or (2, 0)
    ref_kw = {("alibi" if n == "alibi_slopes" else n): x for n, x in kw.items()}
    check(kw, ref_kw, q, k, v, sinks)


@SCORES
@pytest.mark.parametrize("seed", range(6))
def test_score_options_in_a_packed_batch_equal_its_sequences_one_by_one(seed):
    q, k, v, cu, kw, sinks = packed_case(7000 + seed, score_options=True)
    out = attention(q, k, v, cu_seqlens=cu, sinks=sinks, **kw)
    alone = one_by_one(q, k, v, cu, sinks=sinks, **kw)
    close(out, alone, "out")
    g = torch.randn(out.shape)
    names = ("q", "k", "v", "sinks")
    for name, a, b in zip(names, torch.autograd.grad(out, (q, k, v, sinks), g),
                          torch.autograd.grad(alone, (q, k, v, sinks), g)):
        close(a, b, f"grad {name}")


# ---- bad arguments: an error naming the function, the argument, the value and what was wanted ----

def _qkv(*shape):
    return torch.ones(*shape), torch.ones(*shape), torch.ones(*shape)


@pytest.mark.parametrize("call, error, message", [
    (lambda: attention(*_qkv(1, 3, 2, 4), window=(-2, 0)), ValueError, r"window: \(-2, 0\) has a side below -1"),
    (lambda: attention(*_qkv(1, 3, 2, 4), window=3), mha.ArgumentTypeError, r"window: got int, wanted None or a pair"),
    (lambda: attention(*_qkv(1, 3, 2, 4), scale=0.0), ValueError, r"scale: 0; wanted a finite number > 0"),
    (lambda: attention(*_qkv(1, 3, 2, 4), softcap=-1.0), ValueError, r"softcap: -1; wanted a finite number >= 0"),
    (lambda: attention(*_qkv(1, 3, 2, 4), dropout_p=2.0), ValueError, r"dropout_p: 2 is not a probability"),
    (lambda: attention(*_qkv(3, 2, 4)), ValueError, r"q, k, v: shapes \(3, 2, 4\).*packed \(T, H, d\) rows need"),
    (lambda: attention(torch.ones(1, 3, 2, 4), torch.ones(1, 3, 2, 5), torch.ones(1, 3, 2, 4)), ValueError,
     r"k, v: shapes \(1, 3, 2, 5\), \(1, 3, 2, 4\) do not fit q"),
    (lambda: attention(torch.ones(1, 3, 3, 4), torch.ones(1, 3, 2, 4), torch.ones(1, 3, 2, 4)), ValueError,
     r"k: 2 heads do not divide q's 3"),
    (lambda: attention(*_qkv(1, 3, 2, 4), alibi_slopes=torch.ones(3)), ValueError,
     r"alibi_slopes: shape \(3,\); wanted \(2,\)"),
    (lambda: attention(*_qkv(1, 3, 2, 4), sinks=torch.ones(2, dtype=torch.int64)), TypeError,
     r"sinks: dtype torch.int64; wanted a floating tensor"),
    (lambda: attention(*_qkv(1, 3, 2, 4), sinks=torch.tensor([0.0, float("nan")])), ValueError,
     r"sinks: .* not finite"),
    (lambda: attention(*_qkv(1, 3, 2, 4), alibi_slopes=torch.ones(2, requires_grad=True)), NotImplementedError,
     r"alibi_slopes: requires grad"),
    (lambda: attention(*_qkv(5, 2, 4), cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32)), ValueError,
     r"cu_seqlens: \[0, 2, 4\]; wanted nondecreasing offsets from 0 to the 5 packed rows"),
    (lambda: attention(*_qkv(5, 2, 4), cu_seqlens=torch.tensor([0, 3, 2, 5], dtype=torch.int32)), ValueError,
     r"cu_seqlens: \[0, 3, 2, 5\]; wanted nondecreasing"),
    (lambda: attention(*_qkv(5, 2, 4), cu_seqlens=torch.tensor([0.0, 5.0])), TypeError,
     r"cu_seqlens: dtype torch.float32; wanted torch.int32"),
    (lambda: attention(*_qkv(5, 2, 4), cu_seqlens=torch.tensor([5], dtype=torch.int32)), ValueError,
     r"cu_seqlens: shape \(1,\); wanted \(B \+ 1,\)"),
    (lambda: attention(*_qkv(1, 3, 2, 4), max_seqlen=3), ValueError, r"max_seqlen: 3 without cu_seqlens"),
    (lambda: attention(torch.ones(5, 2, 4), torch.ones(4, 2, 4), torch.ones(4, 2, 4),
                       cu_seqlens=torch.tensor([0, 5], dtype=torch.int32)), ValueError, r"k, v: shapes \(4, 2, 4\)"),
    (lambda: attention(*_qkv(1, 3, 2, 4), causal=1), mha.ArgumentTypeError, r"causal: got int, wanted True or False"),
    (lambda: attention(torch.ones(1, 3, 2, 4).double(), *_qkv(1, 3, 2, 4)[1:]), TypeError, r"q: dtype torch.float64"),
])
def test_bad_arguments_are_refused_clearly(call, error, message):
    with pytest.raises(error, match=r"\[mha.torch.attention\] " + message):
        call()


@pytest.mark.parametrize("which", ["q", "k", "v", "output"])
def test_changing_a_saved_tensor_in_place_fails_the_backward(which):
    # As mha.torch.scaled_dot_product_attention: q, k, v and the output are read in place by the
    # backward, saved as PyTorch saves them; a change in between fails the backward.
    g = torch.Generator().manual_seed(6200)
    leaves = [torch.randn(2, 6, 3, 8, generator=g, requires_grad=True) for _ in range(3)]
    inputs = [t * 1.0 for t in leaves]
    out = attention(*inputs, causal=True)
    if which == "output":
        out.add_(1.0)
    else:
        inputs["qkv".index(which)].mul_(0.5)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    out = attention(*leaves, causal=True)
    want = reference(*leaves, causal=True)
    close(out.detach(), want.float().detach(), "out")
    for name, a, b in zip("qkv", torch.autograd.grad(out, leaves, torch.ones_like(out)),
                          torch.autograd.grad(want, leaves, torch.ones_like(want))):
        close(a, b.float(), f"grad {name}")


def test_a_second_backward_after_retain_graph_gives_the_same_gradients():
    """retain_graph=True keeps each call's saved tensors and statistics for another backward (both
    functions, both torch lines), as PyTorch's own functions do."""
    from mha.torch import scaled_dot_product_attention as sdpa
    torch.manual_seed(5)
    q = torch.randn(1, 2, 5, 4, requires_grad=True)
    k = torch.randn(1, 2, 6, 4)
    for call in (lambda: sdpa(q, k, k, is_causal=True),
                 lambda: mha.torch.attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2),
                                             causal=True).transpose(1, 2)):
        out = (call() * torch.arange(40.0).reshape(1, 2, 5, 4)).sum()
        first, = torch.autograd.grad(out, q, retain_graph=True)
        second, = torch.autograd.grad(out, q)
        assert torch.equal(first, second) and first.abs().sum() > 0
