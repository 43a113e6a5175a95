"""torch 2.x line only: mha.torch.scaled_dot_product_attention against torch's own
F.scaled_dot_product_attention (torch 2.13's semantics, its default CPU dispatch), and PyTorch's
documented examples of SDPA with mha swapped in.

Random cases: ranks 3-5, L and S from 1 to 70 (L != S included), 1-4 heads with grouped
key/value heads (enable_gqa), boolean and additive masks broadcast over batch and heads, rows with
every key masked, is_causal with L > S and L < S (top left), explicit scales. Output and the
gradients of q, k and v within 2e-5 of the larger of 1 and the peer's largest entry (torch's
flash kernel and mha's both run in float32, in different orders). Dropout: the kept weights are
the undropped ones / (1 - p) and the dropped fraction is p within 4 standard deviations, for mha as
for torch.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha.torch as mt

if not hasattr(F, "scaled_dot_product_attention"):
    pytest.skip(f"torch {torch.__version__} has no F.scaled_dot_product_attention (the torch 2.x line's peer)",
                allow_module_level=True)

TOL = 2e-5
LENGTHS = [1, 2, 3, 7, 16, 31, 33, 64, 70]


def _close(a, b, what):
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a - b).abs().max()) if b.numel() else 0.0
    assert err <= TOL * scale, f"{what}: {err:.3g} > {TOL * scale:.3g}"


def _case(rng, i):
    rank = int(rng.integers(3, 6))
    Hkv = int(rng.integers(1, 3))
    H = Hkv * int(rng.integers(1, 3))
    gqa = H != Hkv
    if gqa and rank == 3:
        rank = 4
    L, S = int(rng.choice(LENGTHS)), int(rng.choice(LENGTHS))
    E, Ev = int(rng.choice([4, 8, 16, 24])), int(rng.choice([4, 8, 12]))
    lead = [int(rng.integers(1, 3)) for _ in range(rank - 3)]
    q_lead = lead + [H] if rank > 3 else [H]
    kv_lead = lead + [Hkv] if rank > 3 else [Hkv]
    if rank == 3:
        q_lead, kv_lead = [H], [H]
        gqa = False
    q = torch.randn(*q_lead, L, E)
    k, v = torch.randn(*kv_lead, S, E), torch.randn(*kv_lead, S, Ev)
    kind = ["none", "bool", "float", "causal"][i % 4]
    mask, causal = None, False
    if kind == "causal":
        causal = True
    elif kind != "none":
        shape = [int(rng.choice([1, n])) for n in q_lead] + [L, S]
        shape = shape[int(rng.integers(0, len(shape) - 1)):]  # a broadcast prefix dropped
        if kind == "bool":
            mask = torch.from_numpy(rng.random(shape) < 0.7)
            if mask.dim() >= 2 and L > 1:
                mask[..., 0, :] = False  # a row with every key masked
        else:
            mask = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
            mask[torch.from_numpy(rng.random(shape) < 0.2)] = float("-inf")
    scale = None if rng.random() < 0.5 else float(rng.uniform(0.05, 1.0))
    return q, k, v, mask, causal, scale, gqa


@pytest.mark.parametrize("seed", range(4))
def test_forward_and_gradients_equal_torchs_function(seed):
    rng = np.random.default_rng(700 + seed)
    torch.manual_seed(seed)
    for i in range(40):
        q, k, v, mask, causal, scale, gqa = _case(rng, i)
        args = dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
        ours_in = [x.clone().requires_grad_(True) for x in (q, k, v)]
        peer_in = [x.clone().requires_grad_(True) for x in (q, k, v)]
        ours = mt.scaled_dot_product_attention(*ours_in, **args)
        peer = F.scaled_dot_product_attention(*peer_in, **args)
        what = f"case {seed}/{i} q{tuple(q.shape)} k{tuple(k.shape)} mask {None if mask is None else tuple(mask.shape)}"
        _close(ours, peer, what + " output")
        g = torch.randn_like(peer)
        (ours * g).sum().backward()
        (peer * g).sum().backward()
        for a, b, name in zip(ours_in, peer_in, "qkv"):
            _close(a.grad, b.grad, f"{what} grad {name}")


@pytest.mark.parametrize("fn", ["mha", "torch"])
def test_dropout_keeps_the_weights_scaled_and_drops_p_of_them(fn):
    """With v the identity, each output row is the row's dropped weights / (1 - p)."""
    sdpa = mt.scaled_dot_product_attention if fn == "mha" else F.scaled_dot_product_attention
    torch.manual_seed(3)
    B, H, L, S, p = 2, 3, 40, 50, 0.3
    q, k = torch.randn(B, H, L, 8), torch.randn(B, H, S, 8)
    v = torch.eye(S).expand(B, H, S, S)
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1)
    out = sdpa(q, k, v, dropout_p=p)
    kept = out != 0
    dropped = float((~kept).float().mean())
    sd = math.sqrt(p * (1 - p) / out.numel())
    assert abs(dropped - p) <= 4 * sd, (dropped, p)
    assert float((out[kept] - w[kept] / (1 - p)).abs().max()) <= 1e-5


def test_pytorch_documented_examples_with_mha():
    """The examples of torch.nn.functional.scaled_dot_product_attention's documentation (on the CPU,
    float32), with mha's function in torch's place."""
    torch.manual_seed(0)
    query, key, value = torch.rand(32, 8, 128, 64), torch.rand(32, 8, 128, 64), torch.rand(32, 8, 128, 64)
    _close(mt.scaled_dot_product_attention(query, key, value), F.scaled_dot_product_attention(query, key, value),
           "documented example")
    query, key, value = torch.rand(32, 32, 128, 64), torch.rand(32, 8, 128, 64), torch.rand(32, 8, 128, 64)
    _close(mt.scaled_dot_product_attention(query, key, value, enable_gqa=True),
           F.scaled_dot_product_attention(query, key, value, enable_gqa=True), "documented grouped-query example")


def test_nn_multihead_attention_documented_example_with_the_drop_in():
    """torch.nn.MultiheadAttention's documented call, with mha's drop-in loading the same state dict."""
    torch.manual_seed(1)
    embed_dim, num_heads = 32, 4
    torch_attn = torch.nn.MultiheadAttention(embed_dim, num_heads)
    multihead_attn = mt.MultiheadAttention(embed_dim, num_heads)
    multihead_attn.load_state_dict(torch_attn.state_dict())
    query, key, value = torch.randn(5, 2, embed_dim), torch.randn(7, 2, embed_dim), torch.randn(7, 2, embed_dim)
    attn_output, attn_output_weights = multihead_attn(query, key, value)
    want, want_weights = torch_attn(query, key, value)
    _close(attn_output, want, "documented example output")
    _close(attn_output_weights, want_weights, "documented example weights")
