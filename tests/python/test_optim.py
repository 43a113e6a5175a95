"""mha.optim against torch.optim on the same gradients, step by step.

Both sides start from the same parameters and are handed the same random
gradients at every step; after each step the parameters and the optimiser's
buffers must agree to max |ours - torch| <= 1e-6 * max |torch| (float32
rounding of the same formulas, applied in the same order).
"""
import math

import numpy as np
import pytest
import torch

import mha

TOL = 1e-6
STEPS = 6

CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("Adam", dict(lr=1e-3)),
    ("Adam", dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)),
    ("Adam", dict(lr=1e-2, amsgrad=True)),
    ("AdamW", dict(lr=1e-2)),
    ("AdamW", dict(lr=5e-2, betas=(0.85, 0.99), weight_decay=0.2, amsgrad=True)),
]

# torch's name of each of our buffers.
BUFFERS = {"momentum_buffer": "momentum_buffer", "exp_avg": "exp_avg",
           "exp_avg_sq": "exp_avg_sq", "max_exp_avg_sq": "max_exp_avg_sq"}


def make_module(bias=True):
    m = mha.MultiHeadAttention(6, 2, bias=bias, seed=4)
    m.initialize(3, 4, 5)
    return m


def rel_err(a, b):
    b = np.asarray(b, np.float64)
    return np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30)


@pytest.mark.parametrize("name,kwargs", CONFIGS)
def test_optimiser_matches_torch(name, kwargs):
    m = make_module()
    params = {n: torch.nn.Parameter(torch.from_numpy(a.copy())) for n, a in m.state_dict().items()}
    ours = getattr(mha.optim, name)(m, **kwargs)
    theirs = getattr(torch.optim, name)(params.values(), **kwargs)
    rng = np.random.default_rng(7)
    for step in range(STEPS):
        grads = {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in params.items()}
        m.set_grads(grads)
        for n, p in params.items():
            p.grad = torch.from_numpy(grads[n].copy())
        ours.step()
        theirs.step()
        state = m.state_dict()
        buffers = ours.state()
        for n, p in params.items():
            assert rel_err(state[n], p.detach().numpy()) <= TOL, (name, step, n)
            for buf, tbuf in BUFFERS.items():
                if theirs.state[p].get(tbuf) is not None:
                    assert rel_err(buffers[f"{n}.{buf}"], theirs.state[p][tbuf].numpy()) <= TOL
    assert ours.steps == STEPS
    # Every buffer torch keeps, we keep (and no other).
    torch_buffers = {f"{n}.{b}" for n, p in params.items() for b, v in theirs.state[p].items() if b != "step" and v is not None}
    assert set(buffers) == torch_buffers


def test_optimiser_moves_the_modules_own_parameters():
    m = make_module(bias=False)
    opt = mha.optim.SGD(m, lr=0.5)
    before = m.state_dict()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 4, 3)).astype(np.float32)
    m(X, rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 5)))
    _, grads = m.backward(np.ones((2, 4, 6), np.float32))
    opt.step()
    after = m.state_dict()
    for n in before:
        np.testing.assert_allclose(after[n], before[n] - 0.5 * grads[n], rtol=1e-6, atol=1e-7)
    opt.zero_grad()
    assert all((g == 0).all() for g in m.grads().values())


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    m = make_module()
    rng = np.random.default_rng(1)
    grads = {n: rng.standard_normal(a.shape).astype(np.float32) for n, a in m.state_dict().items()}
    m.set_grads(grads)
    params = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads.values()]
    for p, g in zip(params, grads.values()):
        p.grad = torch.from_numpy(g.copy())
    total = mha.optim.clip_grad_norm(m, max_norm, norm_type)
    t_total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    assert abs(total - t_total.item()) <= 1e-6 * t_total.item()
    clipped = m.grads()
    for (n, g), p in zip(grads.items(), params):
        assert rel_err(clipped[n], p.grad.numpy()) <= TOL
    if max_norm > total:
        assert all((clipped[n] == grads[n]).all() for n in grads)


def test_optimiser_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"\[SGD\] params: the list is empty"):
        mha.optim.SGD(mha.MultiHeadAttention(4, 2), lr=0.1)
    with pytest.raises(ValueError, match=r"\[SGD\] nesterov: needs momentum > 0"):
        mha.optim.SGD(make_module(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"\[Adam\] betas\[1\]: 1.5 is not in \[0, 1\)"):
        mha.optim.Adam(make_module(), betas=(0.9, 1.5))
    with pytest.raises(ValueError, match=r"\[AdamW\] lr: -1 is not a number >= 0"):
        mha.optim.AdamW(make_module(), lr=-1)
    with pytest.raises(ValueError, match=r"norm_type: 1 is not supported"):
        mha.optim.clip_grad_norm(make_module(), 1.0, 1.0)
