"""Sliding windows (window=(left, right), FlashAttention's window_size
convention, aligned to the bottom right: query i of Q sees key j of K iff
i + K - Q - left <= j <= i + K - Q + right, -1 unbounded) on both numpy
modules, held to PyTorch 1.13's nn.MultiheadAttention with the same weights
and the window written as a boolean attn_mask: outputs, per-head weights and
every gradient (inputs and parameters), on every kernel, with the other
masks, causality and valid lengths drawn beside it.

Tolerances as test_multihead_masks.py: 1e-5 of the largest magnitude (2e-5
for gradients)."""
import numpy as np
import pytest
import torch

import mha

from test_multihead_masks import KERNELS, close, draw, torch_masks, torch_module
from torch_threads import one_torch_thread  # noqa: F401  (fixture)


def band(Q, K, left, right):
    """(Q, K) True where query i sees key j, as the convention reads."""
    i = np.arange(Q)[:, None]
    j = np.arange(K)[None, :]
    diag = i + K - Q
    return ((left < 0) | (j >= diag - left)) & ((right < 0) | (j <= diag + right))


def draw_window(rng, Q, K):
    def side():
        return int(rng.choice([-1, 0, 1, 2, 3, K + Q + 2, int(rng.integers(0, K + 1))]))
    w = (side(), side())
    while w == (-1, -1):
        w = (side(), side())
    return w


def window_case(rng):
    """A case of test_multihead_masks.draw with a window whose every query
    keeps a key (PyTorch 1.13 gives NaN for a query with none)."""
    for _ in range(200):
        c = draw(rng)
        c["window"] = draw_window(rng, c["Q"], c["K"])
        attn, kpm = torch_with_window(c)
        masked = torch.isinf(attn).numpy()
        if kpm is not None:
            masked = masked | np.repeat(kpm.numpy()[:, None, :], c["h"], 0)
        if not masked.all(-1).any():
            return c
    raise AssertionError("no case without an empty row")


def torch_with_window(c):
    attn, kpm = torch_masks(c)
    outside = ~band(c["Q"], c["K"], *c["window"])
    attn = attn.masked_fill(torch.from_numpy(outside)[None], -np.inf)
    return attn, kpm


def input_gradient_scale(inputs):
    """The largest input gradient element: the scale of the input gradients.
    (A window leaves queries few keys, whose gradient then cancels to well
    under the others' size; float32 rounding is relative to the terms.)"""
    return np.array([max(float(x.grad.abs().max()) for x in inputs)])


def run_torch(c):
    t = torch_module(c)
    q, k, v = (torch.from_numpy(c[n]).requires_grad_() for n in ("queries", "keys", "values"))
    attn, kpm = torch_with_window(c)
    out, w = t(q, k, v, key_padding_mask=kpm, attn_mask=attn, need_weights=True, average_attn_weights=False)
    return t, (q, k, v), out, w


@pytest.mark.parametrize("index", range(30))
def test_the_chapters_module_with_a_window_matches_torch(index, one_torch_thread):
    rng = np.random.default_rng(9300 + index)
    c = window_case(rng)
    t, inputs, want, want_w = run_torch(c)
    G = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.from_numpy(G))
    largest = input_gradient_scale(inputs)
    tg = dict(t.named_parameters())
    E = c["E"]
    for kernel in KERNELS:
        m = mha.MultiHeadAttention(E, c["h"], bias=c["bias"])
        m.kernel = kernel
        m.load_state_dict(c["state"])
        out = m(c["queries"], c["keys"], c["values"], c["lens"], key_padding_mask=c["kpm"],
                attn_mask=c["am"], is_causal=c["causal"], window=c["window"])
        close(out, want.detach().numpy(), 1e-5)
        close(m.attention_weights, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv), grads = m.backward(G)
        for got, x in zip((gq, gk, gv), inputs):
            close(got, x.grad.numpy(), 2e-5, like=largest)
        if "in_proj_weight" in tg:
            wq, wk, wv = tg["in_proj_weight"].grad.split(E)
        else:
            wq, wk, wv = (tg[f"{n}_proj_weight"].grad for n in "qkv")
        pairs = (("W_q.weight", wq), ("W_k.weight", wk), ("W_v.weight", wv),
                 ("W_o.weight", tg["out_proj.weight"].grad))
        weight_scale = np.array([max(float(g.abs().max()) for _, g in pairs)])
        for name, want_g in pairs:
            close(grads[name], want_g.numpy(), 2e-5, like=weight_scale)


@pytest.mark.parametrize("index", range(20))
def test_the_drop_in_with_a_window_matches_torch(index, one_torch_thread):
    rng = np.random.default_rng(9400 + index)
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
    t, inputs, want, want_w = run_torch(c)
    G = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.from_numpy(G))
    largest = input_gradient_scale(inputs)
    state = {k: v.detach().numpy() for k, v in t.state_dict().items()}
    for kernel in KERNELS:
        ours = mha.TorchMultiheadAttention.from_state_dict(state, c["h"], batch_first=True)
        ours.kernel = kernel
        ours.train()
        out, w = ours(c["queries"], c["keys"], c["values"], key_padding_mask=c["kpm"], need_weights=True,
                      attn_mask=c["am"], average_attn_weights=False, is_causal=c["causal"], window=c["window"])
        close(out, want.detach().numpy(), 1e-5)
        close(w, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv), params = ours.backward(G)
        for got, x in zip((gq, gk, gv), inputs):
            close(got, x.grad.numpy(), 2e-5, like=largest)
        close(params["out_proj.weight"], t.out_proj.weight.grad.numpy(), 2e-5)


def test_window_sides_are_checked_naming_the_argument():
    X = np.ones((2, 3, 8), np.float32)
    m = mha.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward\] window: \(-2, 0\) has a side below -1"):
        m(X, X, X, window=(-2, 0))
    with pytest.raises(TypeError, match=r"window: 3 is not None or a pair"):
        m(X, X, X, window=3)
    with pytest.raises(TypeError, match=r"window: \(1, 2, 3\) is not None or a pair"):
        m(X, X, X, window=(1, 2, 3))
    assert m.state_dict() == {}  # a refused call changes nothing


def test_a_window_wider_than_the_keys_changes_nothing_and_width_zero_is_the_diagonal():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2, 5, 8)).astype(np.float32)
    Y = rng.standard_normal((2, 7, 8)).astype(np.float32)
    for kernel in KERNELS:
        m = mha.MultiHeadAttention(8, 2, seed=3)
        m.kernel = kernel
        plain = m(X, Y, Y)
        np.testing.assert_array_equal(m(X, Y, Y, window=(100, 100)), plain)
        np.testing.assert_array_equal(m(X, Y, Y, window=(-1, -1)), plain)
        m(X, Y, Y, window=(0, 0))
        w = m.attention_weights  # (B, h, Q, K): all weight on key i + K - Q
        want = np.zeros((5, 7))
        want[np.arange(5), np.arange(5) + 2] = 1.0
        np.testing.assert_allclose(w, np.broadcast_to(want, w.shape), atol=1e-6)


@pytest.mark.parametrize("window", [(0, 0), (2, -1), (-1, 1), (1, 3), (50, 0)])
def test_appended_keys_stay_visible_and_the_window_counts_the_given_keys(window, one_torch_thread):
    """With bias_k / bias_v and add_zero_attn the appended keys are always
    visible (PyTorch pads attn_mask with 'takes part' for them) and the
    window is aligned on the S given keys, as causal is."""
    torch.manual_seed(11)
    B, L, S, E, h = 2, 5, 7, 8, 2
    t = torch.nn.MultiheadAttention(E, h, add_bias_kv=True, add_zero_attn=True, batch_first=True)
    q, k, v = (torch.randn(B, n, E, requires_grad=True) for n in (L, S, S))
    attn = torch.zeros(L, S).masked_fill(torch.from_numpy(~band(L, S, *window)), -np.inf)
    want, want_w = t(q, k, v, attn_mask=attn, need_weights=True, average_attn_weights=False)
    G = torch.randn(want.shape)
    want.backward(G)
    state = {n: p.detach().numpy() for n, p in t.state_dict().items()}
    for kernel in KERNELS:
        ours = mha.TorchMultiheadAttention.from_state_dict(state, h, batch_first=True, add_zero_attn=True)
        ours.kernel = kernel
        ours.train()
        out, w = ours(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), need_weights=True,
                      average_attn_weights=False, window=window)
        close(out, want.detach().numpy(), 1e-5)
        close(w, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv), params = ours.backward(G.numpy())
        largest = input_gradient_scale((q, k, v))
        for got, x in zip((gq, gk, gv), (q, k, v)):
            close(got, x.grad.numpy(), 2e-5, like=largest)


@pytest.mark.parametrize("window", [(0, 0), (1, -1), (3, 0), (5, 2), (40, -1)])
@pytest.mark.parametrize("module", ["chapter", "drop-in"])
def test_cached_calls_with_a_window_are_the_uncached_causal_call(window, module, one_torch_thread):
    """Cached decoding with a window (a prefill, single steps, then a block
    of three) gives the rows of one uncached causal call with the same window
    over the whole sequence, whose path test_*_matches_torch hold to torch;
    ragged rows (one row rewound) keep each row's own positions. float32
    cache, 1e-5 of the largest output."""
    rng = np.random.default_rng(sum(window) + 7 * (module == "chapter"))
    B, E, H, P = 2, 16, 2, 6
    if module == "chapter":
        m = mha.MultiHeadAttention(E, H, bias=True, seed=5)
    else:
        t = torch.nn.MultiheadAttention(E, H, batch_first=True)
        m = mha.TorchMultiheadAttention.from_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()},
                                                        H, batch_first=True)
    m.eval()
    steps = [1, 1, 3, 1]
    cache = m.kv_cache(B, P + sum(steps))
    X = rng.standard_normal((B, P + sum(steps), E)).astype(np.float32)
    got = [m(X[:, :P], X[:, :P], X[:, :P], cache=cache, window=window)]
    cache.truncate(1, P - 2)  # row 1 forgets its last two prompt positions
    rows1 = list(range(P - 2))
    rows1_got = [got[0][1, :P - 2]]
    t = P
    for n in steps:
        x = X[:, t:t + n]
        out = m(x, x, x, cache=cache, window=window)
        got.append(out)
        rows1_got.append(out[1])
        rows1 += list(range(t, t + n))
        t += n

    def uncached(seq):
        if module == "chapter":
            return m(seq, seq, seq, is_causal=True, window=window)
        return m(seq, seq, seq, need_weights=False, is_causal=True, window=window)[0]

    want0 = uncached(X[:1])[0]
    got0 = np.concatenate([g[0] for g in got])
    np.testing.assert_allclose(got0, want0, atol=1e-5 * np.abs(want0).max(), rtol=0)
    seq1 = X[1:2, rows1]
    want1 = uncached(seq1)[0]
    got1 = np.concatenate(rows1_got)
    np.testing.assert_allclose(got1, want1, atol=1e-5 * np.abs(want1).max(), rtol=0)


@pytest.mark.parametrize("left", [0, 3, 20])
@pytest.mark.parametrize("module", ["chapter", "drop-in", "mha.torch"])
def test_a_ring_cache_decodes_a_long_sequence_as_the_uncached_windowed_call(left, module, one_torch_thread):
    """A ring-buffer cache (kv_cache(B, max_len, window=left): left + max_len
    slots) over a sequence many times longer than its slots, in steps of one
    and of max_len positions, gives the rows of one uncached causal call with
    window (left, 0) over the whole sequence, 1e-5 of the largest output;
    its memory stays that of its slots and its lengths count positions."""
    rng = np.random.default_rng(left + 3)
    B, E, H, L, max_len = 2, 16, 2, 120, 3
    t = torch.nn.MultiheadAttention(E, H, batch_first=True)
    state = {k: v.detach().numpy() for k, v in t.state_dict().items()}
    if module == "chapter":
        m = mha.MultiHeadAttention(E, H, bias=True, seed=5)
    elif module == "drop-in":
        m = mha.TorchMultiheadAttention.from_state_dict(state, H, batch_first=True)
    else:
        m = mha.torch.MultiheadAttention(E, H, batch_first=True)
        m.load_state_dict(t.state_dict())
    m.eval()
    X = rng.standard_normal((B, L, E)).astype(np.float32)
    window = (left, 0)
    if module == "chapter":
        want = m(X, X, X, is_causal=True, window=window)
    elif module == "drop-in":
        want = m(X, X, X, need_weights=False, is_causal=True, window=window)[0]
    else:
        with torch.no_grad():
            want = m(torch.from_numpy(X), torch.from_numpy(X), torch.from_numpy(X), need_weights=False,
                     is_causal=True, window=window)[0].numpy()
    cache = m.kv_cache(B, max_len, window=left)
    assert cache.capacity == left + max_len and cache.window == left
    nbytes = cache.storage_bytes
    got, pos, step = [], 0, 0
    while pos < L:
        n = min(L - pos, max_len if step % 3 == 0 else 1)
        x = X[:, pos:pos + n]
        if module == "chapter":
            out = m(x, x, x, cache=cache, window=window)
        elif module == "drop-in":
            out = m(x, x, x, cache=cache, window=window)  # the numpy drop-in's cached call: the output alone
        else:
            with torch.no_grad():
                xt = torch.from_numpy(np.ascontiguousarray(x))
                out = m(xt, xt, xt, cache=cache, window=window)[0].numpy()
        got.append(out)
        pos += n
        step += 1
    got = np.concatenate(got, axis=1)
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=0)
    assert cache.lengths == [L, L] and cache.storage_bytes == nbytes


def test_a_ring_cache_refuses_a_wider_window_and_longer_steps():
    m = mha.MultiHeadAttention(8, 2, bias=True, seed=1)
    m.eval()
    cache = m.kv_cache(1, 2, window=3)
    x1, x3 = np.ones((1, 1, 8), np.float32), np.ones((1, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"window: left side 4 with a ring cache made for window 3"):
        m(x1, x1, x1, cache=cache, window=(4, 0))
    with pytest.raises(ValueError, match=r"cache: 3 new positions in one call; a ring cache made for window 3"):
        m(x3, x3, x3, cache=cache, window=(3, 0))
    assert cache.lengths == [0]


def test_a_cached_window_side_below_minus_one_is_refused():
    t = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    m = mha.TorchMultiheadAttention.from_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()},
                                                    2, batch_first=True)
    m.eval()
    cache = m.kv_cache(1, 4)
    x = np.ones((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[TorchMultiheadAttention.forward\] window: \(-2, 0\) has a side below -1"):
        m(x, x, x, cache=cache, window=(-2, 0))
    assert cache.lengths == [0]  # a refused call leaves the cache as it was


@pytest.mark.parametrize("seed", range(12))
def test_mha_torch_drop_in_with_a_window_matches_torch(seed, one_torch_thread):
    """mha.torch.MultiheadAttention(window=...) through autograd against torch's
    nn.MultiheadAttention with the band as a boolean attn_mask (intersected
    with causal when drawn): output, differentiable weights, input and
    parameter gradients, with and without appended keys (bias_k/bias_v,
    add_zero_attn: the window counts the given keys, as torch pads
    attn_mask); a window is a keyword of forward, as cache= is."""
    import mha.torch as mt
    rng = np.random.default_rng(100 + seed)
    B, L, S, E, H = int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 11)), 12, 3
    causal = bool(seed % 2)
    for _ in range(100):
        window = draw_window(rng, L, S)
        keep = band(L, S, *window)
        if causal:
            keep &= np.arange(S)[None, :] <= np.arange(L)[:, None]  # is_causal=True: top left, as torch
        if keep.any(-1).all():
            break
    else:
        pytest.skip("no window keeping a key for every query")
    torch.manual_seed(seed)
    appended = seed % 3 == 0  # bias_k/bias_v and a zero key: appended keys stay visible
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=appended, add_zero_attn=appended)
    ours = mt.MultiheadAttention(E, H, batch_first=True, add_bias_kv=appended, add_zero_attn=appended)
    ours.load_state_dict(ref.state_dict())
    q = torch.randn(B, L, E, requires_grad=True)
    kv = torch.randn(B, S, E, requires_grad=True)
    q2, kv2 = q.detach().clone().requires_grad_(), kv.detach().clone().requires_grad_()
    want, want_w = ref(q, kv, kv, attn_mask=torch.from_numpy(~keep), average_attn_weights=False)
    got, got_w = ours(q2, kv2, kv2, average_attn_weights=False, is_causal=causal, window=window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=0)
    G = torch.randn_like(want)
    Gw = torch.randn_like(want_w)
    ((want * G).sum() + (want_w * Gw).sum()).backward()
    ((got * G).sum() + (got_w * Gw).sum()).backward()
    scale = max(float(t.grad.abs().max()) for t in (q, kv))
    for a, b in ((q2, q), (kv2, kv)):
        torch.testing.assert_close(a.grad, b.grad, atol=2e-5 * scale, rtol=0)
    pscale = max(float(p.grad.abs().max()) for p in ref.parameters())
    for (n, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=2e-5 * pscale, rtol=0, msg=n)


def test_mha_torch_cached_calls_take_a_window(one_torch_thread):
    """mha.torch.MultiheadAttention's cached call with window= gives the rows of
    its uncached causal call with that window."""
    import mha.torch as mt
    torch.manual_seed(3)
    m = mt.MultiheadAttention(16, 4, batch_first=True).eval()
    X = torch.randn(2, 9, 16)
    cache = m.kv_cache(2, 9)
    with torch.no_grad():
        want = m(X, X, X, need_weights=False, is_causal=True, window=(2, 0))[0]
        got = torch.cat([m(X[:, :4], X[:, :4], X[:, :4], cache=cache, window=(2, 0))[0]] +
                        [m(X[:, t:t + 1], X[:, t:t + 1], X[:, t:t + 1], cache=cache, window=(2, 0))[0]
                         for t in range(4, 9)], 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
