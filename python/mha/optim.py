"""Optimisers with PyTorch's update rules, over an mha module's parameters.

    m = mha.MultiHeadAttention(16, 4, bias=True)
    opt = mha.optim.Adam(m, lr=1e-3)          # also SGD, AdamW
    out = m(X, X, X); m.backward(grad_out)
    mha.optim.clip_grad_norm(m, max_norm=1.0)
    opt.step(); m.zero_grad()
"""
from ._core import optim as _optim

Optimizer = _optim.Optimizer
SGD = _optim.SGD
Adam = _optim.Adam
AdamW = _optim.AdamW
clip_grad_norm = _optim.clip_grad_norm

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm"]
