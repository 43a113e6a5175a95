"""Softcapping and ALiBi (softcap=, alibi_slopes=: FlashAttention's
arguments) on both numpy modules, held to nn.MultiheadAttention's math
written out in plain torch ops (in_proj, heads, scores / sqrt(d), then
softcap * tanh(s / softcap), then - slope_h * |i + K - Q - j|, then the
masks, softmax, out_proj) with autograd for every gradient: outputs,
per-head weights, input and parameter gradients, on every kernel, with the
window, causality, lengths and PyTorch's masks drawn beside them.

Tolerances as test_window.py: 1e-5 of the largest magnitude (2e-5 for
gradients)."""
import math

import numpy as np
import pytest
import torch

import mha

from test_multihead_masks import KERNELS, close, torch_module
from test_window import input_gradient_scale, torch_with_window, window_case
from torch_threads import one_torch_thread  # noqa: F401  (fixture)


def draw_scores(rng, h):
    """(softcap, slopes): at least one on; caps small and large, slopes of both signs."""
    while True:
        cap = [None, 0.5, 2.0, 50.0][int(rng.integers(0, 4))]
        slopes = None if rng.random() < 0.3 else (rng.standard_normal(h) * 0.6).astype(np.float32)
        if cap is not None or slopes is not None:
            return cap, slopes


def plain(t, q, k, v, attn, kpm, h, softcap, slopes):
    """nn.MultiheadAttention (batch_first) with softcap and ALiBi, in plain ops."""
    p = dict(t.named_parameters())
    E = t.embed_dim
    if "in_proj_weight" in p:
        wq, wk, wv = p["in_proj_weight"].split(E)
    else:
        wq, wk, wv = p["q_proj_weight"], p["k_proj_weight"], p["v_proj_weight"]
    bq, bk, bv = p["in_proj_bias"].split(E)
    B, Q, K, d = q.shape[0], q.shape[1], k.shape[1], E // h
    heads = lambda x, n: x.reshape(B, n, h, d).transpose(1, 2)  # noqa: E731
    qh, kh, vh = heads(q @ wq.T + bq, Q), heads(k @ wk.T + bk, K), heads(v @ wv.T + bv, K)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        dist = (torch.arange(Q)[:, None] + K - Q - torch.arange(K)[None, :]).abs().float()
        s = s - torch.from_numpy(slopes)[None, :, None, None] * dist
    s = s + attn.reshape(B, h, Q, K)
    if kpm is not None:
        s = s.masked_fill(kpm[:, None, None, :], -np.inf)
    w = torch.softmax(s, -1)
    out = (w @ vh).transpose(1, 2).reshape(B, Q, E) @ p["out_proj.weight"].T + p["out_proj.bias"]
    return out, w


def run_plain(c, softcap, slopes):
    t = torch_module(c)
    q, k, v = (torch.from_numpy(c[n]).requires_grad_() for n in ("queries", "keys", "values"))
    attn, kpm = torch_with_window(c)
    out, w = plain(t, q, k, v, attn, kpm, c["h"], softcap, slopes)
    return t, (q, k, v), out, w


def weight_grads(t, E):
    tg = dict(t.named_parameters())
    if "in_proj_weight" in tg:
        wq, wk, wv = tg["in_proj_weight"].grad.split(E)
    else:
        wq, wk, wv = (tg[f"{n}_proj_weight"].grad for n in "qkv")
    return (("W_q.weight", wq), ("W_k.weight", wk), ("W_v.weight", wv), ("W_o.weight", tg["out_proj.weight"].grad))


@pytest.mark.parametrize("index", range(24))
def test_the_chapters_module_with_softcap_and_alibi_matches_plain_torch(index, one_torch_thread):
    rng = np.random.default_rng(9700 + index)
    c = window_case(rng)
    softcap, slopes = draw_scores(rng, c["h"])
    t, inputs, want, want_w = run_plain(c, softcap, slopes)
    G = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.from_numpy(G))
    largest = input_gradient_scale(inputs)
    pairs = weight_grads(t, c["E"])
    weight_scale = np.array([max(float(g.abs().max()) for _, g in pairs)])
    for kernel in KERNELS:
        m = mha.MultiHeadAttention(c["E"], c["h"], bias=c["bias"])
        m.kernel = kernel
        m.load_state_dict(c["state"])
        out = m(c["queries"], c["keys"], c["values"], c["lens"], key_padding_mask=c["kpm"], attn_mask=c["am"],
                is_causal=c["causal"], window=c["window"], softcap=softcap, alibi_slopes=slopes)
        close(out, want.detach().numpy(), 1e-5)
        close(m.attention_weights, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv), grads = m.backward(G)
        for got, x in zip((gq, gk, gv), inputs):
            close(got, x.grad.numpy(), 2e-5, like=largest)
        for name, want_g in pairs:
            close(grads[name], want_g.numpy(), 2e-5, like=weight_scale)


@pytest.mark.parametrize("index", range(16))
def test_the_drop_in_with_softcap_and_alibi_matches_plain_torch(index, one_torch_thread):
    rng = np.random.default_rng(9800 + index)
    c = window_case(rng)
    c["lens"] = None  # the drop-in takes PyTorch's masks only
    if c["Dk"] != c["E"] or c["Dv"] != c["E"]:
        c["Dk"] = c["Dv"] = c["E"]
        c["keys"] = c["keys"][..., :c["E"]].copy()
        c["values"] = c["values"][..., :c["E"]].copy()
        for n in "kv":
            c["state"][f"W_{n}.weight"] = c["state"][f"W_{n}.weight"][:, :c["E"]].copy()
    attn, _ = torch_with_window(c)
    if torch.isinf(attn).all(-1).any():
        pytest.skip("a query without keys once the lengths are dropped")
    softcap, slopes = draw_scores(rng, c["h"])
    t, inputs, want, want_w = run_plain(c, softcap, slopes)
    G = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.from_numpy(G))
    largest = input_gradient_scale(inputs)
    state = {k: v.detach().numpy() for k, v in t.state_dict().items()}
    for kernel in KERNELS:
        ours = mha.TorchMultiheadAttention.from_state_dict(state, c["h"], batch_first=True)
        ours.kernel = kernel
        ours.train()
        out, w = ours(c["queries"], c["keys"], c["values"], key_padding_mask=c["kpm"], need_weights=True,
                      attn_mask=c["am"], average_attn_weights=False, is_causal=c["causal"], window=c["window"],
                      softcap=softcap, alibi_slopes=slopes)
        close(out, want.detach().numpy(), 1e-5)
        close(w, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv), params = ours.backward(G)
        for got, x in zip((gq, gk, gv), inputs):
            close(got, x.grad.numpy(), 2e-5, like=largest)
        close(params["out_proj.weight"], t.out_proj.weight.grad.numpy(), 2e-5)


def test_scores_alone_keep_the_chapters_fill_and_change_the_result():
    """softcap / ALiBi are not masks: with valid lengths alone the masked keys
    keep the chapter's -1e6 (a row of length 0 stays uniform), and each option
    changes the output (it is not silently ignored)."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2, 4, 8)).astype(np.float32) * 3
    lens = np.array([0, 3], np.float32)
    for kernel in KERNELS:
        m = mha.MultiHeadAttention(8, 2, seed=1)
        m.kernel = kernel
        plain_out = m(X, X, X, lens)
        for kw in ({"softcap": 0.7}, {"alibi_slopes": np.array([0.5, -0.25], np.float32)}):
            out = m(X, X, X, lens, **kw)
            assert np.abs(out - plain_out).max() > 1e-3, kw
            w = m.attention_weights
            np.testing.assert_allclose(w[0], 0.25, atol=1e-6)  # length 0: uniform over the 4 keys
            assert (w[1][..., 3] == 0).all()                     # past the length: the fill's 0


def drop_in(**kw):
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(8, 2, batch_first=True, **kw)
    return mha.TorchMultiheadAttention.from_state_dict({n: p.detach().numpy() for n, p in t.state_dict().items()}, 2,
                                                       batch_first=True)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"softcap": -1.0}, ValueError, r"softcap: -1; wanted a finite cap >= 0"),
    ({"softcap": float("nan")}, ValueError, r"softcap: nan; wanted a finite cap >= 0"),
    ({"softcap": "2"}, TypeError, r"softcap: '2' is not None or a real number"),
    ({"alibi_slopes": [0.5]}, ValueError, r"alibi_slopes: 1 slopes for 2 heads; wanted one per query head"),
    ({"alibi_slopes": [[0.5, 0.5]]}, ValueError, r"alibi_slopes: 2 dimensions; wanted one slope per head"),
    ({"alibi_slopes": [0.5, float("inf")]}, ValueError, r"alibi_slopes\[1\]: inf; wanted a finite slope"),
])
def test_bad_score_options_are_refused_naming_the_argument(kwargs, error, message):
    X = np.ones((2, 3, 8), np.float32)
    m = mha.MultiHeadAttention(8, 2)
    with pytest.raises(error, match=message):
        m(X, X, X, **kwargs)
    t = drop_in()
    with pytest.raises(error, match=message):
        t(X, X, X, **kwargs)


def test_alibi_with_appended_keys_is_refused():
    X = np.ones((2, 3, 8), np.float32)
    t = drop_in(add_bias_kv=True)
    with pytest.raises(ValueError, match=r"alibi_slopes: given with 1 appended key"):
        t(X, X, X, alibi_slopes=[0.1, 0.2])
    out, _ = t(X, X, X, softcap=5.0)  # softcap applies to every key, appended ones too
    assert np.isfinite(out).all()


@pytest.mark.parametrize("index", range(12))
def test_mha_torch_drop_in_with_softcap_and_alibi_matches_plain_torch_through_autograd(index, one_torch_thread):
    """mha.torch.MultiheadAttention(..., softcap=, alibi_slopes=): the output and the returned
    per-head weights against the plain ops, and every gradient of a loss on both."""
    import mha.torch as mt
    rng = np.random.default_rng(9900 + index)
    c = window_case(rng)
    c["lens"] = None
    E, h = c["E"], c["h"]
    if c["Dk"] != E or c["Dv"] != E:
        c["Dk"] = c["Dv"] = E
        c["keys"] = c["keys"][..., :E].copy()
        c["values"] = c["values"][..., :E].copy()
        for n in "kv":
            c["state"][f"W_{n}.weight"] = c["state"][f"W_{n}.weight"][:, :E].copy()
    attn, kpm = torch_with_window(c)
    if torch.isinf(attn).all(-1).any():
        pytest.skip("a query without keys once the lengths are dropped")
    softcap, slopes = draw_scores(rng, h)
    t = torch_module(c)
    ours = mt.MultiheadAttention(E, h, batch_first=True)
    ours.load_state_dict(t.state_dict())
    q, k, v = (torch.from_numpy(c[n]).requires_grad_() for n in ("queries", "keys", "values"))
    want, want_w = plain(t, q, k, v, attn, kpm, h, softcap, slopes)
    G, Gw = torch.randn(want.shape), torch.randn(want_w.shape)
    ((want * G).sum() + (want_w * Gw).sum()).backward()
    q2, k2, v2 = (torch.from_numpy(c[n]).requires_grad_() for n in ("queries", "keys", "values"))
    out, w = ours(q2, k2, v2, key_padding_mask=None if c["kpm"] is None else torch.from_numpy(c["kpm"]),
                  attn_mask=None if c["am"] is None else torch.from_numpy(c["am"]), average_attn_weights=False,
                  is_causal=c["causal"], window=c["window"], softcap=softcap,
                  alibi_slopes=None if slopes is None else torch.from_numpy(slopes))
    close(out.detach().numpy(), want.detach().numpy(), 1e-5)
    close(w.detach().numpy(), want_w.detach().numpy(), 1e-5)
    ((out * G).sum() + (w * Gw).sum()).backward()
    largest = input_gradient_scale((q, k, v))
    for got, x in zip((q2, k2, v2), (q, k, v)):
        close(got.grad.numpy(), x.grad.numpy(), 2e-5, like=largest)
    mine = dict(ours.named_parameters())
    for name, p in t.named_parameters():
        close(mine[name].grad.numpy(), p.grad.numpy(), 2e-5)


def test_mha_torch_refuses_slopes_that_want_a_gradient():
    import mha.torch as mt
    m = mt.MultiheadAttention(8, 2, batch_first=True)
    x = torch.ones(1, 3, 8)
    with pytest.raises(ValueError, match=r"alibi_slopes: requires grad"):
        m(x, x, x, alibi_slopes=torch.ones(2, requires_grad=True))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("softcap, slopes", [(0.6, None), (None, [0.4, -0.2, 0.1]), (5.0, [0.3, 0.3, -0.5])])
def test_cached_decoding_with_scores_equals_the_uncached_causal_call(kernel, softcap, slopes):
    """Both numpy modules and mha.torch.MultiheadAttention: a prompt then steps of 1 and 2 through a
    KV cache with softcap / ALiBi equal one uncached causal call with them (ALiBi's distances from
    each new query's position in its row), within 1e-5."""
    import mha.torch as mt
    rng = np.random.default_rng(17)
    B, L, E, h = 2, 11, 12, 3
    x = (rng.standard_normal((B, L, E)) * 2).astype(np.float32)
    sl = None if slopes is None else np.array(slopes, np.float32)
    torch.manual_seed(4)
    t = torch.nn.MultiheadAttention(E, h, batch_first=True)
    state = {n: p.detach().numpy() for n, p in t.state_dict().items()}
    m = mha.MultiHeadAttention(E, h, seed=2, bias=True).eval()
    m.kernel = kernel
    want_m = m(x, x, x, is_causal=mha.Causal.BOTTOM_RIGHT, softcap=softcap, alibi_slopes=sl)
    d = mha.TorchMultiheadAttention.from_state_dict(state, h, batch_first=True).eval()
    d.kernel = kernel
    want_d, _ = d(x, x, x, need_weights=False, is_causal=True, softcap=softcap, alibi_slopes=sl)
    tm = mt.MultiheadAttention(E, h, batch_first=True).eval()
    tm.load_state_dict(t.state_dict())
    cm, cd, ct = m.kv_cache(B, L), d.kv_cache(B, L), tm.kv_cache(B, L)
    got_m, got_d, got_t = [], [], []
    for a, b in ((0, 5), (5, 6), (6, 8), (8, 9), (9, 11)):
        s = x[:, a:b]
        got_m.append(m(s, s, s, cache=cm, softcap=softcap, alibi_slopes=sl))
        got_d.append(d(s, s, s, cache=cd, softcap=softcap, alibi_slopes=sl))
        with torch.no_grad():
            ts = torch.from_numpy(s)
            got_t.append(tm(ts, ts, ts, cache=ct, softcap=softcap, alibi_slopes=sl)[0].numpy())
    close(np.concatenate(got_m, 1), want_m, 1e-5)
    close(np.concatenate(got_d, 1), want_d, 1e-5)
    close(np.concatenate(got_t, 1), want_d, 1e-5)
    plain = m(x, x, x, is_causal=mha.Causal.BOTTOM_RIGHT)
    assert np.abs(plain - want_m).max() > 1e-3  # the options change the result
