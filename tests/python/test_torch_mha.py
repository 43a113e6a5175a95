"""mha.TorchMultiheadAttention against PyTorch 1.13's nn.MultiheadAttention.

Each case draws a module (heads, widths, kdim/vdim, bias, bias_k/bias_v,
add_zero_attn, batch_first or not, batched or not), random parameters, and
masks in every form PyTorch takes (boolean and float key padding masks; 2D
and 3D, boolean and float attention masks; causal, aligned top-left or
bottom-right), writes the state dict with the spec's safetensors writer, and
loads mha's module from that file. Three comparisons per case:
- mha vs nn.MultiheadAttention on every entry PyTorch gives a number for
  (PyTorch gives NaN for a query whose every key is masked, issue 41508);
- PyTorch's NaNs are exactly the rows torch_mha_reference calls fully masked,
  so the two agree on what "fully masked" means;
- mha vs torch_mha_reference (float64) everywhere, fully masked rows included.
Tolerance: |ours - peer| <= 1e-5 |peer| + 1e-6 max|peer| for outputs (two
float32 summation orders; the measured worst is under 5e-7 max|peer|), and
1e-5 |peer| + 1e-6 for weights.
"""
import collections

import numpy as np
import pytest
import torch

import mha
from torch_mha_cases import draw_case, reference_masks, run_reference, to_batch_first, torch_masks, torch_module
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

TORCH_1 = torch.__version__.startswith("1.")

RTOL = 1e-5
SCALE_ATOL = 1e-6


# Worst |ours - peer| / max|peer| seen, per comparison (printed with pytest -s).
WORST = {}


def assert_close(got, want, what, weights=False):
    want = np.asarray(want, dtype=np.float64)
    scale = 1.0 if weights else max(np.max(np.abs(want), initial=0.0), 1e-30)
    err = np.abs(got - want)
    excess = err - (RTOL * np.abs(want) + SCALE_ATOL * scale)
    assert not np.any(excess > 0), f"{what}: worst excess {excess.max():.3g} (scale {scale:.3g})"
    key = what.split(" E")[0]
    WORST[key] = max(WORST.get(key, 0.0), float(np.max(err, initial=0.0)) / scale)


def causal_arg(c):
    return {"none": False, "top_left": True, "bottom_right": mha.Causal.BOTTOM_RIGHT}[c.causal]


def policy_arg(c):
    return {"zeros": mha.FullyMaskedRows.ZEROS, "uniform": mha.FullyMaskedRows.UNIFORM}[c.policy]


def run_case(rng, path, grouped=False, kernel=None):
    c = draw_case(rng, grouped)
    torch_mod, state = torch_module(rng, c, path)
    ours = mha.TorchMultiheadAttention.from_safetensors(
        path, c.H, batch_first=c.batch_first, add_zero_attn=c.add_zero_attn,
        num_kv_heads=c.Hkv if grouped else None, fully_masked_rows=policy_arg(c))
    ours.eval()
    if kernel is not None:
        ours.kernel = kernel
    a = c.arrays
    out, w = ours(a["query"], a["key"], a["value"], key_padding_mask=a["kpm"],
                  need_weights=c.need_weights, attn_mask=a["attn"],
                  average_attn_weights=c.average, is_causal=causal_arg(c))
    desc = c.describe()
    assert np.isfinite(out).all(), desc
    kpm, attn = torch_masks(c)
    with torch.no_grad():
        t_out, t_w = torch_mod(torch.from_numpy(a["query"]), torch.from_numpy(a["key"]),
                               torch.from_numpy(a["value"]), key_padding_mask=kpm,
                               need_weights=c.need_weights, attn_mask=attn,
                               average_attn_weights=c.average)
    t_out = t_out.numpy()
    assert out.shape == t_out.shape, desc
    # A query with a fully masked head: PyTorch gives NaN (1.13; 2.x with weights or on its fast path)
    # or zeros for that head (2.x through its SDPA), mha what its policy says (checked against the
    # reference below). Elsewhere PyTorch's output is the peer.
    keep, bias = reference_masks(c)
    empty = ~(keep & torch.isfinite(bias)).any(-1).numpy()  # (B, H, L)
    empty_rows = empty.any(axis=1)                          # (B, L), batch-first
    rows = empty_rows[0] if c.unbatched else empty_rows if c.batch_first else empty_rows.T
    finite = np.isfinite(t_out) & ~rows[..., None]
    assert_close(out[finite], t_out[finite], "output vs nn.MultiheadAttention " + desc)

    ref_out, ref_w = run_reference(c, state)  # batch-first, per head
    nan_rows = ~np.all(np.isfinite(to_batch_first(c, t_out)), axis=-1)
    if TORCH_1:  # PyTorch 1.13's NaN rows are exactly the queries with a fully masked head
        assert np.array_equal(nan_rows, empty_rows), "NaN rows differ: " + desc
    else:
        assert not (nan_rows & ~empty_rows).any(), "NaN rows outside the fully masked ones: " + desc
    assert_close(to_batch_first(c, out), ref_out, "output vs reference " + desc)

    if not c.need_weights:
        assert w is None and t_w is None, desc
        return c, finite
    t_w = t_w.numpy()
    ref_w = ref_w.mean(axis=1) if c.average else ref_w
    ref_w = ref_w[0] if c.unbatched else ref_w
    assert w.shape == t_w.shape == ref_w.shape, desc
    assert np.isfinite(w).all(), desc
    fin_w = np.isfinite(t_w)
    assert_close(w[fin_w], t_w[fin_w], "weights vs nn.MultiheadAttention " + desc, weights=True)
    assert_close(w, ref_w, "weights vs reference " + desc, weights=True)
    return c, finite


def test_parity_with_nn_multihead_attention_on_random_cases(tmp_path):
    rng = np.random.default_rng(1313)
    seen = collections.Counter()
    for _ in range(500):
        c, finite = run_case(rng, str(tmp_path / "w.safetensors"))
        seen.update([f"kpm {c.kpm_kind}", f"attn {c.attn_kind}", f"causal {c.causal}",
                     f"batch_first {c.batch_first}", f"weights {c.need_weights}",
                     f"average {c.average}", f"policy {c.policy}"])
        seen.update(k for k, on in [("bias_kv", c.bias_kv), ("zero_attn", c.add_zero_attn),
                                    ("unbatched", c.unbatched), ("no bias", not c.bias),
                                    ("kdim", c.kdim != c.E), ("fully masked", not finite.all()),
                                    ("Q != K", c.L != c.S)] if on)
    print("\nworst |ours - peer| / max|peer|:", {k: f"{v:.2e}" for k, v in sorted(WORST.items())})
    # Every option, and rows PyTorch gives NaN for, drawn many times.
    assert min(seen.values()) >= 40, seen
    assert len(seen) == 26, seen  # 19 option values + 7 flags


def test_grouped_query_attention_matches_torch_with_repeated_kv_heads(tmp_path):
    # PyTorch 1.13 has no grouped-query attention; the peer is its module
    # with each kv head's weights repeated for the query heads that read it,
    # and the float64 reference that repeats the projected kv heads.
    rng = np.random.default_rng(99)
    grouped = 0
    for _ in range(200):
        c, _ = run_case(rng, str(tmp_path / "w.safetensors"), grouped=True)
        grouped += c.Hkv < c.H
    assert grouped >= 100


@pytest.mark.parametrize("kernel", [mha.Kernel.REFERENCE, mha.Kernel.BLAS, mha.Kernel.FUSED])
def test_every_kernel_matches_pytorch(tmp_path, kernel):
    rng = np.random.default_rng(5)
    for i in range(60):
        run_case(rng, str(tmp_path / "w.safetensors"), grouped=i % 3 == 0, kernel=kernel)


def test_self_attention_through_pytorchs_fast_path():
    # query is key is value, batch_first, eval, no grad, even heads, biases:
    # 1.13 then runs _native_multi_head_attention, a different code path.
    rng = np.random.default_rng(8)
    for trial in range(10):
        E, H, B, L = 16, 4, 3, int(rng.integers(2, 20))
        torch.manual_seed(trial)
        m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape) * 0.5)
        x = torch.randn(B, L, E)
        kpm = torch.from_numpy(rng.random((B, L)) < 0.3)
        kpm[:, 0] = False  # no fully masked row: the fast path's value for one is its own
        with torch.no_grad():
            t_out, t_w = m(x, x, x, key_padding_mask=kpm if trial % 2 else None)
        ours = mha.TorchMultiheadAttention.from_state_dict(m.state_dict(), H, batch_first=True).eval()
        out, w = ours(x, x, x, key_padding_mask=kpm.numpy() if trial % 2 else None)
        assert_close(out, t_out.numpy(), "fast path output")
        assert_close(w, t_w.numpy(), "fast path weights", weights=True)


def test_state_dict_of_tensors_and_round_trip():
    m = torch.nn.MultiheadAttention(12, 3, kdim=5, vdim=7, add_bias_kv=True)
    # Parameters that require grad are read through .detach().
    ours = mha.TorchMultiheadAttention.from_state_dict(dict(m.named_parameters()), 3, batch_first=False)
    assert (ours.embed_dim, ours.num_heads, ours.kdim, ours.vdim) == (12, 3, 5, 7)
    assert ours.bias and ours.bias_kv and not ours.batch_first and ours.training
    back = ours.state_dict()
    assert sorted(back) == sorted(m.state_dict())
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
