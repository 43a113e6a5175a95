"""The decode kernel (mha._core._decode_attention, private) against the d2l
chapter's own DotProductAttention (tests/python/seed_reference.py): each
batch row's Qn queries over its K = lengths[b] cached keys, with per-query
valid lengths K - Qn + i + 1 (causal within the new block). Grouped heads
(query head h reads cache head h // (Hq / Hkv)) are expanded for the seed.

Tolerance: float32, |mha - seed| <= 1e-5 (|seed| + max |v|): the seed runs
in float32 too, in another order. bfloat16 caches: the same, against the
seed on the rounded values (the widening to float32 is exact).
"""
import numpy as np
import pytest
import torch

import mha
from seed_reference import DotProductAttention

RTOL = 1e-5


def seed_decode(q, k, v, lengths, causal=True):
    """q:[B,Hq,Qn,d] k,v:[B,Hkv,cap,d|dv] float32 -> [B,Hq,Qn,dv] by the chapter's code."""
    B, Hq, Qn, d = q.shape
    group = Hq // k.shape[1]
    attn = DotProductAttention(0.0).eval()
    out = np.zeros((B, Hq, Qn, v.shape[3]), np.float32)
    for b in range(B):
        K = int(lengths[b])
        if K == 0:
            continue  # no keys: the kernel gives 0
        kk = torch.from_numpy(np.repeat(k[b, :, :K], group, axis=0))
        vv = torch.from_numpy(np.repeat(v[b, :, :K], group, axis=0))
        lens = torch.tensor([[K - Qn + i + 1 if causal else K for i in range(Qn)]] * Hq, dtype=torch.float32)
        with torch.no_grad():
            out[b] = attn(torch.from_numpy(q[b]), kk, vv, lens).numpy()
    return out


def bf16_bits(x):
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("B,Hq,Hkv,Qn,d,dv,lengths,causal", [
    (3, 4, 4, 1, 7, 7, [1, 0, 40], True),         # one key, no keys, d odd
    (2, 8, 2, 4, 33, 20, [4, 513], True),         # grouped heads, dv != d, one past a chunk
    (1, 6, 3, 16, 64, 64, [1025], True),          # 16 queries
    (2, 2, 1, 3, 16, 16, [1, 30], False),         # multi-query, not causal
])
def test_matches_the_chapter(B, Hq, Hkv, Qn, d, dv, lengths, causal):
    rng = np.random.default_rng(sum(lengths) + d)
    cap = max(lengths) + 3
    q = rng.uniform(-1.5, 1.5, (B, Hq, Qn, d)).astype(np.float32)
    k = rng.uniform(-1.5, 1.5, (B, Hkv, cap, d)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, Hkv, cap, dv)).astype(np.float32)
    lens = np.array(lengths, np.int64)
    for kc, vc, kf, vf in ((k, v, k, v), (bf16_bits(k), bf16_bits(v), from_bits(bf16_bits(k)), from_bits(bf16_bits(v)))):
        got = mha._core._decode_attention(q, kc, vc, lens, causal=causal)
        want = seed_decode(q, kf, vf, lens, causal)
        assert got.shape == want.shape
        err = np.abs(got - want) - RTOL * (np.abs(want) + 1.0)
        assert (err <= 0).all(), f"{kc.dtype}: worst excess {err.max():.3g}"


def test_bad_inputs_name_the_argument():
    q = np.zeros((1, 4, 1, 8), np.float32)
    k = np.zeros((1, 2, 10, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[_decode_attention\] k_cache: dtype float64"):
        mha._core._decode_attention(q, k.astype(np.float64), k, np.array([5]))
    with pytest.raises(ValueError, match=r"lengths\[0\]: 11; wanted 0 <= length <= the cache capacity 10"):
        mha._core._decode_attention(q, k, k, np.array([11]))
    with pytest.raises(ValueError, match=r"heads: q has 4 heads and the cache 3"):
        mha._core._decode_attention(q, np.zeros((1, 3, 10, 8), np.float32), np.zeros((1, 3, 10, 8), np.float32),
                                    np.array([5]))
