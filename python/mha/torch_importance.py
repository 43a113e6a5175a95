"""mha.torch.head_importance: each head's importance to a loss (Michel et
al.'s gradient of the head gates, or the weights' confidence), for both
modules."""

import torch

from . import _checks
from .torch_chapter import MultiHeadAttention
from .torch_drop_in import MultiheadAttention


def head_importance(module, loss_fn, method="gradient"):
    """Each head's importance for `loss_fn()` (a callable that runs the model, `module` inside it,
    and returns a scalar loss), as the d2l chapter's exercise asks:
    - "gradient": |d loss / d gate| with every gate at 1 (one forward and backward);
    - "ablation": loss with the head's gate at 0 minus the loss with all gates at 1 (one forward per
      head, without gradients).
    module: an mha.torch module; its head_gates are restored afterwards. -> (num_heads,) tensor."""
    op = "mha.torch.head_importance"
    if not isinstance(module, (MultiHeadAttention, MultiheadAttention)):
        raise _checks.wrong_kind(op, "module", module, "an mha.torch module")
    if method not in ("gradient", "ablation"):
        raise ValueError(f"[{op}] method: {method!r}; wanted 'gradient' or 'ablation'")
    saved = module.head_gates
    h = module.num_heads
    try:
        if method == "gradient":
            gates = torch.ones(h, requires_grad=True)
            module.head_gates = gates
            (g,) = torch.autograd.grad(loss_fn(), gates)
            return g.abs()
        with torch.no_grad():
            module.head_gates = torch.ones(h)
            base = float(loss_fn())
            out = torch.empty(h)
            for i in range(h):
                gates = torch.ones(h)
                gates[i] = 0.0
                module.head_gates = gates
                out[i] = float(loss_fn()) - base
            return out
    finally:
        module.head_gates = saved

