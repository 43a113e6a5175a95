"""What mha.torch's two attention functions share: mha.torch.attention
(torch_attention.py, FlashAttention's) and
mha.torch.scaled_dot_product_attention (torch_sdpa.py, PyTorch 2.x's).

Each function checks and shapes its own arguments, then hands one call of the
fused kernels (python/attention_calls.cpp, python/sdpa_calls.cpp, both on
python/attention_glue.h) to run(): through autograd when an input wants a
gradient (the call's context, kept by the autograd node, runs the backward),
else without keeping a context.
"""
import math

import torch

from . import _checks


def check_tensor(op, x, name):
    """x is a CPU torch.Tensor (an ArgumentTypeError or ValueError naming op and name otherwise)."""
    if not isinstance(x, torch.Tensor):
        raise _checks.wrong_kind(op, name, x, "a torch.Tensor")
    if x.device.type != "cpu":
        raise ValueError(f"[{op}] {name}: a tensor on {x.device}; mha.torch computes on the CPU "
                         "only (the CUDA path does not exist yet): pass x.cpu()")


def check_inputs(op, named):
    """Each (tensor, name) of named is a CPU tensor of float32, bfloat16 or float16."""
    for x, name in named:
        check_tensor(op, x, name)
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"[{op}] {name}: dtype {x.dtype}; mha computes in float32 (bfloat16 and float16 are "
                            "widened and the result narrowed back): pass x.float()")


def dropout_key(p):
    """The key of the call's dropout masks: drawn from torch's generator when p > 0 (torch.manual_seed
    repeats it), else 0. Drawn after every check, so that a refused call leaves the generator as it was."""
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item()) if p > 0 else 0


def dropout_probability(op, dropout_p):
    """dropout_p as a float in [0, 1] (a real number: an ArgumentTypeError otherwise)."""
    p = _checks.real(dropout_p, op, "dropout_p")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"[{op}] dropout_p: {p:g} is not a probability in [0, 1]")
    return p


def default_scale(width):
    """1/sqrt(width), the scale of both functions when none is given (1 for width 0)."""
    return 1.0 / math.sqrt(width) if width > 0 else 1.0


def in_dtype(out, dtype):
    """The float32 result out returned in the inputs' dtype."""
    return out if dtype == torch.float32 else out.to(dtype)


class _Call:
    """One kernel call: forward(keep) -> (out ndarray, context or None); backward(context, grad_out
    float32 tensor) -> one gradient (tensor or None) per input of run()."""

    def __init__(self, op, forward, backward):
        self.op, self.forward, self.backward = op, forward, backward


class _Function(torch.autograd.Function):
    """forward(call, *inputs) -> out by call.forward(True); backward from that call's own context.

    The context reads the inputs and the output in place (no copies), so both are saved for the
    backward: one changed in place in between makes the backward fail, as PyTorch's own functions do,
    instead of giving gradients of other values."""

    @staticmethod
    def forward(ctx, call, *inputs):
        out, ctx.context = call.forward(True)
        ctx.call = call
        out = torch.from_numpy(out)
        ctx.save_for_backward(*inputs, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        ctx.saved_tensors  # noqa: B018 -- PyTorch's check that nothing saved was changed in place
        if torch.is_grad_enabled():
            raise RuntimeError(f"[{ctx.call.op}] backward with create_graph=True: mha's attention has no double "
                               "backward; its first-order gradients are exact")
        grads = ctx.call.backward(ctx.context, grad_out.detach().float().contiguous())
        ctx.context = None
        return (None, *grads)


def run(op, inputs, forward, backward):
    """The output tensor of one call: forward(keep) -> (out ndarray, context or None) computes it;
    when grad mode is on and an input (a tensor, or None) requires grad, through autograd, with
    backward(context, grad_out) -> one gradient per input."""
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs):
        return _Function.apply(_Call(op, forward, backward), *inputs)
    return torch.from_numpy(forward(False)[0])
