"""Numbers read as the d2l chapter reads them, with nothing narrowed on the way:
float64 valid_lens compared in float64, denormal numbers kept by every
float32 kernel, thread counts bounded with the bound in the message."""
import numpy as np
import pytest
import torch

import mha

KERNELS = [mha.Kernel.REFERENCE, mha.Kernel.BLAS, mha.Kernel.FUSED]


def chapter_attention(q, k, v, lens):
    """The chapter's DotProductAttention (eval), lens in their own dtype."""
    q, k, v = (torch.tensor(a, dtype=torch.float32) for a in (q, k, v))
    scores = torch.bmm(q, k.transpose(1, 2)) / np.sqrt(q.shape[-1])
    shape = scores.shape
    vl = torch.tensor(lens)
    vl = torch.repeat_interleave(vl, shape[1]) if vl.dim() == 1 else vl.reshape(-1)
    x = scores.reshape(-1, shape[-1])
    mask = torch.arange(shape[-1], dtype=torch.float32)[None, :] < vl[:, None]
    x[~mask] = -1e6
    return torch.bmm(torch.softmax(x.reshape(shape), dim=-1), v).numpy()


@pytest.mark.parametrize("lens", [
    [3.0000001, 2.00000001],           # float32 would round both down and mask one more key
    [1e-300, 4.5],                     # float32 would make 1e-300 a zero: every key masked
    [2.9999999999, 0.0],
    [7.0, 1e30],
])
def test_float64_valid_lens_are_compared_in_float64(lens):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((2, 6, 8)).astype(np.float32)
    v = rng.standard_normal((2, 6, 5)).astype(np.float32)
    lens = np.array(lens, np.float64)
    want = chapter_attention(q, k, v, lens)
    d = mha.DotProductAttention().eval()
    np.testing.assert_allclose(d(q, k, v, lens), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d(q, k, v, torch.tensor(lens)), want, rtol=1e-5, atol=1e-6)
    # (B, Q) lengths and the module, every kernel
    per_query = np.repeat(lens[:, None], 3, axis=1)
    np.testing.assert_allclose(d(q, k, v, per_query), want, rtol=1e-5, atol=1e-6)
    m = mha.MultiHeadAttention(8, 2, seed=1).eval()
    outs = []
    for kernel in KERNELS:
        m.kernel = kernel
        outs.append(m(q, k, k, lens))
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-5, atol=1e-6)


def test_float64_lengths_mask_what_their_float32_rounding_would_not():
    # 3.0000001 keeps key 3 (3 < 3.0000001); float32(3.0000001) == 3.0 would mask it.
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 4)).astype(np.float32)
    k = rng.standard_normal((1, 5, 4)).astype(np.float32)
    d = mha.DotProductAttention().eval()
    d(q, k, k, np.array([3.0000001]))
    kept = d.attention_weights[0, 0]
    assert kept[3] > 1e-3 and kept[4] < 1e-30
    d(q, k, k, np.array([3.0000001], np.float32))
    assert d.attention_weights[0, 0, 3] < 1e-30
    d(q, k, k, np.array([1e-300]))
    np.testing.assert_allclose(d.attention_weights[0, 0], [1, 0, 0, 0, 0], atol=1e-30)


def test_integer_lengths_are_compared_as_the_chapter_compares_them():
    # torch promotes int64 lengths against the float32 key indices to
    # float32: the chapter's comparison, and mha's.
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 2, 4)).astype(np.float32)
    k = rng.standard_normal((2, 4, 4)).astype(np.float32)
    lens = np.array([2, 3], np.int64)
    np.testing.assert_allclose(mha.DotProductAttention().eval()(q, k, k, lens), chapter_attention(q, k, k, lens),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", KERNELS)
def test_denormal_values_are_kept_by_every_kernel(kernel):
    # Identity projections: the output is the attention-weighted average of
    # values around 1e-39 (denormal in float32). A kernel that flushed
    # denormals to zero (the fused kernel did, with FTZ/DAZ) returns zeros.
    D = 16
    m = mha.MultiHeadAttention(D, 2, seed=0).eval()
    eye = np.eye(D, dtype=np.float32)
    x = np.random.default_rng(3).standard_normal((2, 5, D)).astype(np.float32)
    m(x, x, x)
    m.load_state_dict({"W_q.weight": eye, "W_k.weight": eye, "W_v.weight": eye, "W_o.weight": eye})
    v = (np.random.default_rng(4).uniform(1, 2, (2, 5, D)) * 1e-39).astype(np.float32)
    assert np.all(v != 0) and np.all(np.abs(v) < np.finfo(np.float32).tiny)
    m.kernel = kernel
    out = m(x, x, v)
    want = chapter_attention(*[a.reshape(2, 5, 2, 8).transpose(0, 2, 1, 3).reshape(4, 5, 8) for a in (x, x, v)],
                             np.array([5.0] * 4))
    want = want.reshape(2, 2, 5, 8).transpose(0, 2, 1, 3).reshape(2, 5, D)
    assert np.all(out != 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=0)


def test_thread_counts_are_bounded_with_the_bound_in_the_message():
    most = mha.max_num_threads()
    assert most >= 4
    before = mha.get_num_threads()
    try:
        mha.set_num_threads(most)
        assert mha.get_num_threads() == most
        for bad in (0, -1, most + 1, 100000, 10**6, 2**31):
            with pytest.raises(ValueError, match=rf"^\[set_num_threads\] n: {bad} is not a thread count in "
                                                 rf"\[1, {most}\] \(at most 4x the machine's \d+ hardware threads\)$"):
                mha.set_num_threads(bad)
        assert mha.get_num_threads() == most
    finally:
        mha.set_num_threads(before)
