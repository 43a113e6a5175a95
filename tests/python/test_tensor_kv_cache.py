"""The modules' cached calls over an mha.torch.TensorKVCache (both torch lines; compiled and exported in
test_torch2_library.py): token-by-token decoding after a prefill equals the same calls over an mha.KVCache
(mha's C++ cache, its own kernels) within float32 rounding (1e-5 of the output's scale), and the uncached
causal call over the whole sequence; bfloat16 storage against the mha.KVCache's bfloat16; options the
tensor cache does not take are refused by name; lengths advance and reset."""
import pytest
import torch

import mha.torch as mt
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

TOL = 1e-5


def close(a, b, what):
    err = float((a - b).abs().max())
    assert err <= TOL * max(1.0, float(b.abs().max())), f"{what}: {err:.3g}"


MODULES = {
    "drop_in": lambda: mt.MultiheadAttention(16, 4, batch_first=True),
    "drop_in_seq_first": lambda: mt.MultiheadAttention(16, 2, kdim=16, vdim=16),
    "chapter": lambda: mt.MultiHeadAttention(16, 4, 0.0, bias=True),
}


def call(m, x, **kw):
    r = m(x, x, x, **kw)
    return r[0] if isinstance(r, tuple) else r


def decode(m, x, cache, P, seq_first=False, **kw):
    step = (lambda a, b: x[a:b]) if seq_first else (lambda a, b: x[:, a:b])
    T = x.shape[0 if seq_first else 1]
    outs = [call(m, step(0, P), cache=cache, **kw)] + [call(m, step(t, t + 1), cache=cache, **kw)
                                                       for t in range(P, T)]
    return torch.cat(outs, 0 if seq_first else 1)


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decoding_equals_the_mha_kv_cache_and_the_uncached_call(name, dtype):
    torch.manual_seed(5)
    m = MODULES[name]().eval()
    seq_first = name == "drop_in_seq_first"
    x = torch.randn(11, 2, 16) if seq_first else torch.randn(2, 11, 16)
    with torch.no_grad():
        call(m, x)  # the chapter's lazy layers
        tensors = m.tensor_kv_cache(2, 16, dtype=getattr(torch, dtype))
        got = decode(m, x, tensors, 4, seq_first, window=(3, 0))
        want = decode(m, x, m.kv_cache(2, 16, dtype=dtype), 4, seq_first, window=(3, 0))
        close(got, want, "against mha.KVCache")
        assert tensors.lengths.tolist() == [11, 11]
        if dtype == "float32":
            whole = call(m, x, window=(3, 0), **({"is_causal": True, "attn_mask": torch.ones(11, 11).bool().triu(1)}
                                                 if name != "chapter" else {}))
            if name != "chapter":  # (the chapter's module has no causal mask of its own)
                close(got, whole, "against the uncached causal call")
        tensors.reset()
        assert tensors.lengths.tolist() == [0, 0]


def test_what_the_tensor_cache_does_not_take_is_refused_by_name():
    m = mt.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True).eval()
    x = torch.randn(1, 2, 8)
    with torch.no_grad():
        with pytest.raises(NotImplementedError, match=r"bias_k / add_zero_attn in a cached call over an "
                                                      r"mha\.torch\.TensorKVCache"):
            m(x, x, x, cache=m.tensor_kv_cache(1, 4))
        plain = mt.MultiheadAttention(8, 2, batch_first=True).eval()
        with pytest.raises(NotImplementedError, match=r"key_padding_mask in a cached call"):
            plain(x, x, x, cache=plain.tensor_kv_cache(1, 4), key_padding_mask=torch.zeros(1, 2, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"cache: batch size 3; the call has 1 batch rows"):
            plain(x, x, x, cache=plain.tensor_kv_cache(3, 4))
        with pytest.raises(ValueError, match=r"the call's 2 new ones"):
            plain(x, x, x, cache=plain.tensor_kv_cache(1, 1))
    plain.train()
    with torch.no_grad(), pytest.raises(ValueError, match=r"evaluation mode only"):
        plain(x, x, x, cache=plain.tensor_kv_cache(1, 4))
    with pytest.raises(ValueError, match=r"\[mha\.torch\.TensorKVCache\] dtype"):
        mt.TensorKVCache(1, 4, 2, 4, dtype=torch.float16)


def test_threads_sharing_a_cache_append_in_turn():
    """Threads decoding into one TensorKVCache: each call appends after the previous one, so the
    lengths count every call and every slot holds the key of the one token all threads feed (a lost
    update would leave a slot of zeros and a length short)."""
    import threading
    torch.manual_seed(6)
    m = mt.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(1, 1, 16)
    threads, steps = 4, 12
    cache = m.tensor_kv_cache(1, threads * steps)
    errors = []

    def work():
        try:
            with torch.no_grad():
                for _ in range(steps):
                    m(x, x, x, cache=cache)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    assert cache.lengths.tolist() == [threads * steps]
    with torch.no_grad():
        k = torch.nn.functional.linear(x, m.in_proj_weight[16:32], m.in_proj_bias[16:32]).reshape(4, 4)
    torch.testing.assert_close(cache.key[0], k.expand(threads * steps, 4, 4), rtol=0, atol=1e-6)
