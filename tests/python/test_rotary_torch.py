"""Rotary position embeddings on the mha.torch modules (rotary=): forward and
every gradient through autograd against a plain torch implementation (the
projections, LLaMA's rotate_half or GPT-J's interleaved rotation written
here, torch's softmax attention), the returned weights' gradients, cached
decoding token by token against the uncached causal call, the accepted
forms of rotary= and the refused ones. Tolerances: float32 1e-5 relative to
each tensor's scale."""
import copy
import math
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha
import mha.torch as mt

RNG = np.random.default_rng(20261205)


def rope(x, dims, base, interleaved):
    """x (B, h, L, d) rotated at positions 0..L-1 (Hugging Face's float32 angles)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
    freqs = torch.arange(x.shape[2]).float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    rot, rest = x[..., :dims], x[..., dims:]
    if interleaved:  # GPT-J: (x[2m], x[2m+1])
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)
    else:  # LLaMA's rotate_half: (x[m], x[m + dims/2])
        half = torch.cat([-rot[..., dims // 2:], rot[..., :dims // 2]], -1)
        out = rot * torch.cat([cos, cos], -1) + half * torch.cat([sin, sin], -1)
    return torch.cat([out, rest], -1)


def close(got, want, tol=1e-5):
    got, want = got.detach().double(), want.detach().double()
    scale = max(want.abs().max().item(), 1e-30)
    err = (got - want).abs().max().item()
    assert err <= tol * scale, (err, scale)


def drop_in_reference(m, q, k, v, kpm, causal, rot):
    """nn.MultiheadAttention's computation (batch-first, 3-d inputs) with rotary q and k."""
    E, H = m.embed_dim, m.num_heads
    d = E // H
    if m.in_proj_weight is not None:
        wq, wk, wv = m.in_proj_weight.split(E)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    bq, bk, bv = m.in_proj_bias.split(E) if m.in_proj_bias is not None else (None, None, None)
    B, L, S = q.shape[0], q.shape[1], k.shape[1]
    heads = lambda t, n: t.reshape(B, n, H, d).transpose(1, 2)  # noqa: E731
    Q, K, V = heads(F.linear(q, wq, bq), L), heads(F.linear(k, wk, bk), S), heads(F.linear(v, wv, bv), S)
    if rot is not None:
        Q, K = rope(Q, rot["dims"], rot["base"], rot["interleaved"]), rope(K, rot["dims"], rot["base"],
                                                                           rot["interleaved"])
    s = Q @ K.transpose(-1, -2) / math.sqrt(d)
    masked = torch.zeros(B, 1, L, S, dtype=torch.bool)
    if kpm is not None:
        masked = masked | kpm[:, None, None, :]
    if causal:
        masked = masked | (torch.arange(S)[None, :] > torch.arange(L)[:, None])
    w = torch.softmax(s.masked_fill(masked, float("-inf")), -1)
    out = (w @ V).transpose(1, 2).reshape(B, L, E)
    return m.out_proj(out), w


def as_dict(rotary, d):
    if rotary is True:
        return {"dims": d, "base": 10000.0, "interleaved": False}
    return {"dims": rotary.get("dims") or d, "base": rotary.get("base", 10000.0),
            "interleaved": rotary.get("interleaved", False)}


DROP_IN = [
    # B, L, S, E, H, rotary, kdim, bias, kpm, causal, batch_first
    (2, 5, 5, 16, 2, True, None, True, False, True, True),
    (1, 7, 9, 24, 3, {"dims": 4, "interleaved": True}, None, True, True, False, True),
    (3, 4, 6, 32, 4, {"dims": 6, "base": 500.0}, 12, False, True, False, False),
    (2, 9, 9, 12, 1, {"interleaved": True, "base": 50000}, None, True, False, True, False),
    (1, 1, 3, 8, 2, {"dims": 2}, 5, True, False, False, True),
]


@pytest.mark.parametrize("case", DROP_IN)
@pytest.mark.parametrize("kernel", [mha.Kernel.FUSED, mha.Kernel.REFERENCE])
def test_drop_in_forward_weights_and_every_gradient_match_torch(case, kernel):
    B, L, S, E, H, rotary, kdim, bias, with_kpm, causal, batch_first = case
    torch.manual_seed(len(str(case)))
    m = mt.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=kdim, batch_first=batch_first, kernel=kernel,
                              rotary=rotary)
    rot = as_dict(rotary, E // H)
    assert m.rotary == mha.Rotary(rot["dims"], rot["base"], rot["interleaved"])
    kw = kdim or E
    q = torch.randn(B, L, E, requires_grad=True)
    k = torch.randn(B, S, kw, requires_grad=True)
    v = torch.randn(B, S, kw, requires_grad=True)
    kpm = None
    if with_kpm:
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[:, S - 1] = True
    inputs = (q, k, v) if batch_first else tuple(t.transpose(0, 1) for t in (q, k, v))
    out, w = m(*inputs, key_padding_mask=kpm, is_causal=causal, average_attn_weights=False,
               attn_mask=torch.ones(L, S, dtype=torch.bool).triu(1) if causal else None)
    if not batch_first:
        out = out.transpose(0, 1)
    want, want_w = drop_in_reference(m, q, k, v, kpm, causal, rot)
    close(out, want)
    close(w, want_w)
    g, gw = torch.randn_like(out), torch.randn_like(w)
    leaves = [q, k, v] + [p for p in m.parameters()]
    got = torch.autograd.grad((out * g).sum() + (w * gw).sum(), leaves)
    exp = torch.autograd.grad((want * g).sum() + (want_w * gw).sum(), leaves)
    for a, b in zip(got, exp):
        close(a, b)


def test_drop_in_rotary_changes_the_result_and_off_restores_torchs():
    torch.manual_seed(1)
    m = mt.MultiheadAttention(16, 2, batch_first=True)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 6, 16)
    plain = m(x, x, x)[0]
    close(plain, ref(x, x, x)[0])
    m.rotary = True
    assert (m(x, x, x)[0] - plain).abs().max() > 1e-3
    m.rotary = None
    assert m.rotary is None
    close(m(x, x, x)[0], plain)


def chapter_reference(m, X, lens, rot):
    h = m.num_heads
    q, k, v = m.W_q(X), m.W_k(X), m.W_v(X)
    B, L = X.shape[0], X.shape[1]
    split = lambda t: t.reshape(B, L, h, -1).transpose(1, 2)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    q, k = rope(q, rot["dims"], rot["base"], rot["interleaved"]), rope(k, rot["dims"], rot["base"], rot["interleaved"])
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if lens is not None:  # the chapter's masked_softmax, -1e6 fill
        s = torch.where(torch.arange(L)[None, None, None, :] < lens[:, None, None, None], s, torch.tensor(-1e6))
    out = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, L, -1)
    return m.W_o(out)


@pytest.mark.parametrize("rotary,D,h,bias", [(True, 16, 2, False), ({"dims": 4, "interleaved": True}, 24, 2, True),
                                             ({"dims": 2, "base": 100.0}, 30, 3, True)])
def test_chapter_module_forward_and_every_gradient_match_torch(rotary, D, h, bias):
    torch.manual_seed(D)
    m = mt.MultiHeadAttention(D, h, 0.0, bias=bias, rotary=rotary)
    X = torch.randn(3, 7, D, requires_grad=True)
    lens = torch.tensor([7, 3, 5])
    out = m(X, X, X, lens)
    want = chapter_reference(m, X, lens, as_dict(rotary, D // h))
    close(out, want)
    g = torch.randn_like(out)
    leaves = [X] + list(m.parameters())
    for a, b in zip(torch.autograd.grad((out * g).sum(), leaves), torch.autograd.grad((want * g).sum(), leaves)):
        close(a, b)


@pytest.mark.parametrize("interleaved", [False, True])
def test_drop_in_cached_decoding_equals_the_uncached_causal_call(interleaved):
    torch.manual_seed(5)
    m = mt.MultiheadAttention(24, 3, batch_first=True, rotary={"dims": 6, "interleaved": interleaved}).eval()
    x = torch.randn(2, 9, 24)
    with torch.no_grad():
        want = m(x, x, x, is_causal=True, attn_mask=torch.ones(9, 9, dtype=torch.bool).triu(1))[0]
        cache = m.kv_cache(2, 9)
        steps = [m(x[:, :4], x[:, :4], x[:, :4], cache=cache)[0]]  # a prefill of 4, then one at a time
        for t in range(4, 9):
            steps.append(m(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache)[0])
    close(torch.cat(steps, 1), want)


def test_chapter_module_cached_decoding_equals_the_uncached_causal_call():
    torch.manual_seed(6)
    m = mt.MultiHeadAttention(16, 2, 0.0, rotary=True).eval()
    x = torch.randn(1, 6, 16)
    with torch.no_grad():
        m(x, x, x)  # materialise the lazy layers
        cache = m.kv_cache(1, 6)
        steps = [m(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache) for t in range(6)]
        # the chapter's uncached call with valid_lens (B, Q) = i + 1 is the causal one
        want = m(x, x, x, torch.arange(1, 7)[None, :])
    close(torch.cat(steps, 1), want)


def test_rotary_survives_deepcopy_and_pickle():
    for m in (mt.MultiheadAttention(16, 2, rotary={"dims": 4, "interleaved": True}),
              mt.MultiHeadAttention(16, 2, 0.0, rotary=True)):
        for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
            assert c.rotary == m.rotary


def test_numpy_modules_take_the_same_forms():
    m = mha.MultiHeadAttention(16, 2, rotary={"dims": 4, "base": 500})
    assert m.rotary == mha.Rotary(4, 500.0)
    m.rotary = True
    assert m.rotary == mha.Rotary(8)
    m.rotary = False
    assert m.rotary is None


@pytest.mark.parametrize("make,bad,message", [
    (lambda r: mt.MultiheadAttention(18, 2, rotary=r), True, "rotary dims: 9; wanted an even number"),
    (lambda r: mt.MultiheadAttention(16, 2, rotary=r), {"dims": 10}, "rotary dims: 10; wanted an even number in"),
    (lambda r: mt.MultiheadAttention(16, 2, rotary=r), {"base": 0.5}, "rotary base: 0.5; wanted a finite"),
    (lambda r: mt.MultiHeadAttention(16, 2, 0.0, rotary=r), {"dim": 4}, "rotary: entry 'dim': 4; wanted dims"),
    (lambda r: mt.MultiHeadAttention(16, 2, 0.0, rotary=r), "yes", "rotary: 'yes' is not None, a bool"),
    (lambda r: mha.MultiHeadAttention(16, 2, rotary=r), {"interleaved": 1}, "rotary: entry 'interleaved': 1"),
    (lambda r: mha.MultiHeadAttention(16, 2, rotary=r), {"dims": 2**70}, f"rotary dims: {2**70}; wanted an even"),
    (lambda r: mt.MultiheadAttention(16, 2, rotary=r), {"base": 10**400}, "rotary base: inf; wanted a finite"),
    (lambda r: mt.MultiheadAttention(16, 2, rotary=r), {"base": float("nan")}, "rotary base: nan; wanted a finite"),
])
def test_bad_rotary_values_are_refused_with_the_operation_and_the_value(make, bad, message):
    with pytest.raises(ValueError, match="rotary") as e:
        make(bad)
    assert message in str(e.value)
    assert str(e.value).startswith("[")
