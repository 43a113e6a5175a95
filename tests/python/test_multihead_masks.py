"""nn.MultiheadAttention's masks on the d2l chapter's MultiHeadAttention (the
one engine under both modules gives the chapter's module every mask the
drop-in has): key_padding_mask, attn_mask (2-D and per head, boolean and
additive), causal masking and valid_lens together, held to PyTorch 1.13's
nn.MultiheadAttention with the same weights: outputs, per-head weights and
gradients (inputs and parameters), on every kernel.

Tolerances: float32 against float32, 1e-5 relative to the largest magnitude
(2e-5 for gradients, which add more terms)."""
import numpy as np
import pytest
import torch

import mha

from torch_threads import one_torch_thread  # noqa: F401  (fixture)

KERNELS = [mha.Kernel.FUSED, mha.Kernel.BLAS, mha.Kernel.REFERENCE]


def draw(rng):
    B, Q, K = rng.integers(1, 4), rng.integers(1, 7), rng.integers(1, 9)
    h, d = int(rng.choice([1, 2, 4])), int(rng.choice([2, 3, 8]))
    E = h * d
    Dk = int(rng.choice([E, E + 3]))
    Dv = Dk if rng.random() < 0.5 else int(rng.choice([E, E + 5]))
    bias = bool(rng.random() < 0.5)
    c = dict(B=B, Q=Q, K=K, h=h, E=E, Dk=Dk, Dv=Dv, bias=bias)
    f32 = np.float32
    c["queries"] = rng.standard_normal((B, Q, E)).astype(f32)
    c["keys"] = rng.standard_normal((B, K, Dk)).astype(f32)
    c["values"] = rng.standard_normal((B, K, Dv)).astype(f32)
    c["state"] = {f"W_{n}.weight": (rng.standard_normal((E, w)) / np.sqrt(w)).astype(f32)
                  for n, w in (("q", E), ("k", Dk), ("v", Dv), ("o", E))}
    if bias:
        c["state"].update({f"W_{n}.bias": rng.standard_normal(E).astype(f32) * 0.3 for n in "qkvo"})
    # Key 0 is never masked, so no query is left without a key (PyTorch
    # 1.13 gives NaN there; mha's policy is tested apart below).
    kind = rng.integers(0, 3)
    c["kpm"] = None
    if kind == 1:
        c["kpm"] = rng.random((B, K)) < 0.4
        c["kpm"][:, 0] = False
    am_kind = rng.integers(0, 5)
    c["am"] = None
    if am_kind == 1:
        c["am"] = rng.random((Q, K)) < 0.4
    elif am_kind == 2:
        c["am"] = np.where(rng.random((Q, K)) < 0.3, -np.inf, rng.standard_normal((Q, K))).astype(f32)
    elif am_kind == 3:
        c["am"] = rng.random((B * h, Q, K)) < 0.4
    elif am_kind == 4:
        c["am"] = (rng.standard_normal((B * h, Q, K)) * 2).astype(f32)
    if c["am"] is not None:
        c["am"][..., 0] = False if c["am"].dtype == bool else 0.0
    c["causal"] = bool(rng.random() < 0.3)
    lens_kind = rng.integers(0, 3)
    c["lens"] = None
    if lens_kind == 1:
        c["lens"] = rng.integers(1, K + 1, size=B).astype(f32)
    elif lens_kind == 2:
        c["lens"] = rng.integers(1, K + 1, size=(B, Q)).astype(f32)
    return c


def torch_module(c):
    E, Dk, Dv = c["E"], c["Dk"], c["Dv"]
    t = torch.nn.MultiheadAttention(E, c["h"], bias=True, kdim=Dk, vdim=Dv, batch_first=True)
    s = {k: torch.from_numpy(v) for k, v in c["state"].items()}
    zero = torch.zeros(E)
    st = {"out_proj.weight": s["W_o.weight"], "out_proj.bias": s.get("W_o.bias", zero)}
    b = torch.cat([s.get(f"W_{n}.bias", zero) for n in "qkv"])
    st["in_proj_bias"] = b
    if Dk == E and Dv == E:
        st["in_proj_weight"] = torch.cat([s["W_q.weight"], s["W_k.weight"], s["W_v.weight"]])
    else:
        st.update({"q_proj_weight": s["W_q.weight"], "k_proj_weight": s["W_k.weight"],
                   "v_proj_weight": s["W_v.weight"]})
    t.load_state_dict(st)
    return t


def torch_masks(c):
    """The case's masks, valid lengths and causality as the one attn_mask and
    key_padding_mask PyTorch takes (True or -inf = masked out)."""
    B, Q, K, h = c["B"], c["Q"], c["K"], c["h"]
    out = np.zeros((B * h, Q, K), bool)  # masked by a boolean rule
    add = np.zeros((B * h, Q, K), np.float32)
    if c["am"] is not None:
        am = np.broadcast_to(c["am"], (B * h, Q, K))
        if am.dtype == bool:
            out |= am
        else:
            add += am
    if c["causal"]:
        out |= np.triu(np.ones((Q, K), bool), 1)[None]
    if c["lens"] is not None:
        lens = c["lens"] if c["lens"].ndim == 2 else np.repeat(c["lens"][:, None], Q, 1)
        past = np.arange(K)[None, None, :] >= lens[:, :, None]  # (B, Q, K)
        out |= np.repeat(past, h, 0)
    attn = torch.from_numpy(np.where(out, -np.inf, add).astype(np.float32))
    kpm = None if c["kpm"] is None else torch.from_numpy(c["kpm"])
    return attn, kpm


def run_torch(c):
    t = torch_module(c)
    q, k, v = (torch.from_numpy(c[n]).requires_grad_() for n in ("queries", "keys", "values"))
    attn, kpm = torch_masks(c)
    out, w = t(q, k, v, key_padding_mask=kpm, attn_mask=attn, need_weights=True, average_attn_weights=False)
    return t, (q, k, v), out, w


def run_ours(c, kernel):
    m = mha.MultiHeadAttention(c["E"], c["h"], bias=c["bias"])
    m.kernel = kernel
    m.load_state_dict(c["state"])
    out = m(c["queries"], c["keys"], c["values"], c["lens"], key_padding_mask=c["kpm"],
            attn_mask=c["am"], is_causal=c["causal"])
    return m, out


def close(got, want, rel, like=None):
    """|got - want| <= rel * the largest magnitude of want (or of `like`: a
    key bias's gradient is 0 up to rounding, measured against its weight's)."""
    want = np.asarray(want)
    scale = max(np.abs(want if like is None else like).max(initial=0.0), 1e-3)
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale)


@pytest.mark.parametrize("index", range(40))
def test_masks_match_torch_multihead_attention(index, one_torch_thread):
    rng = np.random.default_rng(7100 + index)
    c = draw(rng)
    t, inputs, want, want_w = run_torch(c)
    G = rng.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.from_numpy(G))
    tg = dict(t.named_parameters())
    for kernel in KERNELS:
        m, out = run_ours(c, kernel)
        close(out, want.detach().numpy(), 1e-5)
        close(m.attention_weights, want_w.detach().numpy(), 1e-5)
        (gq, gk, gv), grads = m.backward(G)
        for got, x in zip((gq, gk, gv), inputs):
            close(got, x.grad.numpy(), 2e-5)
        E = c["E"]
        if "in_proj_weight" in tg:
            wq, wk, wv = tg["in_proj_weight"].grad.split(E)
        else:
            wq, wk, wv = (tg[f"{n}_proj_weight"].grad for n in "qkv")
        for name, want_g in (("W_q.weight", wq), ("W_k.weight", wk), ("W_v.weight", wv),
                             ("W_o.weight", tg["out_proj.weight"].grad)):
            close(grads[name], want_g.numpy(), 2e-5)
        if c["bias"]:
            bq, bk, bv = tg["in_proj_bias"].grad.split(E)
            for name, want_g in (("W_q.bias", bq), ("W_k.bias", bk), ("W_v.bias", bv),
                                 ("W_o.bias", tg["out_proj.bias"].grad)):
                close(grads[name], want_g.numpy(), 2e-5, like=grads[name.replace("bias", "weight")])


def test_a_query_with_no_key_left_attends_uniformly_as_a_length_of_zero_does():
    """The chapter gives a query of valid length 0 uniform weights 1/K; a
    query whose keys the masks remove gets the same (FullyMaskedRows.UNIFORM),
    never NaN, with gradients to the values only."""
    rng = np.random.default_rng(3)
    B, Q, K, E = 2, 3, 5, 8
    X, Y = rng.standard_normal((B, Q, E)).astype(np.float32), rng.standard_normal((B, K, E)).astype(np.float32)
    kpm = np.zeros((B, K), bool)
    kpm[1] = True  # row 1: every key masked
    for kernel in KERNELS:
        m = mha.MultiHeadAttention(E, 2, seed=1)
        m.kernel = kernel
        out = m(X, Y, Y, key_padding_mask=kpm)
        w = m.attention_weights
        assert np.isfinite(out).all()
        np.testing.assert_allclose(w[1], np.full((2, Q, K), 1 / K), rtol=1e-6)
        # The same row through the chapter's lengths: length 0.
        ref = mha.MultiHeadAttention(E, 2, seed=1)
        ref.kernel = kernel
        want = ref(X, Y, Y, np.array([K, 0], np.float32))
        np.testing.assert_allclose(out[1], want[1], rtol=1e-5, atol=1e-6)
        (gq, gk, gv), _ = m.backward(np.ones_like(out))
        assert np.isfinite(gq).all() and np.isfinite(gk).all() and np.isfinite(gv).all()
        assert not gq[1].any() and not gk[1].any()  # no score of row 1 takes part
        assert gv[1].any()


def test_masks_of_the_wrong_shape_are_refused_naming_the_argument():
    m = mha.MultiHeadAttention(8, 2)
    X = np.ones((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward\] key_padding_mask: shape \(2, 4\)"):
        m(X, X, X, key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward\] attn_mask: shape \(5, 3, 3\)"):
        m(X, X, X, attn_mask=np.zeros((5, 3, 3), bool))
    with pytest.raises(ValueError, match=r"is_causal"):
        m(X, X, X, is_causal="yes")
    # A failed call changes nothing: the module is still lazy.
    assert m.state_dict() == {}
