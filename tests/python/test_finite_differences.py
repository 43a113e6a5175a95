"""Our analytic gradients against central finite differences in double.

The function differentiated is the seed's MultiHeadAttention (its PyTorch
code run in float64, with our parameters and our dropout mask), reduced to a
scalar L = sum(out * G). Every element of every parameter and input is moved
by +-h (h = 1e-6) and (L(+h) - L(-h)) / 2h is compared with our float32
gradient from m.backward(G). No autograd is involved: the finite
differences only evaluate the forward.

Tolerance: |ours - fd| <= 1e-5 * scale + 1e-4 * |fd|, scale the largest
|fd| of the tensor (for a bias, of its layer's weight too, see
test_backward.py). Truncation and rounding of the differences are near 1e-10
here, so the bound is float32's, which our gradients meet at about 1e-6.
"""
import numpy as np
import pytest
import torch

import mha
from training_helpers import seed_module_like

H = 1e-6


def finite_differences(f, x):
    """Central differences of scalar f() in every element of tensor x (in place)."""
    g = np.zeros(x.shape)
    flat = x.view(-1)
    with torch.no_grad():
        for i in range(flat.numel()):
            old = flat[i].item()
            flat[i] = old + H
            up = f()
            flat[i] = old - H
            down = f()
            flat[i] = old
            g.reshape(-1)[i] = (up - down) / (2 * H)
    return g


CASES = [
    # (B, Q, K, dq, dk, dv, heads, head_dim, bias, lens kind, dropout)
    (2, 3, 4, 3, 2, 5, 2, 2, True, "batch", 0.0),
    (2, 3, 4, 3, 2, 5, 2, 2, False, "query", 0.5),
    (1, 1, 1, 2, 2, 2, 1, 3, True, "none", 0.0),
    (2, 4, 5, 3, 4, 2, 3, 1, True, "query", 0.3),
    (3, 2, 3, 2, 3, 3, 1, 3, False, "batch", 0.0),
]


@pytest.mark.parametrize("case", CASES)
def test_analytic_gradients_match_finite_differences(case):
    B, Q, K, dq, dk, dv, heads, d, bias, kind, dropout = case
    rng = np.random.default_rng(sum(case[:8]))
    c = dict(num_hiddens=heads * d, num_heads=heads, bias=bias, dropout=dropout,
             queries=rng.standard_normal((B, Q, dq)).astype(np.float32),
             keys=rng.standard_normal((B, K, dk)).astype(np.float32),
             values=rng.standard_normal((B, K, dv)).astype(np.float32))
    lens = {"none": None,
            "batch": np.array([2.5, 0, 3][:B], np.float32),  # a fraction and an empty row
            "query": rng.integers(0, 2 * K + 2, size=(B, Q)).astype(np.float32) / 2}[kind]
    G = rng.standard_normal((B, Q, heads * d))

    # Our gradients, from each kernel; both see the same parameters and mask.
    ours = {}
    for kernel in (mha.Kernel.BLAS, mha.Kernel.REFERENCE):
        m = mha.MultiHeadAttention(heads * d, heads, dropout, bias, seed=3)
        m.kernel = kernel
        m(c["queries"], c["keys"], c["values"], lens)
        (gq, gk, gv), params = m.backward(G.astype(np.float32))
        ours[kernel] = dict(params, queries=gq, keys=gk, values=gv)
    mask = m.last_dropout_mask if dropout > 0 else None
    if mask is not None:
        assert (mask == 0).any() and (mask != 0).any()

    t = seed_module_like(m, c, mask, torch.float64)
    inputs = {n: torch.tensor(c[n], dtype=torch.float64) for n in ("queries", "keys", "values")}
    t_lens = None if lens is None else torch.from_numpy(lens)
    G64 = torch.from_numpy(G)

    def loss():
        return float((t(inputs["queries"], inputs["keys"], inputs["values"], t_lens) * G64).sum())

    fd = {n: finite_differences(loss, p.data) for n, p in t.named_parameters()}
    for name, x in inputs.items():
        fd[name] = finite_differences(loss, x)
    for kernel, grads in ours.items():
        assert sorted(grads) == sorted(fd)
        for name in fd:
            scale = np.abs(fd[name]).max()
            if name.endswith(".bias"):
                scale = max(scale, np.abs(fd[name.replace(".bias", ".weight")]).max())
            bound = 1e-5 * scale + 1e-4 * np.abs(fd[name])
            assert (np.abs(grads[name] - fd[name]) <= bound).all(), (
                kernel, name, np.abs(grads[name] - fd[name]).max(), scale)
