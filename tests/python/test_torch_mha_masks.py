"""Masks for PyTorch users: the two boolean conventions and their named
conversions (checked against PyTorch's own functions), causal masking that
is never ignored, rows with every key masked (never NaN, under either
policy, with dropout too), and masks that are refused."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha


def module(E=8, H=2, seed=0, **kw):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    return m.eval(), mha.TorchMultiheadAttention.from_state_dict(m.state_dict(), H, **{"batch_first": True, **kw})


def identity_attention(E):
    """One head whose projections are identities: attention itself, so that
    calls can be held to scaled_dot_product_attention."""
    eye = np.eye(E, dtype=np.float32)
    state = {"in_proj_weight": np.concatenate([eye, eye, eye]), "out_proj.weight": eye}
    return mha.TorchMultiheadAttention.from_state_dict(state, 1, batch_first=True).eval()


def test_named_conversions_and_their_inverses():
    m = np.array([[True, False, False], [False, True, True]])
    assert mha.mask_from_torch_mha(m).kind == mha.Mask.Kind.KEEP
    np.testing.assert_array_equal(mha.mask_from_torch_mha(m).values, ~m)
    np.testing.assert_array_equal(mha.mask_from_sdpa(m).values, m)
    np.testing.assert_array_equal(mha.Mask.keep(m).values, m)
    np.testing.assert_array_equal(mha.mask_to_torch_mha(mha.mask_from_torch_mha(m)), m)
    np.testing.assert_array_equal(mha.mask_to_sdpa(mha.mask_from_torch_mha(m)), ~m)
    f = np.array([0.0, -np.inf, 1.5], np.float32)
    assert mha.mask_from_torch_mha(f).kind == mha.Mask.Kind.ADDITIVE  # floats stay additive
    np.testing.assert_array_equal(mha.Mask.additive(f).values, f)


def test_both_conventions_reach_the_same_result_as_pytorch():
    rng = np.random.default_rng(0)
    t, ours = module()
    ours.eval()
    q, k = rng.standard_normal((2, 3, 8), np.float32), rng.standard_normal((2, 5, 8), np.float32)
    masked_out = rng.random((3, 5)) < 0.4
    masked_out[:, 0] = False
    with torch.no_grad():
        want, _ = t(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k),
                    attn_mask=torch.from_numpy(masked_out))
    raw, _ = ours(q, k, k, attn_mask=masked_out)  # PyTorch's module convention
    via_mha, _ = ours(q, k, k, attn_mask=mha.mask_from_torch_mha(masked_out))
    via_sdpa, _ = ours(q, k, k, attn_mask=mha.mask_from_sdpa(~masked_out))
    for got in (raw, via_mha, via_sdpa):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    # The same array read in the other convention is a different mask.
    wrong, _ = ours(q, k, k, attn_mask=mha.mask_from_sdpa(masked_out))
    assert not np.allclose(wrong, want.numpy(), atol=1e-3)


def torch_sdpa(q, k, v, attn_mask=None, is_causal=False):
    """PyTorch's own SDPA: (output, weights)."""
    if hasattr(F, "_scaled_dot_product_attention"):  # torch 1.13
        return F._scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                               need_attn_weights=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    L, S = q.shape[-2], k.shape[-2]
    keep = attn_mask if attn_mask is not None else torch.ones(L, S, dtype=torch.bool)
    if is_causal:
        keep = keep & torch.ones(L, S, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~keep, float("-inf"))
    return out, scores.softmax(-1)


def test_sdpa_convention_and_causal_against_pytorchs_sdpa():
    # PyTorch's SDPA (1.13's private F._scaled_dot_product_attention, 2.x's
    # public function) reads True = takes part, and its is_causal is top-left
    # aligned. The weights come from 1.13's function, or from the masked
    # softmax on 2.x (whose function returns none).
    rng = np.random.default_rng(1)
    E = 6
    attn = identity_attention(E)
    for L, S in [(3, 5), (5, 3), (4, 4), (1, 7)]:
        q = torch.randn(2, L, E)
        k, v = torch.randn(2, S, E), torch.randn(2, S, E)
        takes_part = torch.from_numpy(rng.random((L, S)) < 0.6)
        takes_part[:, 0] = True
        want, want_w = torch_sdpa(q, k, v, attn_mask=takes_part)
        got, got_w = attn(q, k, v, attn_mask=mha.mask_from_sdpa(takes_part), average_attn_weights=False)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_w[:, 0], want_w.numpy(), rtol=1e-5, atol=1e-6)
        want, want_w = torch_sdpa(q, k, v, is_causal=True)
        for need_weights in (True, False):  # never ignored, with or without weights
            got, got_w = attn(q, k, v, is_causal=True, need_weights=need_weights)
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(attn(q, k, v, is_causal=mha.Causal.TOP_LEFT)[1], want_w.numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_bottom_right_causal_sees_the_last_keys():
    attn = identity_attention(4)
    L, S = 3, 6
    q, k = torch.randn(1, L, 4), torch.randn(1, S, 4)
    _, w = attn(q, k, k, is_causal=mha.Causal.BOTTOM_RIGHT)
    visible = w[0] > 0
    want = np.arange(S)[None, :] <= np.arange(L)[:, None] + (S - L)
    np.testing.assert_array_equal(visible, want)


@pytest.mark.parametrize("policy", [mha.FullyMaskedRows.ZEROS, mha.FullyMaskedRows.UNIFORM])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_fully_masked_rows_never_give_nan(policy, dropout):
    rng = np.random.default_rng(2)
    t, ours = module(E=12, H=3, fully_masked_rows=policy, dropout=dropout, seed=3)
    if dropout == 0.0:
        ours.eval()  # with dropout: training mode, as a new PyTorch module
    B, L, S = 3, 4, 5
    q, k = rng.standard_normal((B, L, 12), np.float32), rng.standard_normal((B, S, 12), np.float32)
    kpm = np.zeros((B, S), bool)
    kpm[1] = True                                # every key of batch row 1 padded
    attn = np.zeros((B * 3, L, S), np.float32)
    attn[0, 2] = -np.inf                         # batch 0, head 0, query 2: every score -inf
    out, w = ours(q, k, k, key_padding_mask=kpm, attn_mask=attn, average_attn_weights=False)
    assert np.isfinite(out).all() and np.isfinite(w).all()
    with torch.no_grad():
        t_out, _ = t(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k),
                     key_padding_mask=torch.from_numpy(kpm), attn_mask=torch.from_numpy(attn))
    nan_rows = np.isnan(t_out.numpy()).any(axis=-1)
    assert nan_rows[1].all() and nan_rows[0, 2] and nan_rows.sum() == L + 1  # PyTorch: NaN
    if dropout:
        return  # weights are after dropout in training mode, as PyTorch's
    fill = 0.0 if policy == mha.FullyMaskedRows.ZEROS else 1.0 / S
    np.testing.assert_array_equal(w[1], np.full((3, L, S), fill, np.float32))
    np.testing.assert_array_equal(w[0, 0, 2], np.full(S, fill, np.float32))
    np.testing.assert_allclose(w[0, 1:, 2].sum(-1), 1.0, rtol=1e-6)  # other heads: a softmax
    if policy == mha.FullyMaskedRows.ZEROS:      # attention output 0: only out_proj.bias is left
        np.testing.assert_allclose(out[1], np.broadcast_to(t.out_proj.bias.detach().numpy(), (L, 12)),
                                   rtol=1e-6, atol=1e-6)
    # Rows PyTorch can compute agree with it.
    np.testing.assert_allclose(out[~nan_rows], t_out.numpy()[~nan_rows], rtol=1e-5, atol=1e-5)


def test_bad_masks_and_arguments_are_refused_by_name():
    _, ours = module()
    x, y = np.zeros((2, 3, 8), np.float32), np.zeros((2, 5, 8), np.float32)
    with pytest.raises(ValueError, match=r"key_padding_mask: dtype int64 is neither bool nor floating"):
        ours(x, y, y, key_padding_mask=np.zeros((2, 5), np.int64))
    with pytest.raises(ValueError, match=r"key_padding_mask: shape \(2, 4\) is not \(2, 5\)"):
        ours(x, y, y, key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match=r"attn_mask: shape \(3, 3, 5\) is not \(4, 3, 5\)"):
        ours(x, y, y, attn_mask=np.zeros((3, 3, 5), np.float32))
    bad = np.zeros((3, 5), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"Mask.additive\] bias: element 7 of shape \(3, 5\) is nan"):
        ours(x, y, y, attn_mask=bad)
    with pytest.raises(ValueError, match=r"is_causal: .* is neither a bool nor an mha.Causal"):
        ours(x, y, y, is_causal="yes")
    with pytest.raises(ValueError, match=r"value: shape \(2, 5, 7\) has width 7; wanted vdim 8"):
        ours(x, y, np.zeros((2, 5, 7), np.float32))
    state = {k: v.numpy() for k, v in module()[0].state_dict().items()}
    del state["out_proj.bias"]
    with pytest.raises(ValueError, match=r"missing parameter 'out_proj.bias'"):
        mha.TorchMultiheadAttention.from_state_dict(state, 2)
    state["out_proj.bias"] = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=r"num_heads: 3 does not divide embed_dim 8"):
        mha.TorchMultiheadAttention.from_state_dict(state, 3)
    # uint8 attn_mask: PyTorch still reads it as boolean (deprecated), so does mha.
    ours.eval()
    m = np.zeros((3, 5), np.uint8)
    m[:, 4] = 1
    a, _ = ours(x, y + 1, y, attn_mask=m)
    b, _ = ours(x, y + 1, y, attn_mask=m.astype(bool))
    np.testing.assert_array_equal(a, b)
