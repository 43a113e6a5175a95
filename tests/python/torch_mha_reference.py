"""nn.MultiheadAttention's math written out in torch (float64), with the
options PyTorch 1.13 lacks: grouped kv heads (repeated per query head), a
policy for rows with every key masked instead of NaN, and bottom-right causal
masking. Tests check it against nn.MultiheadAttention where both are defined,
then hold mha to it everywhere.

Masks here are already in one form: `keep` booleans (True = takes part) and
`bias` floats, both broadcastable to (B, H, L, S).
"""
import math

import torch


def causal_keep(L, S, alignment):
    """(L, S) booleans, True where query i may see key j."""
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    offset = 0 if alignment == "top_left" else S - L
    return j <= i + offset


def split_heads(x, heads):
    """(B, T, heads*d) -> (B, heads, T, d)"""
    B, T, W = x.shape
    return x.reshape(B, T, heads, W // heads).permute(0, 2, 1, 3)


def reference_mha(state, num_heads, query, key, value, *, num_kv_heads=None,
                  keep=None, bias=None, add_zero_attn=False, fully_masked="zeros",
                  dropout_mask=None):
    """Batch-first inputs (B, L, E), (B, S, kdim), (B, S, vdim) as float64
    tensors; `state` maps PyTorch's names to float64 tensors. keep/bias cover
    the S keys plus any appended ones. dropout_mask (B, H, L, S'), if given,
    multiplies the weights before they meet the values (mha's mask of a
    training-mode call, so that its dropout can be differentiated here).
    Returns (output (B, L, E), per-head weights (B, H, L, S') before dropout)."""
    H = num_heads
    Hkv = num_kv_heads or H
    E = state["out_proj.weight"].shape[0]
    d = E // H
    Ekv = Hkv * d
    if "in_proj_weight" in state:
        w = state["in_proj_weight"]
        wq, wk, wv = w[:E], w[E:E + Ekv], w[E + Ekv:]
    else:
        wq, wk, wv = state["q_proj_weight"], state["k_proj_weight"], state["v_proj_weight"]
    if "in_proj_bias" in state:
        b = state["in_proj_bias"]
        bq, bk, bv = b[:E], b[E:E + Ekv], b[E + Ekv:]
    else:
        bq = bk = bv = None
    q = torch.nn.functional.linear(query, wq, bq)
    k = torch.nn.functional.linear(key, wk, bk)
    v = torch.nn.functional.linear(value, wv, bv)
    B = q.shape[0]
    if "bias_k" in state:
        k = torch.cat([k, state["bias_k"].expand(B, 1, Ekv)], dim=1)
        v = torch.cat([v, state["bias_v"].expand(B, 1, Ekv)], dim=1)
    if add_zero_attn:
        k = torch.cat([k, k.new_zeros(B, 1, Ekv)], dim=1)
        v = torch.cat([v, v.new_zeros(B, 1, Ekv)], dim=1)
    qh = split_heads(q, H)
    # Grouped heads: kv head g serves query heads g*(H/Hkv) .. (g+1)*(H/Hkv)-1
    # (repeat_interleave over the head axis, written as an index).
    serves = torch.arange(H).div(H // Hkv, rounding_mode="floor")
    kh = split_heads(k, Hkv)[:, serves]
    vh = split_heads(v, Hkv)[:, serves]
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    if bias is not None:
        scores = scores + bias
    live = torch.ones_like(scores, dtype=torch.bool)
    if keep is not None:
        live = live & keep
        scores = scores.masked_fill(~keep, float("-inf"))
    live = live & (scores != float("-inf"))
    empty = ~live.any(dim=-1, keepdim=True)
    safe = scores.masked_fill(empty, 0.0)  # any finite row: replaced below
    weights = torch.softmax(safe, dim=-1)
    S = scores.shape[-1]
    fill = 1.0 / S if fully_masked == "uniform" else 0.0
    weights = torch.where(empty, torch.full_like(weights, fill), weights)
    dropped = weights if dropout_mask is None else weights * dropout_mask
    out = (dropped @ vh).permute(0, 2, 1, 3).reshape(B, -1, E)
    out = torch.nn.functional.linear(out, state["out_proj.weight"], state.get("out_proj.bias"))
    return out, weights
