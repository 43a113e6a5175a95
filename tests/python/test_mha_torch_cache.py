"""cache= on mha.torch's modules: incremental decoding inside a PyTorch model.

mha.torch.MultiHeadAttention (with the chapter's module's weights) decodes
one position at a time with a KV cache; the reference is the chapter's own
re-projecting loop (tests/python/seed_reference.py: every earlier input
concatenated and attended over each step), in float64. The drop-in,
mha.torch.MultiheadAttention, against torch.nn.MultiheadAttention with the
same state dict, called on each step's new query over every input so far.
Error measure: max |mha - reference| / max |reference| per step, within 1e-5.

Calls a cached step cannot make are refused with a message: in training
mode, with a gradient wanted, with an attn_mask, and on a drop-in with
add_bias_kv or add_zero_attn (its extra key would sit between cached
positions; nn.MultiheadAttention appends it after the last key of the call).
"""
import numpy as np
import pytest
import torch

import mha.torch as mt
from seed_reference import make_seed_module

STEPS = 24


def rel_err(got, ref):
    return float((got - ref).abs().max() / ref.abs().max())


def test_chapter_module_cached_steps_match_the_chapters_loop():
    torch.manual_seed(0)
    D, H, P = 24, 3, 5
    ref = make_seed_module(D, H, D, D, D, bias=True, seed=2).double().eval()
    m = mt.MultiHeadAttention(D, H, 0.0, bias=True).eval()
    m.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    with torch.no_grad():
        cache = m.kv_cache(2, P + STEPS)
        prompt = torch.randn(2, P, D)
        out = m(prompt, prompt, prompt, cache=cache)
        causal = torch.arange(1, P + 1, dtype=torch.float64).repeat(2, 1)
        assert rel_err(out.double(), ref(prompt.double(), prompt.double(), prompt.double(), causal)) <= 1e-5
        state = prompt.double()
        for _ in range(STEPS):
            x = torch.randn(2, 1, D)
            state = torch.cat([state, x.double()], dim=1)
            got = m(x, x, x, cache=cache)
            assert isinstance(got, torch.Tensor) and got.shape == (2, 1, D)
            assert rel_err(got.double(), ref(x.double(), state, state, None)) <= 1e-5
    assert cache.lengths == [P + STEPS] * 2


@pytest.mark.parametrize("batch_first", [True, False])
def test_drop_in_cached_steps_match_nn_multiheadattention(batch_first):
    torch.manual_seed(1)
    E, H = 16, 4
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first).eval()
    m = mt.MultiheadAttention(E, H, batch_first=batch_first).eval()
    m.load_state_dict(ref.state_dict())
    B = 2
    seq_axis = 1 if batch_first else 0
    with torch.no_grad():
        cache = m.kv_cache(B, STEPS)
        inputs = []
        for _ in range(STEPS):
            x = torch.randn(B, 1, E) if batch_first else torch.randn(1, B, E)
            inputs.append(x)
            S = torch.cat(inputs, dim=seq_axis)
            want, _ = ref(x, S, S, need_weights=False)
            got, weights = m(x, x, x, cache=cache)
            assert weights is None and got.shape == want.shape
            assert rel_err(got, want) <= 1e-5


def test_cached_calls_that_cannot_run_are_refused():
    x = torch.ones(1, 1, 8)
    m = mt.MultiHeadAttention(8, 2, 0.0)
    m(x, x, x)  # materialises the lazy layers
    cache = m.kv_cache(1, 4)
    with torch.no_grad(), pytest.raises(ValueError, match=r"cached calls run in evaluation mode only"):
        m(x, x, x, cache=cache)  # a new module is in training mode
    m.eval()
    with pytest.raises(ValueError, match=r"\[mha.torch.MultiHeadAttention\] cache: cached calls have no "
                                         r"backward; run them under torch.no_grad\(\)"):
        m(x, x, x, cache=cache)  # the parameters require grad
    with torch.inference_mode():
        assert m(x, x, x, cache=cache).shape == (1, 1, 8)
    assert cache.lengths == [1]

    d = mt.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad(), pytest.raises(ValueError, match=r"\[mha.torch.MultiheadAttention\] attn_mask: a "
                                                          r"cached call takes none"):
        d(x, x, x, attn_mask=torch.zeros(1, 1, dtype=torch.bool), cache=d.kv_cache(1, 4))
    for kw in ({"add_bias_kv": True}, {"add_zero_attn": True}):
        d = mt.MultiheadAttention(8, 2, batch_first=True, **kw).eval()
        with torch.no_grad(), pytest.raises(ValueError, match=r"cache: a module with add_bias_kv or "
                                                              r"add_zero_attn cannot decode with a cache"):
            d(x, x, x, cache=d.kv_cache(1, 4))
