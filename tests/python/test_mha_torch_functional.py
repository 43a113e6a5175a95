"""mha.torch.multi_head_attention_forward against torch.nn.functional's, and
mha.torch.replace_attention on torch models (outputs, gradients, identity of
the Parameters, state-dict keys). Float32 tolerances: outputs rtol 1e-5, atol
1e-5; gradients rtol 1e-4, atol 2e-5 of the gradient's largest magnitude (at least 1)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mha.torch as mt
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)


def draw(rng):
    H = int(rng.integers(1, 4))
    E = H * int(rng.integers(1, 5))
    L, S, N = int(rng.integers(1, 7)), int(rng.integers(1, 8)), int(rng.integers(1, 4))
    separate = bool(rng.integers(0, 2))
    kdim, vdim = (int(rng.integers(1, 7)), int(rng.integers(1, 7))) if separate else (E, E)
    t = lambda *s: torch.tensor(rng.standard_normal(s), dtype=torch.float32, requires_grad=True)  # noqa: E731
    args = dict(embed_dim_to_check=E, num_heads=H, in_proj_weight=None if separate else t(3 * E, E),
                in_proj_bias=t(3 * E) if rng.integers(0, 2) else None, bias_k=None, bias_v=None,
                add_zero_attn=bool(rng.integers(0, 2)), dropout_p=0.0, out_proj_weight=t(E, E),
                out_proj_bias=t(E) if rng.integers(0, 2) else None, training=True,
                need_weights=bool(rng.integers(0, 2)), average_attn_weights=bool(rng.integers(0, 2)))
    if rng.integers(0, 2):
        args["bias_k"], args["bias_v"] = t(1, 1, E), t(1, 1, E)
    if separate:
        args.update(use_separate_proj_weight=True, q_proj_weight=t(E, E), k_proj_weight=t(E, kdim),
                    v_proj_weight=t(E, vdim))
    mask = rng.integers(0, 3)
    if mask == 1:
        args["key_padding_mask"] = torch.tensor(rng.integers(0, 2, (N, S)) * (np.arange(S) > 0), dtype=torch.bool)
    elif mask == 2:
        args["attn_mask"] = torch.tensor(rng.standard_normal((L, S)), dtype=torch.float32)
    return (t(L, N, E), t(S, N, kdim), t(S, N, vdim)), args


@pytest.mark.parametrize("index", range(30))
def test_multi_head_attention_forward_matches_torch(index):
    rng = np.random.default_rng(100 + index)
    (q, k, v), args = draw(rng)
    tensors = [q, k, v] + [a for a in args.values() if isinstance(a, torch.Tensor) and a.requires_grad]
    results = []
    for fn in (F.multi_head_attention_forward, mt.multi_head_attention_forward):
        out, w = fn(q, k, v, **args)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(index))
        grads = torch.autograd.grad((out * g).sum(), tensors)
        results.append((out, w, grads))
    (to, tw, tg), (mo, mw, mg) = results
    torch.testing.assert_close(mo, to, rtol=1e-5, atol=1e-5)
    if args["need_weights"]:
        torch.testing.assert_close(mw, tw, rtol=1e-5, atol=1e-6)
    else:
        assert mw is None and tw is None
    for a, b in zip(mg, tg):  # relative to the gradient's scale (sums of many terms)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5 * max(1.0, float(b.abs().max())))


def test_replace_attention_in_a_transformer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    ref = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0,
                                                           batch_first=True), 2, enable_nested_tensor=False)
    ref.load_state_dict(model.state_dict())
    params_before = {n: p for n, p in model.named_parameters()}
    keys_before = list(model.state_dict())
    replaced = mt.replace_attention(model)
    assert sorted(replaced) == ["layers.0.self_attn", "layers.1.self_attn"]
    assert all(isinstance(m.self_attn, mt.MultiheadAttention) for m in model.layers)
    assert list(model.state_dict()) == keys_before
    for n, p in model.named_parameters():
        assert p is params_before[n], n  # the same Parameter objects: optimisers built before still work
    x = torch.randn(3, 5, 16)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    torch.testing.assert_close(model(x, src_key_padding_mask=mask), ref(x, src_key_padding_mask=mask),
                               rtol=1e-5, atol=1e-5)
    model(x, src_key_padding_mask=mask).square().sum().backward()
    ref(x, src_key_padding_mask=mask).square().sum().backward()
    for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5, msg=n)
    model.eval(), ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)


def test_replace_attention_passes_options_and_refuses_the_module_itself():
    model = nn.Sequential(nn.Linear(8, 8))
    model.attn = nn.MultiheadAttention(8, 2, kdim=3, vdim=5)
    replaced = mt.replace_attention(model, precision="bfloat16")
    assert list(replaced) == ["attn"] and model.attn.precision == "bfloat16"
    assert model.attn.kdim == 3 and model.attn.vdim == 5
    with pytest.raises(ValueError, match=r"replace_attention\] model: an nn.MultiheadAttention itself"):
        mt.replace_attention(nn.MultiheadAttention(8, 2))
    assert mt.replace_attention(nn.Linear(2, 2)) == {}
