"""Attention sinks (sinks=: one logit per head in each row's softmax
denominator, with no value, as gpt-oss's) on every module: the numpy
MultiHeadAttention and TorchMultiheadAttention (uncached and cached, and the
sinks' gradient their backward returns) and mha.torch's two modules (through
autograd), held to a float64 composition of plain torch ops: projections,
heads, scores / sqrt(d), softcap, the ALiBi bias, the masks, then a softmax
over the keys and one sink column that is dropped afterwards, out_proj.
Outputs, per-head weights and every gradient, the sinks' included, on random
shapes with odd lengths, grouped heads, sinks that dominate (+20) or vanish
(-20), with causality, windows, lengths and PyTorch's masks.

Tolerances as test_score_options.py: 1e-5 of the largest magnitude (2e-5
for gradients)."""
import math

import numpy as np
import pytest
import torch

import mha

from test_multihead_masks import KERNELS, close
from test_score_options import draw_scores
from test_window import window_case
from torch_threads import one_torch_thread  # noqa: F401  (fixture)


def draw_sinks(rng, h):
    """One logit per head: dominating (+20), negligible (-20) or ordinary."""
    return np.array([[20.0, -20.0, float(rng.uniform(-3, 3))][int(rng.integers(0, 3))] for _ in range(h)],
                    np.float32)


def case_masks(c, torch_fill):
    """(masked (B, h, Q, K) bool, additive (B, h, Q, K), fill) of a case: its attn_mask, key padding,
    causality, window and lengths. The fill is -inf where any mask is set (and always for the
    drop-in, torch_fill), else the d2l chapter's -1e6 (lengths alone)."""
    B, Q, K, h = c["B"], c["Q"], c["K"], c["h"]
    masked = np.zeros((B, h, Q, K), bool)
    add = np.zeros((B, h, Q, K), np.float64)
    am = c.get("am")
    if am is not None:
        a = np.broadcast_to(am, (B * h, Q, K)).reshape(B, h, Q, K)
        if a.dtype == bool:
            masked |= a
        else:
            add += np.where(np.isneginf(a), 0.0, a)
            masked |= np.isneginf(a)
    if c.get("kpm") is not None:
        masked |= c["kpm"][:, None, None, :]
    i, j = np.arange(Q)[:, None], np.arange(K)[None, :]
    if c.get("causal"):
        masked |= (j > i)[None, None]
    window = c.get("window")
    if window is not None:
        left, right = window
        diag = i + K - Q
        masked |= ((((left >= 0) & (j < diag - left)) | ((right >= 0) & (j > diag + right))))[None, None]
    if c.get("lens") is not None:
        lens = c["lens"] if c["lens"].ndim == 2 else np.repeat(c["lens"][:, None], Q, 1)
        masked |= (np.arange(K)[None, None, :] >= lens[:, :, None])[:, None]
    any_mask = am is not None or c.get("kpm") is not None or c.get("causal") or window is not None
    fill = -math.inf if torch_fill or any_mask else -1e6
    return torch.from_numpy(masked), torch.from_numpy(add), fill


def plain(p, q, k, v, h, hkv, masked, add, fill, softcap=None, slopes=None, sinks=None, appended=()):
    """The module in float64 plain ops. p: W_q, W_k, W_v, W_o weights and b_* biases (or None);
    q (B, Q, Dq), k, v; hkv key/value heads; masked, add, fill from case_masks (over the keys
    with the appended ones); appended: (key row, value row) pairs appended after the projections
    (nn.MultiheadAttention's bias_k / bias_v, add_zero_attn) -> (out, weights)."""
    B, Q, K = q.shape[0], q.shape[1], k.shape[1]
    d = p["W_q"].shape[0] // h

    def lin(x, n):
        y = x @ p[f"W_{n}"].T
        return y if p.get(f"b_{n}") is None else y + p[f"b_{n}"]

    def heads(x, n, m):
        return x.reshape(B, n, m, d).transpose(1, 2)

    pk, pv = lin(k, "k"), lin(v, "v")
    for rk, rv in appended:
        pk = torch.cat([pk, rk.reshape(1, 1, -1).expand(B, 1, -1)], 1)
        pv = torch.cat([pv, rv.reshape(1, 1, -1).expand(B, 1, -1)], 1)
    K = pk.shape[1]
    qh = heads(lin(q, "q"), Q, h)
    kh = heads(pk, K, hkv).repeat_interleave(h // hkv, 1)
    vh = heads(pv, K, hkv).repeat_interleave(h // hkv, 1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:  # (refused with appended keys)
        dist = (torch.arange(Q)[:, None] + K - Q - torch.arange(K)[None, :]).abs().double()
        s = s - torch.from_numpy(slopes).double()[None, :, None, None] * dist
    s = (s + add).masked_fill(masked, fill)
    if sinks is not None:
        sink = sinks.double().reshape(1, h, 1, 1).expand(B, h, Q, 1)
        w = torch.softmax(torch.cat([s, sink], -1), -1)[..., :K]
    else:
        w = torch.softmax(s, -1)
    out = lin((w @ vh).transpose(1, 2).reshape(B, Q, h * d), "o")
    return out, w


def leaves(arrays):
    return [torch.from_numpy(np.asarray(a, np.float64)).requires_grad_() for a in arrays]


def chapter_params(c):
    s = c["state"]
    names = [f"W_{n}.weight" for n in "qkvo"] + ([f"W_{n}.bias" for n in "qkvo"] if c["bias"] else [])
    ts = dict(zip(names, leaves([s[n] for n in names])))
    p = {f"W_{n}": ts[f"W_{n}.weight"] for n in "qkvo"}
    p.update({f"b_{n}": ts.get(f"W_{n}.bias") for n in "qkvo"})
    return p, ts


def with_grads(rng, want, w=None):
    G = torch.from_numpy(rng.standard_normal(tuple(want.shape)))
    loss = (want * G).sum()
    Gw = None
    if w is not None:
        Gw = torch.from_numpy(rng.standard_normal(tuple(w.shape)))
        loss = loss + (w * Gw).sum()
    loss.backward()
    return G, Gw


def scale(*ts):
    return np.array([max(float(t.grad.abs().max()) for t in ts)])


@pytest.mark.parametrize("index", range(24))
def test_the_chapters_module_with_sinks_matches_plain_torch(index, one_torch_thread):
    rng = np.random.default_rng(12000 + index)
    c = window_case(rng)
    if rng.random() < 0.4:  # sometimes lengths alone: the chapter's -1e6 fill against the sinks
        c["kpm"] = c["am"] = c["window"] = None
        c["causal"] = False
    softcap, slopes = draw_scores(rng, c["h"]) if rng.random() < 0.5 else (None, None)
    sinks = draw_sinks(rng, c["h"])
    masked, add, fill = case_masks(c, torch_fill=False)
    p, ts = chapter_params(c)
    q, k, v = leaves([c["queries"], c["keys"], c["values"]])
    s64 = torch.from_numpy(sinks.astype(np.float64)).requires_grad_()
    want, want_w = plain(p, q, k, v, c["h"], c["h"], masked, add, fill, softcap, slopes, s64)
    G, _ = with_grads(rng, want)
    for kernel in KERNELS:
        m = mha.MultiHeadAttention(c["E"], c["h"], bias=c["bias"])
        m.kernel = kernel
        m.load_state_dict(c["state"])
        out = m(c["queries"], c["keys"], c["values"], c["lens"], key_padding_mask=c["kpm"], attn_mask=c["am"],
                is_causal=c["causal"], window=c["window"], softcap=softcap, alibi_slopes=slopes, sinks=sinks)
        close(out, want.detach().numpy(), 1e-5)
        close(m.attention_weights, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv, gs), grads = m.backward(G.float().numpy())
        for got, x in zip((gq, gk, gv), (q, k, v)):
            close(got, x.grad.numpy(), 2e-5, like=scale(q, k, v))
        close(gs, s64.grad.numpy(), 2e-5)
        for name, t in ts.items():
            close(grads[name], t.grad.numpy(), 2e-5, like=scale(*ts.values()))


def drop_in_case(rng, grouped):
    """A drop-in case: equal widths (in_proj_weight), no lengths, maybe grouped heads."""
    c = window_case(rng)
    c["lens"] = None
    E, h = c["E"], c["h"]
    hkv = h
    if grouped and h > 1:
        hkv = int(rng.choice([g for g in (1, 2) if h % g == 0 and g < h]))
    d = E // h
    f32 = np.float32
    c["keys"] = c["keys"][..., :E].copy()
    c["values"] = c["values"][..., :E].copy()
    c["hkv"] = hkv
    c["w"] = {"q": rng.standard_normal((E, E)) / np.sqrt(E), "k": rng.standard_normal((hkv * d, E)) / np.sqrt(E),
              "v": rng.standard_normal((hkv * d, E)) / np.sqrt(E), "o": rng.standard_normal((E, E)) / np.sqrt(E)}
    c["w"] = {n: w.astype(f32) for n, w in c["w"].items()}
    c["b"] = {n: (rng.standard_normal(w.shape[0]) * 0.3).astype(f32) for n, w in c["w"].items()}
    c["torch_state"] = {"in_proj_weight": np.concatenate([c["w"][n] for n in "qkv"]),
                        "in_proj_bias": np.concatenate([c["b"][n] for n in "qkv"]),
                        "out_proj.weight": c["w"]["o"], "out_proj.bias": c["b"]["o"]}
    return c


def drop_in_params(c):
    names = [f"W_{n}" for n in "qkvo"] + [f"b_{n}" for n in "qkvo"]
    arrays = [c["w"][n] for n in "qkvo"] + [c["b"][n] for n in "qkvo"]
    return dict(zip(names, leaves(arrays)))


@pytest.mark.parametrize("index", range(20))
def test_the_numpy_drop_in_with_sinks_matches_plain_torch(index, one_torch_thread):
    """Grouped heads too; a query may be left with no key (every key padded): with sinks its weights
    are 0 and its output the out_proj bias, never NaN (PyTorch 1.13 gives NaN without sinks)."""
    rng = np.random.default_rng(12100 + index)
    c = drop_in_case(rng, grouped=index % 2 == 1)
    if index % 4 == 0 and c["B"] > 1:  # a batch row with every key padded
        c["kpm"] = np.zeros((c["B"], c["K"]), bool) if c["kpm"] is None else c["kpm"].copy()
        c["kpm"][-1] = True
    softcap, slopes = draw_scores(rng, c["h"]) if rng.random() < 0.5 else (None, None)
    sinks = draw_sinks(rng, c["h"])
    masked, add, fill = case_masks(c, torch_fill=True)
    p = drop_in_params(c)
    q, k, v = leaves([c["queries"], c["keys"], c["values"]])
    s64 = torch.from_numpy(sinks.astype(np.float64)).requires_grad_()
    want, want_w = plain(p, q, k, v, c["h"], c["hkv"], masked, add, fill, softcap, slopes, s64)
    G, _ = with_grads(rng, want)
    for kernel in KERNELS:
        ours = mha.TorchMultiheadAttention.from_state_dict(c["torch_state"], c["h"], batch_first=True,
                                                           num_kv_heads=c["hkv"])
        ours.kernel = kernel
        ours.train()
        out, w = ours(c["queries"], c["keys"], c["values"], key_padding_mask=c["kpm"], attn_mask=c["am"],
                      average_attn_weights=False, is_causal=c["causal"], window=c["window"], softcap=softcap,
                      alibi_slopes=slopes, sinks=sinks)
        close(out, want.detach().numpy(), 1e-5)
        close(w, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv, gs), params = ours.backward(G.float().numpy())
        for got, x in zip((gq, gk, gv), (q, k, v)):
            close(got, x.grad.numpy(), 2e-5, like=scale(q, k, v))
        close(gs, s64.grad.numpy(), 2e-5)
        close(params["out_proj.weight"], p["W_o"].grad.numpy(), 2e-5)
        close(params["in_proj_weight"], torch.cat([p[f"W_{n}"].grad for n in "qkv"]).numpy(), 2e-5,
              like=scale(p["W_q"], p["W_k"], p["W_v"]))


@pytest.mark.parametrize("index", range(12))
def test_mha_torch_drop_in_with_sinks_matches_plain_torch_through_autograd(index, one_torch_thread):
    """mha.torch.MultiheadAttention(..., sinks=nn.Parameter): the output and the returned per-head
    weights, and every gradient of a loss on both, the sinks' included."""
    import mha.torch as mt
    rng = np.random.default_rng(12200 + index)
    c = drop_in_case(rng, grouped=False)
    E, h = c["E"], c["h"]
    softcap, slopes = draw_scores(rng, h) if rng.random() < 0.5 else (None, None)
    sinks = draw_sinks(rng, h)
    masked, add, fill = case_masks(c, torch_fill=True)
    p = drop_in_params(c)
    q, k, v = leaves([c["queries"], c["keys"], c["values"]])
    s64 = torch.from_numpy(sinks.astype(np.float64)).requires_grad_()
    want, want_w = plain(p, q, k, v, h, h, masked, add, fill, softcap, slopes, s64)
    G, Gw = with_grads(rng, want, want_w)
    ours = mt.MultiheadAttention(E, h, batch_first=True)
    ours.load_state_dict({n: torch.from_numpy(a) for n, a in c["torch_state"].items()})
    sink_param = torch.nn.Parameter(torch.from_numpy(sinks.copy()))
    q2, k2, v2 = (torch.from_numpy(c[n]).requires_grad_() for n in ("queries", "keys", "values"))
    out, w = ours(q2, k2, v2, key_padding_mask=None if c["kpm"] is None else torch.from_numpy(c["kpm"]),
                  attn_mask=None if c["am"] is None else torch.from_numpy(c["am"]), average_attn_weights=False,
                  is_causal=c["causal"], window=c["window"], softcap=softcap,
                  alibi_slopes=None if slopes is None else torch.from_numpy(slopes), sinks=sink_param)
    close(out.detach().numpy(), want.detach().numpy(), 1e-5)
    close(w.detach().numpy(), want_w.detach().numpy(), 1e-5)
    ((out * G.float()).sum() + (w * Gw.float()).sum()).backward()
    for got, x in zip((q2, k2, v2), (q, k, v)):
        close(got.grad.numpy(), x.grad.numpy(), 2e-5, like=scale(q, k, v))
    close(sink_param.grad.numpy(), s64.grad.numpy(), 2e-5)
    mine = dict(ours.named_parameters())
    close(mine["out_proj.weight"].grad.numpy(), p["W_o"].grad.numpy(), 2e-5)
    close(mine["out_proj.bias"].grad.numpy(), p["b_o"].grad.numpy(), 2e-5)
    close(mine["in_proj_weight"].grad.numpy(), torch.cat([p[f"W_{n}"].grad for n in "qkv"]).numpy(), 2e-5,
          like=scale(p["W_q"], p["W_k"], p["W_v"]))


@pytest.mark.parametrize("index", range(10))
def test_mha_torch_chapter_module_with_score_options_matches_plain_torch(index, one_torch_thread):
    """mha.torch.MultiHeadAttention(..., window=, softcap=, alibi_slopes=, sinks=): output, weights
    and every gradient (the sinks' through autograd)."""
    import mha.torch as mt
    rng = np.random.default_rng(12300 + index)
    c = window_case(rng)
    c["kpm"] = c["am"] = None  # the chapter's module takes lengths, not PyTorch's masks
    c["causal"] = False
    if rng.random() < 0.3:
        c["window"] = None
    softcap, slopes = draw_scores(rng, c["h"]) if rng.random() < 0.6 else (None, None)
    sinks = draw_sinks(rng, c["h"]) if rng.random() < 0.8 else None
    masked, add, fill = case_masks(c, torch_fill=False)
    p, ts = chapter_params(c)
    q, k, v = leaves([c["queries"], c["keys"], c["values"]])
    s64 = None if sinks is None else torch.from_numpy(sinks.astype(np.float64)).requires_grad_()
    want, want_w = plain(p, q, k, v, c["h"], c["h"], masked, add, fill, softcap, slopes, s64)
    G, _ = with_grads(rng, want)
    m = mt.MultiHeadAttention(c["E"], c["h"], 0.0, bias=c["bias"])
    m(torch.from_numpy(c["queries"]), torch.from_numpy(c["keys"]), torch.from_numpy(c["values"]))  # lazy widths
    m.load_state_dict({n: torch.from_numpy(a) for n, a in c["state"].items()})
    sink_param = None if sinks is None else torch.nn.Parameter(torch.from_numpy(sinks.copy()))
    q2, k2, v2 = (torch.from_numpy(c[n]).requires_grad_() for n in ("queries", "keys", "values"))
    out = m(q2, k2, v2, None if c["lens"] is None else torch.from_numpy(c["lens"]), window=c["window"],
            softcap=softcap, alibi_slopes=slopes, sinks=sink_param)
    close(out.detach().numpy(), want.detach().numpy(), 1e-5)
    close(m.attention_weights.numpy(), want_w.detach().numpy(), 1e-5)
    (out * G.float()).sum().backward()
    for got, x in zip((q2, k2, v2), (q, k, v)):
        close(got.grad.numpy(), x.grad.numpy(), 2e-5, like=scale(q, k, v))
    if sinks is not None:
        close(sink_param.grad.numpy(), s64.grad.numpy(), 2e-5)
    mine = dict(m.named_parameters())
    for name, t in ts.items():
        close(mine[name].grad.numpy(), t.grad.numpy(), 2e-5, like=scale(*ts.values()))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("with_scores", [False, True])
def test_cached_decoding_with_sinks_equals_the_uncached_causal_call(kernel, with_scores, one_torch_thread):
    """Every module: a prompt then steps of 1 and 2 through a KV cache with sinks (and softcap, ALiBi
    and a window beside them) equal one uncached causal call, within 1e-5."""
    import mha.torch as mt
    rng = np.random.default_rng(31)
    B, L, E, h = 2, 11, 12, 3
    x = (rng.standard_normal((B, L, E)) * 2).astype(np.float32)
    sinks = np.array([20.0, -20.0, 0.7], np.float32)
    kw = dict(sinks=sinks)
    if with_scores:
        kw.update(softcap=3.0, alibi_slopes=np.array([0.3, -0.1, 0.2], np.float32), window=(4, 0))
    torch.manual_seed(4)
    t = torch.nn.MultiheadAttention(E, h, batch_first=True)
    state = {n: p.detach().numpy() for n, p in t.state_dict().items()}
    m = mha.MultiHeadAttention(E, h, seed=2, bias=True).eval()
    m.kernel = kernel
    want_m = m(x, x, x, is_causal=mha.Causal.BOTTOM_RIGHT, **kw)
    d = mha.TorchMultiheadAttention.from_state_dict(state, h, batch_first=True).eval()
    d.kernel = kernel
    want_d, _ = d(x, x, x, need_weights=False, is_causal=True, **kw)
    tm = mt.MultiheadAttention(E, h, batch_first=True).eval()
    tm.load_state_dict(t.state_dict())
    tm.kernel = kernel
    tc = mt.MultiHeadAttention(E, h, 0.0, bias=True).eval()
    tc(torch.from_numpy(x), torch.from_numpy(x), torch.from_numpy(x))
    tc.load_state_dict({n: torch.from_numpy(a) for n, a in m.state_dict().items()})
    tc.kernel = kernel
    tkw = dict(kw, sinks=torch.from_numpy(sinks))
    cm, cd, ct, cc = m.kv_cache(B, L), d.kv_cache(B, L), tm.kv_cache(B, L), tc.kv_cache(B, L)
    got = {n: [] for n in "mdtc"}
    for a, b in ((0, 5), (5, 6), (6, 8), (8, 9), (9, 11)):
        s = x[:, a:b]
        got["m"].append(m(s, s, s, cache=cm, **kw))
        got["d"].append(d(s, s, s, cache=cd, **kw))
        with torch.no_grad():
            ts = torch.from_numpy(s)
            got["t"].append(tm(ts, ts, ts, cache=ct, **tkw)[0].numpy())
            got["c"].append(tc(ts, ts, ts, cache=cc, **tkw).numpy())
    close(np.concatenate(got["m"], 1), want_m, 1e-5)
    close(np.concatenate(got["c"], 1), want_m, 1e-5)
    close(np.concatenate(got["d"], 1), want_d, 1e-5)
    close(np.concatenate(got["t"], 1), want_d, 1e-5)
    without = dict(kw)
    del without["sinks"]
    assert np.abs(m(x, x, x, is_causal=mha.Causal.BOTTOM_RIGHT, **without) - want_m).max() > 1e-3


@pytest.mark.parametrize("bias_kv, zero_attn", [(True, False), (False, True), (True, True)])
def test_sinks_with_appended_keys_match_plain_torch(bias_kv, zero_attn, one_torch_thread):
    """Sinks are per head, not per key: with bias_k / bias_v and add_zero_attn (refused for ALiBi)
    they join the softmax beside the appended keys, forward and every gradient."""
    rng = np.random.default_rng(5 if bias_kv else 6)
    B, Q, K, E, h = 2, 5, 7, 8, 2
    f32 = np.float32
    x = [rng.standard_normal((B, n, E)).astype(f32) for n in (Q, K, K)]
    w = {n: (rng.standard_normal((E, E)) / np.sqrt(E)).astype(f32) for n in "qkvo"}
    b = {n: (rng.standard_normal(E) * 0.3).astype(f32) for n in "qkvo"}
    state = {"in_proj_weight": np.concatenate([w[n] for n in "qkv"]),
             "in_proj_bias": np.concatenate([b[n] for n in "qkv"]), "out_proj.weight": w["o"],
             "out_proj.bias": b["o"]}
    rows = []
    if bias_kv:
        state["bias_k"] = rng.standard_normal((1, 1, E)).astype(f32)
        state["bias_v"] = rng.standard_normal((1, 1, E)).astype(f32)
        rows.append(tuple(leaves([state["bias_k"].reshape(E), state["bias_v"].reshape(E)])))
    if zero_attn:
        rows.append((torch.zeros(E, dtype=torch.float64), torch.zeros(E, dtype=torch.float64)))
    kpm = rng.random((B, K)) < 0.3
    kpm[1] = True  # every given key padded: the appended ones remain
    Kt = K + len(rows)
    masked = torch.from_numpy(np.concatenate([kpm, np.zeros((B, len(rows)), bool)], 1)[:, None, None, :]
                              .repeat(h, 1).repeat(Q, 2))
    sinks = np.array([1.5, -0.5], f32)
    names = [f"W_{n}" for n in "qkvo"] + [f"b_{n}" for n in "qkvo"]
    p = dict(zip(names, leaves([w[n] for n in "qkvo"] + [b[n] for n in "qkvo"])))
    q, k, v = leaves(x)
    s64 = torch.from_numpy(sinks.astype(np.float64)).requires_grad_()
    want, want_w = plain(p, q, k, v, h, h, masked, torch.zeros(B, h, Q, Kt, dtype=torch.float64), -math.inf,
                         sinks=s64, appended=rows)
    G, _ = with_grads(rng, want)
    for kernel in KERNELS:
        ours = mha.TorchMultiheadAttention.from_state_dict(state, h, batch_first=True, add_zero_attn=zero_attn)
        ours.kernel = kernel
        ours.train()
        out, wts = ours(*x, key_padding_mask=kpm, average_attn_weights=False, sinks=sinks)
        close(out, want.detach().numpy(), 1e-5)
        close(wts, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv, gs), params = ours.backward(G.float().numpy())
        for got, t in zip((gq, gk, gv), (q, k, v)):
            close(got, t.grad.numpy(), 2e-5, like=scale(q, k, v))
        close(gs, s64.grad.numpy(), 2e-5)
        if bias_kv:
            close(params["bias_k"].reshape(E), rows[0][0].grad.numpy(), 2e-5, like=scale(p["W_k"]))
            close(params["bias_v"].reshape(E), rows[0][1].grad.numpy(), 2e-5)


def test_a_learned_sink_trains_with_an_optimiser(one_torch_thread):
    """The docstring's pattern: an nn.Parameter passed per call gets a gradient and an optimiser moves
    it; pruned heads' sinks get a zero gradient."""
    import mha.torch as mt
    torch.manual_seed(0)
    attn = mt.MultiheadAttention(8, 4, batch_first=True)
    sinks = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([sinks], lr=0.5)
    x = torch.randn(2, 5, 8)
    out, _ = attn(x, x, x, is_causal=True, sinks=sinks)
    out.pow(2).sum().backward()
    assert sinks.grad is not None and sinks.grad.abs().min() > 0
    before = sinks.detach().clone()
    opt.step()
    assert not torch.equal(before, sinks.detach())
    attn.prune_heads([1])
    sinks.grad = None
    out, _ = attn(x, x, x, is_causal=True, sinks=sinks)
    out.pow(2).sum().backward()
    assert sinks.grad[1] == 0 and sinks.grad[[0, 2, 3]].abs().min() > 0


BAD = [
    ({"sinks": [0.5]}, ValueError, r"sinks: 1 logits for 2 heads; wanted one per query head"),
    ({"sinks": [[0.5, 0.5]]}, ValueError, r"sinks: 2 dimensions; wanted one logit per head"),
    ({"sinks": [0.5, float("nan")]}, ValueError, r"sinks\[1\]: nan; wanted a finite logit"),
    ({"sinks": [0.5, float("-inf")]}, ValueError, r"sinks\[1\]: -inf; wanted a finite logit"),
    ({"sinks": "ab"}, TypeError, r"sinks"),
]


@pytest.mark.parametrize("kwargs, error, message", BAD)
def test_bad_sinks_are_refused_naming_the_argument_on_every_module(kwargs, error, message):
    import mha.torch as mt
    X = np.ones((2, 3, 8), np.float32)
    m = mha.MultiHeadAttention(8, 2)
    with pytest.raises(error, match=message):
        m(X, X, X, **kwargs)
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    d = mha.TorchMultiheadAttention.from_state_dict({n: p.detach().numpy() for n, p in t.state_dict().items()}, 2,
                                                    batch_first=True)
    with pytest.raises(error, match=message):
        d(X, X, X, **kwargs)
    m.eval()
    with pytest.raises(error, match=message):
        m(X, X, X, cache=m.kv_cache(2, 3), **kwargs)
    tx = torch.from_numpy(X)
    tkw = {n: (torch.tensor(a) if not isinstance(a, str) else a) for n, a in kwargs.items()}
    with pytest.raises(error, match=message):
        mt.MultiheadAttention(8, 2, batch_first=True)(tx, tx, tx, **tkw)
    with pytest.raises(error, match=message):
        mt.MultiHeadAttention(8, 2, 0.0)(tx, tx, tx, **tkw)


def test_mha_torch_cached_calls_refuse_sinks_that_want_a_gradient():
    import mha.torch as mt
    attn = mt.MultiheadAttention(8, 2, batch_first=True).eval()
    cache = attn.kv_cache(1, 4)
    x = torch.ones(1, 2, 8)
    with pytest.raises(ValueError, match=r"cache: cached calls have no backward"):
        attn(x, x, x, cache=cache, sinks=torch.nn.Parameter(torch.zeros(2)))
    with torch.no_grad():  # decoding with a learned sink: under no_grad, as every cached call
        out, _ = attn(x, x, x, cache=cache, sinks=torch.nn.Parameter(torch.zeros(2)))
    assert torch.isfinite(out).all()


def test_the_backward_of_a_kept_context_returns_the_sinks_gradient_too():
    """backward(context, grad) of both numpy modules: four input gradients for a call with sinks (the
    same as backward(grad) of that call), three for one without."""
    rng = np.random.default_rng(8)
    X = rng.standard_normal((2, 5, 8)).astype(np.float32)
    G = rng.standard_normal((2, 5, 8)).astype(np.float32)
    sinks = np.array([0.3, -1.0], np.float32)
    m = mha.MultiHeadAttention(8, 2, seed=1)
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    d = mha.TorchMultiheadAttention.from_state_dict({n: p.detach().numpy() for n, p in t.state_dict().items()}, 2,
                                                    batch_first=True)
    for module, call in ((m, lambda **kw: m.forward_with_context(X, X, X, is_causal=True, **kw)),
                         (d, lambda **kw: d.forward_with_context(X, X, X, is_causal=True, **kw)[::2])):
        _, ctx = call(sinks=sinks)
        _, ctx_plain = call()
        module(X, X, X, is_causal=True, sinks=sinks)
        (_, _, _, want), _ = module.backward(G)
        grads, _ = module.backward(ctx, G)
        assert len(grads) == 4
        np.testing.assert_array_equal(grads[3], want)
        assert np.abs(want).max() > 0
        grads, _ = module.backward(ctx_plain, G)
        assert len(grads) == 3
