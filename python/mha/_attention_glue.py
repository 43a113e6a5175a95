"""What mha.torch's two attention functions share: mha.torch.attention
(torch_attention.py, FlashAttention's) and
mha.torch.scaled_dot_product_attention (torch_sdpa.py, PyTorch 2.x's).

Each function checks and shapes its own arguments, then calls its operator
(python/mha/_torch_ops.py: torch.library operators on torch >= 2.4, an
autograd Function before), which runs the fused kernels (python/attention_calls.cpp,
python/sdpa_calls.cpp, both on python/attention_glue.h).
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


def dropout_probability(op, dropout_p):
    """dropout_p as a float in [0, 1] (a real number: an ArgumentTypeError otherwise)."""
    p = _checks.real(dropout_p, op, "dropout_p")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"[{op}] dropout_p: {p:g} is not a probability in [0, 1]")
    return p


def softcap_value(op, softcap):
    """softcap (None or a finite real >= 0) as a float, 0 for None (off)."""
    if softcap is None:
        return 0.0
    softcap = _checks.real(softcap, op, "softcap")
    if not (softcap >= 0 and math.isfinite(softcap)):
        raise ValueError(f"[{op}] softcap: {softcap:g}; wanted a finite number >= 0 (0 or None: off)")
    return softcap


def default_scale(width):
    """1/sqrt(width), the scale of both functions when none is given (1 for width 0)."""
    return 1.0 / math.sqrt(width) if width > 0 else 1.0


def in_dtype(out, dtype):
    """The float32 result out returned in the inputs' dtype."""
    return out if dtype == torch.float32 else out.to(dtype)
