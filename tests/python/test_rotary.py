"""Rotary position embeddings (mha/rotary.h, mha.Rotary) against a plain
torch implementation of the d2l chapter's module with Hugging Face's
rotary embedding between the projections and the attention: forward, every
gradient, both pair layouts, partial rotation, grouped shapes, valid
lengths, the drop-in, bfloat16 mode, and cached decoding against the
uncached call. Tolerances: float32 1e-5 relative to each tensor's scale."""
import math

import numpy as np
import pytest
import torch

import mha

RNG = np.random.default_rng(20261204)


def rope(x, positions, dims, base, interleaved):
    """x (B, h, L, d) rotated at `positions` (L,), as Hugging Face computes
    it (LlamaRotaryEmbedding: inv_freq in float32, angle = t * inv_freq)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    rot, rest = x[..., :dims], x[..., dims:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., : dims // 2], rot[..., dims // 2:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([out, rest], dim=-1)


def reference(state, X, Y, Z, valid_lens, h, rotary):
    """The chapter's module (no dropout) with rotary q and k: output."""
    q, k, v = X @ state["W_q.weight"].T, Y @ state["W_k.weight"].T, Z @ state["W_v.weight"].T
    if "W_q.bias" in state:
        q, k, v = q + state["W_q.bias"], k + state["W_k.bias"], v + state["W_v.bias"]
    B, Q, K = X.shape[0], X.shape[1], Y.shape[1]
    split = lambda t, L: t.reshape(B, L, h, -1).permute(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q, Q), split(k, K), split(v, K)
    d = q.shape[-1]
    if rotary is not None:
        q = rope(q, torch.arange(Q), rotary.dims, rotary.base, rotary.interleaved)
        k = rope(k, torch.arange(K), rotary.dims, rotary.base, rotary.interleaved)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    if valid_lens is not None:  # the chapter's masked_softmax, -1e6 fill
        lens = torch.as_tensor(valid_lens, dtype=torch.float32)
        lens = lens[:, None, None, None] if lens.dim() == 1 else lens[:, None, :, None]
        scores = torch.where(torch.arange(K, dtype=torch.float32) < lens, scores, torch.tensor(-1e6))
    out = (torch.softmax(scores, -1) @ v).permute(0, 2, 1, 3).reshape(B, Q, -1)
    out = out @ state["W_o.weight"].T
    return out + state["W_o.bias"] if "W_o.bias" in state else out


def close(got, want, tol=1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    assert np.abs(got - want).max() <= tol * scale, (np.abs(got - want).max(), scale)


CASES = [
    # B, Q, K, D, h, dims, interleaved, bias, lens
    (2, 5, 7, 16, 2, 8, False, False, None),
    (1, 9, 9, 24, 3, 8, True, True, None),
    (3, 4, 11, 12, 2, 4, False, True, "batch"),
    (2, 6, 6, 32, 4, 6, True, False, "query"),
    (1, 1, 13, 8, 1, 8, False, False, None),
    (2, 17, 17, 40, 5, 2, False, True, "batch"),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kernel", [mha.Kernel.FUSED, mha.Kernel.BLAS, mha.Kernel.REFERENCE])
def test_forward_and_every_gradient_match_torch(case, kernel):
    B, Q, K, D, h, dims, interleaved, bias, lens_kind = case
    rotary = mha.Rotary(dims, base=10000.0 if dims % 4 else 500.0, interleaved=interleaved)
    m = mha.MultiHeadAttention(D, h, 0.0, bias, seed=3, rotary=rotary)
    m.kernel = kernel
    X, Y = (RNG.standard_normal((B, L, D)).astype(np.float32) for L in (Q, K))
    Z = RNG.standard_normal((B, K, D)).astype(np.float32)
    lens = None
    if lens_kind == "batch":
        lens = RNG.integers(0, K + 1, B).astype(np.float32)
    elif lens_kind == "query":
        lens = RNG.integers(0, K + 1, (B, Q)).astype(np.float32)
    out = m(X, Y, Z, lens)
    grad = RNG.standard_normal(out.shape).astype(np.float32)
    (gx, gy, gz), pg = m.backward(grad)

    state = {k: torch.tensor(v, requires_grad=True) for k, v in m.state_dict().items()}
    tx, ty, tz = (torch.tensor(a, requires_grad=True) for a in (X, Y, Z))
    want = reference(state, tx, ty, tz, lens, h, rotary)
    want.backward(torch.from_numpy(grad))
    close(out, want.detach())
    for got, t in ((gx, tx), (gy, ty), (gz, tz)):
        close(got, t.grad)
    for name, g in pg.items():
        close(g, state[name].grad)


def test_rotation_changes_the_result_and_none_restores_the_chapters():
    D, h = 16, 2
    m = mha.MultiHeadAttention(D, h, 0.0, False, seed=1).eval()
    X = RNG.standard_normal((1, 6, D)).astype(np.float32)
    plain = m(X, X, X)
    m.rotary = mha.Rotary(8)
    assert np.abs(plain - m(X, X, X)).max() > 1e-3
    m.rotary = None
    assert m.rotary is None
    np.testing.assert_array_equal(m(X, X, X), plain)
    assert "rotary" not in repr(m)
    m.rotary = mha.Rotary(8, base=500000.0)
    assert "rotary=mha.Rotary(dims=8, base=500000, interleaved=False)" in repr(m)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_cached_decoding_follows_the_positions(interleaved, cache_dtype):
    """A prompt prefilled in a cache, then one position per step, gives the
    outputs of uncached causal calls over the whole sequence (positions
    0.. in both), with ragged rows (each row's positions from its length)."""
    B, D, h, P, steps = 3, 24, 3, 5, 6
    m = mha.MultiHeadAttention(D, h, 0.0, True, seed=7, rotary=mha.Rotary(6, interleaved=interleaved)).eval()
    seq = RNG.standard_normal((B, P + steps, D)).astype(np.float32)
    prompt_lens = [5, 2, 4]
    cache = m.kv_cache(batch_size=B, max_len=P + steps, dtype=cache_dtype)
    m(seq[:, :P], seq[:, :P], seq[:, :P], cache=cache)
    for b, n in enumerate(prompt_lens):
        cache.truncate(b, n)
    tol = 1e-5 if cache_dtype == "float32" else 2e-2
    for t in range(steps):
        x = np.stack([seq[b, prompt_lens[b] + t] for b in range(B)])[:, None]
        got = m(x, x, x, cache=cache)
        for b in range(B):
            L = prompt_lens[b] + t + 1
            row = np.concatenate([seq[b, :prompt_lens[b]], seq[b, prompt_lens[b]:prompt_lens[b] + t + 1]])[None]
            causal = np.arange(1, L + 1, dtype=np.float32)[None]
            want = m(row, row, row, causal)[0, -1]
            close(got[b, 0], want, tol)


def test_the_drop_in_rotates_as_the_chapters_module():
    """TorchMultiheadAttention with rotary equals the chapter's module with
    the same rotary on the same weights (in_proj split into W_q, W_k, W_v)."""
    E, h = 16, 4
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(E, h, bias=True, batch_first=True)
    sd = {k: v.detach().numpy() for k, v in t.state_dict().items()}
    drop_in = mha.TorchMultiheadAttention.from_state_dict(sd, num_heads=h, batch_first=True).eval()
    drop_in.rotary = mha.Rotary(4, interleaved=True)
    chapter = mha.MultiHeadAttention(E, h, 0.0, True).eval()
    w, b = sd["in_proj_weight"], sd["in_proj_bias"]
    chapter.load_state_dict({
        "W_q.weight": w[:E], "W_k.weight": w[E:2 * E], "W_v.weight": w[2 * E:],
        "W_q.bias": b[:E], "W_k.bias": b[E:2 * E], "W_v.bias": b[2 * E:],
        "W_o.weight": sd["out_proj.weight"], "W_o.bias": sd["out_proj.bias"]})
    chapter.rotary = mha.Rotary(4, interleaved=True)
    x = RNG.standard_normal((2, 7, E)).astype(np.float32)
    out, _ = drop_in(x, x, x, need_weights=False)
    close(out, chapter(x, x, x))
    assert drop_in.rotary == mha.Rotary(4, interleaved=True)


def test_bfloat16_mode_rotates_before_rounding():
    """bfloat16 mode with rotary stays within the mode's bound of float32."""
    m = mha.MultiHeadAttention(32, 4, 0.0, False, seed=2, rotary=mha.Rotary(8)).eval()
    x = RNG.standard_normal((2, 9, 32)).astype(np.float32)
    f32 = m(x, x, x)
    m.precision = "bf16"
    close(m(x, x, x), f32, 2e-2)


@pytest.mark.parametrize("bad, message", [
    (dict(dims=9), "[Rotary] dims: 9; wanted an even number >= 0"),
    (dict(dims=-2), "[Rotary] dims: -2; wanted an even number >= 0"),
    (dict(dims=8, base=1.0), "[Rotary] rotary base: 1; wanted a finite number > 1"),
    (dict(dims=8, base=float("nan")), "[Rotary] rotary base: nan; wanted a finite number > 1"),
])
def test_a_bad_rotary_is_refused_when_made(bad, message):
    with pytest.raises(ValueError) as e:
        mha.Rotary(**bad)
    assert str(e.value).startswith(message)


def test_a_rotary_wider_than_the_heads_is_refused_by_the_module():
    m = mha.MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match=r"^\[MultiHeadAttention.set_rotary\] rotary dims: 10; wanted an even "
                                         r"number in \[0, head_dim = 8\]"):
        m.rotary = mha.Rotary(10)
    with pytest.raises(ValueError, match="rotary dims: 10"):
        mha.MultiHeadAttention(16, 2, rotary=mha.Rotary(10))
    assert m.rotary is None
    sd = {k: v.detach().numpy() for k, v in torch.nn.MultiheadAttention(16, 2).state_dict().items()}
    drop_in = mha.TorchMultiheadAttention.from_state_dict(sd, num_heads=2)
    with pytest.raises(ValueError, match=r"^\[TorchMultiheadAttention.set_rotary\] rotary dims: 10"):
        drop_in.rotary = mha.Rotary(10)
    assert drop_in.rotary is None
