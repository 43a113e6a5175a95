"""What mha.torch's two attention functions share: mha.torch.attention
(torch_attention.py, FlashAttention's) and
mha.torch.scaled_dot_product_attention (torch_sdpa.py, PyTorch 2.x's).

Each function checks and shapes its own arguments, then calls its operator
(python/mha/_torch_ops.py: torch.library operators on torch >= 2.4, an
autograd Function before), which runs the fused kernels (python/bindings/attention_calls.cpp,
python/bindings/sdpa_calls.cpp, both on python/bindings/attention_glue.h).
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


# The float32 range the kernels compute in: a positive option below the smallest normal float32 or above
# the largest would change meaning there (1e-46 is 0, softcapping off; 1e39 is inf).
F32_TINY, F32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38


def _in_float32(op, name, x, wanted, hi=F32_MAX):
    """x > 0 as a float, refused when float32 cannot hold it (0 or inf there) or it passes hi."""
    if not F32_TINY <= x <= hi:
        where = "is 0" if x < F32_TINY else "overflows"
        raise ValueError(f"[{op}] {name}: {x:g} {where} in float32, in which mha computes; wanted {wanted}")
    return x


def softcap_value(op, softcap):
    """softcap (None or a finite real >= 0, float32-sized when positive) as a float, 0 for None (off)."""
    if softcap is None:
        return 0.0
    softcap = _checks.real(softcap, op, "softcap")
    if not (softcap >= 0 and math.isfinite(softcap)):
        raise ValueError(f"[{op}] softcap: {softcap:g}; wanted a finite number >= 0 (0 or None: off)")
    if softcap > 0:
        # (The kernels hold the cap times log2(e): above 1e38 that passes float32.)
        _in_float32(op, "softcap", softcap, "0 (off) or a number from 1.2e-38 to 1e+38", hi=1e38)
    return softcap


def positive_scale(op, scale, width):
    """scale (None: 1/sqrt(width)) as a float32-sized number > 0 (FlashAttention's softmax_scale)."""
    if scale is None:
        return default_scale(width)
    scale = _checks.real(scale, op, "scale")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"[{op}] scale: {scale:g}; wanted a finite number > 0 (1/sqrt(d) when None)")
    return _in_float32(op, "scale", scale, "a number from 1.2e-38 to 3.4e+38 (1/sqrt(d) when None)")


def check_overflow(op, out, named, scale):
    """Finite inputs must not give a NaN or infinite output (as the modules: docs/errors.md, overflow
    rows): scores or sink logits beyond float32 are an error, not a silent NaN. named: (tensor or
    None, name) of every input the call read; non-finite inputs are computed through. The inputs are
    scanned only when the output is not finite."""
    if bool(torch.isfinite(out).all()):
        return
    present = [(x, name) for x, name in named if x is not None]
    if not all(bool(torch.isfinite(x).all()) for x, _ in present):
        return
    sizes = ", ".join(f"{name} {float(x.abs().max()) if x.numel() else 0.0:.3g}" for x, name in present)
    sizes += f"; scale {scale:.3g}"
    names = ", ".join(name for _, name in present[:-1]) + " and " + present[-1][1]
    what = "scores or sink logits" if any(name == "sinks" for _, name in present) else "scores"
    raise ValueError(f"[{op}] finite {names} give {what} that overflow float32 (largest magnitudes: {sizes}); "
                     "scale them down")


def default_scale(width):
    """1/sqrt(width), the scale of both functions when none is given (1 for width 0)."""
    return 1.0 / math.sqrt(width) if width > 0 else 1.0


def in_dtype(out, dtype):
    """The float32 result out returned in the inputs' dtype."""
    return out if dtype == torch.float32 else out.to(dtype)
