"""Checks of the pure-Python entry points' arguments (mha.plot, mha.torch).

An argument read as numbers must be numbers: a string, bytes, a dict, None or
an object is an mha.ArgumentTypeError (a TypeError and a ValueError) that
names the operation and the argument, as the compiled module's conversions
(python/bindings/convert.h) give; never a silent int("96") or float("2.5").
"""
import numbers

import numpy as np

from ._core import ArgumentTypeError


def wrong_kind(op, name, value, wanted):
    """The error for `value` given as argument `name` of `op` where `wanted` was wanted."""
    got = "None" if value is None else type(value).__name__
    return ArgumentTypeError(f"[{op}] {name}: got {got}, wanted {wanted}")


def _is_real(value):
    if isinstance(value, (str, bytes)):
        return False
    if isinstance(value, (numbers.Real, np.bool_)):
        return True
    return isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf"


def real(value, op, name):
    """A real number (int, float, numpy number or 0-d array) as a float."""
    if not _is_real(value):
        raise wrong_kind(op, name, value, "a real number (int, float or a numpy number)")
    return float(value)


def integer(value, op, name):
    """An integer (int or numpy integer) as an int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise wrong_kind(op, name, value, "an integer")
    return int(value)


def index(value, op, name, size):
    """An integer in [0, size) as an int."""
    value = integer(value, op, name)
    if not 0 <= value < size:
        raise ValueError(f"[{op}] {name}: {value}; wanted 0 <= {name} < {size}")
    return value


def flag(value, op, name):
    """True or False (a numpy bool too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise wrong_kind(op, name, value, "True or False")
    return bool(value)


def real_array(value, op, name):
    """A numpy array of bool, integer or floating dtype (a torch tensor's data)."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if value is None or isinstance(value, (str, bytes, bytearray, dict)):
        raise wrong_kind(op, name, value, "an array of numbers (bool, integer or floating)")
    try:
        a = np.asarray(value)
    except (TypeError, ValueError):  # ragged nested lists
        raise ArgumentTypeError(f"[{op}] {name}: cannot be read as a numeric array") from None
    if a.dtype.kind == "O":
        raise ArgumentTypeError(f"[{op}] {name}: cannot be read as a numeric array")
    if a.dtype.kind not in "biuf":
        raise ArgumentTypeError(f"[{op}] {name}: dtype {a.dtype} is not a real number type; "
                                "wanted bool, integer or floating")
    return a


_PRECISIONS = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def precision(value, op):
    """'float32' / 'fp32' / 'bfloat16' / 'bf16' as 'float32' or 'bfloat16'."""
    if not isinstance(value, str):
        raise wrong_kind(op, "precision", value, "a string ('float32' or 'bfloat16')")
    if value not in _PRECISIONS:
        raise ValueError(f"[{op}] precision: '{value}' is not a precision; wanted 'float32' ('fp32') "
                         "or 'bfloat16' ('bf16')")
    return _PRECISIONS[value]
