"""mha.TorchMultiheadAttention.backward against PyTorch autograd.

Each case draws a module and a call as test_torch_mha.py does (every option:
layouts, unbatched, kdim/vdim, biases, bias_k/bias_v, add_zero_attn, boolean
and float key padding and attention masks, causal both alignments, both
fully-masked policies, grouped heads), runs our training-mode forward and
backward(grad_output), and compares every gradient (query, key, value and
each parameter by PyTorch's name) two ways:

- with nn.MultiheadAttention's autograd in float32 (PyTorch 1.13), on the
  queries PyTorch gives numbers for: a query row with any fully masked head
  is NaN in PyTorch (issue 41508) and its NaN reaches every gradient, so
  PyTorch runs batch row by batch row on the other query rows, and we run
  with a grad_output that is zero on the excluded rows;
- with torch_mha_reference's autograd in float64 everywhere, fully masked
  rows included (the reference applies the policy mha does).

Grouped heads: PyTorch's module holds each kv head's rows repeated for the
query heads that read it; the gradient of a shared row is the sum of the
gradients of its copies. Dropout: PyTorch's random mask cannot be matched,
so the parity cases have dropout 0 and dropout is tested against the float64
reference fed our mask (last_dropout_mask).

Tolerance, per gradient tensor (each input's and each parameter's):
    max|ours - peer| <= 1e-5 scale + 4 max|f32 - exact|
where scale is max|peer| (for a bias, the larger of its own and its
weight's: in_proj_bias's k rows have exact gradient 0, a constant added to
every key shifting a score row by a constant), exact is the float64
reference's gradient and f32 the float32 one of the same formula, the larger
error of two summation orders (inputs as given, and batch rows, queries and
keys reversed: the same function, checked in float64) and, for the
nn.MultiheadAttention comparison, of PyTorch's float32 module itself. The
second term is FlashAttention's rule: a gradient much smaller than the terms
it sums (dP - rowsum(dP * P) cancels) keeps their float32 rounding, which
PyTorch's float32 has as much as ours. pytest -s prints the worst errors
relative to scale, and, where the first term alone would not do, the ratio
of our error to float32's (measured: at most 13 over 4,800 extra random
cases, always within the bound; within 1e-5 scale otherwise).
"""
import collections

import numpy as np
import pytest
import torch

TORCH_1 = torch.__version__.startswith("1.")

import mha
from torch_mha_cases import draw_case, reference_masks, to_batch_first, torch_masks, torch_module
from torch_mha_reference import reference_mha
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

SCALE_TOL = 1e-5
FLOOR_FACTOR = 4.0

WORST = {}


def causal_arg(c):
    return {"none": False, "top_left": True, "bottom_right": mha.Causal.BOTTOM_RIGHT}[c.causal]


def policy_arg(c):
    return {"zeros": mha.FullyMaskedRows.ZEROS, "uniform": mha.FullyMaskedRows.UNIFORM}[c.policy]


def weights_of(name):
    """The weight gradients whose scale a bias gradient is measured by."""
    return {"in_proj_bias": ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"),
            "out_proj.bias": ("out_proj.weight",)}.get(name, ())


def assert_grads_close(ours, peer, exact, f32s, what):
    """ours, peer: dicts name -> gradient array. exact: the float64
    reference's gradients for the same loss, f32s: the gradients of float32
    computations of it (the reference formula in float32, and the float32
    peer itself). Per tensor,
        max|ours - peer| <= 1e-5 scale + 4 max over f32s of max|f32 - exact|."""
    assert sorted(ours) == sorted(peer), what
    for name, want in peer.items():
        want = np.asarray(want, dtype=np.float64)
        got = ours[name]
        assert got.shape == want.shape, f"{what}: {name} shape {got.shape} vs {want.shape}"
        assert np.isfinite(got).all(), f"{what}: {name} not finite"
        scale = np.max(np.abs(want), initial=0.0)
        for w in weights_of(name):
            if w in peer:
                scale = max(scale, np.max(np.abs(peer[w]), initial=0.0))
        floor = max(np.max(np.abs(np.asarray(f32[name], np.float64) - exact[name]), initial=0.0) for f32 in f32s)
        err = np.max(np.abs(got - want), initial=0.0)
        bound = SCALE_TOL * scale + FLOOR_FACTOR * floor
        assert err <= bound, (f"{what}: grad {name}: max error {err:.3g} > {bound:.3g} "
                              f"(scale {scale:.3g}, float32 error {floor:.3g})")
        key = what.split(":")[0]
        if err > SCALE_TOL * scale:  # passed on the float32 floor: by how much
            k2 = key + " beyond 1e-5 scale: error / float32 error"
            WORST[k2] = max(WORST.get(k2, 0.0), err / floor)
        if scale > 0:
            WORST[key] = max(WORST.get(key, 0.0), err / scale)
            WORST[key + " (float32 formula)"] = max(WORST.get(key + " (float32 formula)", 0.0),
                                                    floor / scale)


def kv_expand(c):
    """Index of the grouped kv row each of PyTorch's E repeated rows copies."""
    d = c.E // c.H
    expand = torch.arange(c.H).div(c.H // c.Hkv, rounding_mode="floor")
    return (expand[:, None] * d + torch.arange(d)[None, :]).reshape(-1)


def fold_grouped(c, grads):
    """PyTorch's gradients of repeated kv rows -> gradients of the grouped rows."""
    if c.Hkv == c.H:
        return grads
    d = c.E // c.H
    Ekv = c.Hkv * d
    ex = kv_expand(c)

    def fold(g, axis):
        g = torch.from_numpy(g).double()
        out = torch.zeros(g.shape[:axis] + (Ekv,) + g.shape[axis + 1:], dtype=torch.float64)
        return out.index_add_(axis, ex, g).numpy()

    out = dict(grads)
    for n in ("k_proj_weight", "v_proj_weight"):
        out[n] = fold(grads[n], 0)
    if "in_proj_bias" in grads:
        b = grads["in_proj_bias"]
        E = c.E
        out["in_proj_bias"] = np.concatenate([b[:E], fold(b[E:2 * E], 0), fold(b[2 * E:], 0)])
    for n in ("bias_k", "bias_v"):
        if n in grads:
            out[n] = fold(grads[n], 2)
    return out


def build_ours(c, path, grouped, kernel=None, dropout=0.0, seed=0):
    ours = mha.TorchMultiheadAttention.from_safetensors(
        path, c.H, batch_first=c.batch_first, add_zero_attn=c.add_zero_attn,
        num_kv_heads=c.Hkv if grouped else None, fully_masked_rows=policy_arg(c),
        dropout=dropout, seed=seed)
    ours.train()
    if kernel is not None:
        ours.kernel = kernel
    return ours


def call_ours(ours, c):
    a = c.arrays
    return ours(a["query"], a["key"], a["value"], key_padding_mask=a["kpm"],
                need_weights=c.need_weights, attn_mask=a["attn"],
                average_attn_weights=c.average, is_causal=causal_arg(c))


def ours_grads(ours, c, grad_output):
    ours.zero_grad()
    out, _ = call_ours(ours, c)
    (gq, gk, gv), params = ours.backward(grad_output)
    assert gq.shape == c.arrays["query"].shape and gk.shape == c.arrays["key"].shape
    assert gv.shape == c.arrays["value"].shape
    grads = dict(params)
    grads.update(query=gq, key=gk, value=gv)
    return out, grads


def reference_grads(c, state, grad_output, dropout_mask=None, dtype=torch.float64, reverse=False):
    """Autograd of torch_mha_reference in `dtype`: gradients in the case's layout. reverse: the batch
    rows, the queries and the keys fed in the reverse order, the masks alike (the same function; its
    float32 sums then run in other orders)."""
    keep, bias = reference_masks(c)

    def order(t, dims):  # t reversed along dims (axes of size 1 broadcast: left as they are)
        if not reverse:
            return t
        dims = [d for d in dims if t.shape[d] > 1]
        return t.flip(dims) if dims else t

    def order_pairs(t):  # masks (B or 1, H or 1, L, S + extra): the S keys reversed, the extra ones stay last
        if not reverse:
            return t
        t = order(t, (0, -2))
        return torch.cat([t[..., :c.S].flip(-1), t[..., c.S:]], -1)

    rows = (0, 1)  # (B, L or S, E): batch rows and positions
    st = {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in state.items()}
    xs = {n: order(torch.from_numpy(to_batch_first(c, c.arrays[n])).to(dtype), rows).requires_grad_(True)
          for n in ("query", "key", "value")}
    mask = None if dropout_mask is None else order_pairs(torch.from_numpy(dropout_mask).to(dtype))
    out, _ = reference_mha(st, c.H, xs["query"], xs["key"], xs["value"], num_kv_heads=c.Hkv,
                           keep=order_pairs(keep), bias=order_pairs(bias.to(dtype)),
                           add_zero_attn=c.add_zero_attn, fully_masked=c.policy, dropout_mask=mask)
    g = order(torch.from_numpy(to_batch_first(c, grad_output)).to(dtype), rows)
    (out * g).sum().backward()
    grads = {k: v.grad.numpy() for k, v in st.items()}
    for n, x in xs.items():
        gx = order(x.grad, rows).numpy()
        grads[n] = gx[0] if c.unbatched else (gx if c.batch_first else np.swapaxes(gx, 0, 1))
    return order(out.detach(), rows).numpy(), grads


def float32_grads(c, state, grad_output, dropout_mask=None):
    """The reference's float32 gradients in two summation orders (batch rows, queries and keys as given
    and reversed): what float32 rounding alone makes of the formula, whatever order an implementation
    sums in."""
    return [reference_grads(c, state, grad_output, dropout_mask, torch.float32, reverse)[1]
            for reverse in (False, True)]


def empty_rows(c):
    """(B, H, L) bools: the (b, h, i) rows with no live key."""
    keep, bias = reference_masks(c)
    live = keep & (bias != float("-inf"))
    B, H, L = c.B, c.H, c.L
    return ~live.expand(B, H, L, -1).any(dim=-1).numpy()


def torch_grads_on_finite_rows(c, torch_mod, grad_output, empty_rows):
    """nn.MultiheadAttention's float32 autograd, batch row by batch row, on
    the query rows without a fully masked head (empty_rows (B, L): PyTorch's
    value for those is NaN on 1.13 and zeros or NaN on 2.x, by path). Returns
    (grads in the case's layout and by grouped names, the (B, L) rows used,
    the (B, L) rows PyTorch's forward gives NaN)."""
    kpm, attn = torch_masks(c)
    H, L = c.H, c.L
    q = torch.from_numpy(to_batch_first(c, c.arrays["query"]))
    k = torch.from_numpy(to_batch_first(c, c.arrays["key"]))
    v = torch.from_numpy(to_batch_first(c, c.arrays["value"]))
    g = torch.from_numpy(to_batch_first(c, grad_output))
    kpm = None if kpm is None else kpm.reshape(c.B, c.S)
    torch_mod.zero_grad(set_to_none=False)
    torch_mod.train()  # dropout is 0: train mode only keeps 1.13 off its inference fast path
    gx = {n: torch.zeros_like(x) for n, x in (("query", q), ("key", k), ("value", v))}
    used = np.zeros((c.B, L), dtype=bool)
    nan_rows = np.zeros((c.B, L), dtype=bool)

    def layout(x):  # (1, T, W) batch-first -> the module's layout
        return x if c.batch_first else x.transpose(0, 1)

    def run(b, rows):
        qb = q[b:b + 1, rows].clone().requires_grad_(True)
        kb = k[b:b + 1].clone().requires_grad_(True)
        vb = v[b:b + 1].clone().requires_grad_(True)
        am = None
        if attn is not None:
            am = attn[rows] if attn.dim() == 2 else attn[b * H:(b + 1) * H][:, rows]
        out, _ = torch_mod(layout(qb), layout(kb), layout(vb),
                           key_padding_mask=None if kpm is None else kpm[b:b + 1],
                           need_weights=False, attn_mask=am)
        return qb, kb, vb, layout(out)

    for b in range(c.B):
        with torch.no_grad():
            _, _, _, out = run(b, torch.arange(L))
        nan_rows[b] = ~torch.isfinite(out[0]).all(dim=-1).numpy()
        rows = torch.nonzero(torch.from_numpy(~empty_rows[b])).flatten()
        if len(rows) == 0:
            continue
        used[b, rows.numpy()] = True
        qb, kb, vb, out = run(b, rows)
        (out * g[b:b + 1, rows]).sum().backward()
        gx["query"][b, rows] += qb.grad[0]
        gx["key"][b] += kb.grad[0]
        gx["value"][b] += vb.grad[0]
    grads = {n: p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, np.float32)
             for n, p in torch_mod.named_parameters()}
    grads = fold_grouped(c, grads)
    for n, x in gx.items():
        x = x.numpy()
        grads[n] = x[0] if c.unbatched else (x if c.batch_first else np.swapaxes(x, 0, 1))
    return grads, used, nan_rows


def rows_mask(c, rows_bl):
    """(B, L) bools -> broadcastable to the output in the case's layout."""
    m = rows_bl[..., None].astype(np.float32)
    return m[0] if c.unbatched else (m if c.batch_first else np.swapaxes(m, 0, 1))


def run_case(rng, path, grouped=False, kernel=None, dropout=0.0):
    c = draw_case(rng, grouped)
    torch_mod, state = torch_module(rng, c, path)
    ours = build_ours(c, path, grouped, kernel, dropout, seed=int(rng.integers(1 << 30)))
    out, _ = call_ours(ours, c)
    G = rng.standard_normal(out.shape).astype(np.float32)
    desc = c.describe() + f" dropout {dropout}"

    # Everything, fully masked rows included, against the float64 reference.
    ours.zero_grad()
    out, _ = call_ours(ours, c)
    mask = ours.last_dropout_mask if dropout > 0 else None
    (gq, gk, gv), params = ours.backward(G)
    grads = dict(params, query=gq, key=gk, value=gv)
    for n, g in grads.items():
        assert np.isfinite(g).all(), f"{n} not finite: {desc}"
    _, ref = reference_grads(c, state, G, mask)
    assert_grads_close(grads, ref, ref, float32_grads(c, state, G, mask), "vs float64 reference: " + desc)

    # Rows with every head fully masked: under zeros they pass no gradient
    # to anything but out_proj's bias; under uniform, to the values only.
    empty = empty_rows(c)
    all_empty = empty.all(axis=1)
    if all_empty.any():
        _, g_empty = ours_grads(ours, c, G * rows_mask(c, all_empty))
        assert not np.any(g_empty["query"]), desc
        assert not np.any(g_empty["key"]), desc
        if c.policy == "zeros":
            assert not np.any(g_empty["value"]), desc
            for n, g in g_empty.items():
                if n not in ("out_proj.bias", "query", "key", "value"):
                    assert not np.any(g), f"{n}: {desc}"

    if dropout > 0:
        return c, empty
    # Parity with nn.MultiheadAttention where it gives numbers.
    t_grads, used, nan_rows = torch_grads_on_finite_rows(c, torch_mod, G, empty.any(axis=1))
    if TORCH_1:  # PyTorch 1.13's NaN rows are exactly the queries with a fully masked head
        assert np.array_equal(nan_rows, empty.any(axis=1)), "NaN rows differ: " + desc
    else:
        assert not (nan_rows & ~empty.any(axis=1)).any(), "NaN rows outside the fully masked ones: " + desc
    G_used = G * rows_mask(c, used)
    _, ours_used = ours_grads(ours, c, G_used)
    _, ref_used = reference_grads(c, state, G_used)
    assert_grads_close(ours_used, t_grads, ref_used, [t_grads] + float32_grads(c, state, G_used),
                       "vs nn.MultiheadAttention: " + desc)
    return c, empty


def test_the_reversed_reference_is_the_same_function(tmp_path):
    """float32_grads' second order is a permutation of the inputs, not another function: in float64 its
    output and gradients equal the reference's as given (within float64 rounding), dropout masks included."""
    rng = np.random.default_rng(99)
    for i in range(40):
        c = draw_case(rng, grouped=bool(i % 2))
        _, state = torch_module(rng, c, str(tmp_path / "w.safetensors"))
        G = rng.standard_normal(np.shape(c.arrays["query"])).astype(np.float32)  # the output's shape
        mask = None
        if i % 3 == 0:
            mask = (rng.random((c.B, c.H, c.L, c.S + c.extra)) > 0.3).astype(np.float32) / 0.7
        out, grads = reference_grads(c, state, G, mask)
        out_r, grads_r = reference_grads(c, state, G, mask, reverse=True)
        np.testing.assert_allclose(out_r, out, rtol=1e-10, atol=1e-12, err_msg=c.describe())
        for name, g in grads.items():
            np.testing.assert_allclose(grads_r[name], g, rtol=1e-10, atol=1e-12, err_msg=f"{name}: {c.describe()}")


def test_gradients_match_pytorch_autograd_on_random_cases(tmp_path):
    rng = np.random.default_rng(4242)
    seen = collections.Counter()
    for _ in range(250):
        c, empty = run_case(rng, str(tmp_path / "w.safetensors"))
        seen.update([f"kpm {c.kpm_kind}", f"attn {c.attn_kind}", f"causal {c.causal}",
                     f"batch_first {c.batch_first}", f"weights {c.need_weights}",
                     f"policy {c.policy}"])
        seen.update(k for k, on in [("bias_kv", c.bias_kv), ("zero_attn", c.add_zero_attn),
                                    ("unbatched", c.unbatched), ("no bias", not c.bias),
                                    ("kdim", c.kdim != c.E), ("fully masked", empty.any()),
                                    ("Q != K", c.L != c.S)] if on)
    print("\nworst |ours - peer| / max|peer|:", {k: f"{v:.2e}" for k, v in sorted(WORST.items())})
    assert min(seen.values()) >= 20, seen
    assert len(seen) == 24, seen  # 17 option values + 7 flags


def test_grouped_heads_gradients_sum_over_the_repeated_kv_copies(tmp_path):
    rng = np.random.default_rng(77)
    grouped = 0
    for _ in range(100):
        # The BLAS kernel, the module's default when this test was written: the fused
        # kernel's backward is held to PyTorch by test_every_kernel_backward_matches_pytorch.
        c, _ = run_case(rng, str(tmp_path / "w.safetensors"), grouped=True, kernel=mha.Kernel.BLAS)
        grouped += c.Hkv < c.H
    assert grouped >= 50


@pytest.mark.parametrize("kernel", [mha.Kernel.REFERENCE, mha.Kernel.BLAS, mha.Kernel.FUSED])
def test_every_kernel_backward_matches_pytorch(tmp_path, kernel):
    rng = np.random.default_rng(6)
    for i in range(40):
        run_case(rng, str(tmp_path / "w.safetensors"), grouped=i % 3 == 0, kernel=kernel)


def test_dropout_backward_matches_the_reference_fed_our_mask(tmp_path):
    # PyTorch's dropout mask cannot be reproduced; the float64 reference
    # multiplies its weights by ours instead. Fully masked rows included.
    rng = np.random.default_rng(31)
    with_empty = 0
    for i in range(80):
        c, empty = run_case(rng, str(tmp_path / "w.safetensors"), grouped=i % 2 == 0,
                            dropout=float(rng.choice([0.1, 0.5, 0.9])))
        with_empty += empty.any()
    assert with_empty >= 20


def test_optimisers_train_the_module_as_pytorch_trains_its_own():
    # mha.optim over the module's parameters (in_proj_weight's q/k/v rows as
    # three): 30 SGD-with-momentum steps on a regression loss follow
    # PyTorch's SGD on nn.MultiheadAttention. (Adam would not do for the
    # comparison: in_proj_bias's k rows have exact gradient 0, so both sides
    # hold rounding noise there, which Adam scales up to steps of size lr.)
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True)
    ours = mha.TorchMultiheadAttention.from_state_dict(m.state_dict(), 2, batch_first=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    target = rng.standard_normal((3, 5, 8)).astype(np.float32)
    opt = mha.optim.SGD(ours, lr=0.1, momentum=0.9)
    t_opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    tx, tt = torch.from_numpy(x), torch.from_numpy(target)
    losses = []
    for step in range(30):
        out, _ = ours(x, x, x, need_weights=False)
        losses.append(float(((out - target) ** 2).mean()))
        ours.zero_grad()
        ours.backward(2 * (out - target) / out.size)
        opt.step()
        t_out, _ = m(tx, tx, tx, need_weights=False)
        t_opt.zero_grad()
        ((t_out - tt) ** 2).mean().backward()
        t_opt.step()
    assert losses[-1] < 0.7 * losses[0], losses
    for name, value in m.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[name], value.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


def test_backward_refuses_without_a_training_forward():
    m = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    ours = mha.TorchMultiheadAttention.from_state_dict(m.state_dict(), 2, batch_first=True).eval()
    x = np.ones((1, 2, 4), np.float32)
    ours(x, x, x)
    with pytest.raises(ValueError, match="no training-mode forward"):
        ours.backward(x)
    ours.train()
    ours(x, x, x)
    with pytest.raises(ValueError, match=r"grad_output: shape \(1, 2, 3\)"):
        ours.backward(np.ones((1, 2, 3), np.float32))
