#!/usr/bin/env python3
"""Prints how far MultiHeadAttention's gradients are from the seed's autograd.

Runs the random cases of tests/python/test_backward.py (same generator and
seeds) and prints, per gradient, the largest normalised error
max|x - peer| / max|peer| of ours (both kernels) and of PyTorch float32,
each against PyTorch float64. Usage (from the repository root, after
`make build`):

    PYTHONPATH=build/python /usr/bin/python3 scripts/gradient_errors.py [num_cases]
"""
import pathlib
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "python"))
warnings.filterwarnings("ignore", message="Lazy modules")

import mha  # noqa: E402
from training_helpers import random_case, seed_gradients, seed_module_like  # noqa: E402


def main():
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    worst = {}

    def record(name, who, got, want, scale):
        err = np.abs(np.asarray(got, np.float64) - want).max() / scale if scale > 0 else 0.0
        worst.setdefault(name, {}).setdefault(who, 0.0)
        worst[name][who] = max(worst[name][who], err)

    for index in range(cases):
        case = random_case(np.random.default_rng(1000 + index))  # the test's cases
        results = {}
        for kernel in (mha.Kernel.BLAS, mha.Kernel.REFERENCE):
            m = mha.MultiHeadAttention(case["num_hiddens"], case["num_heads"], case["dropout"],
                                       case["bias"], seed=index)
            m.kernel = kernel
            out = m(case["queries"], case["keys"], case["values"], case["valid_lens"])
            (gq, gk, gv), params = m.backward(case["grad_output"])
            results[kernel.name.lower()] = dict(params, output=out, queries=gq, keys=gk, values=gv)
        mask = m.last_dropout_mask if case["dropout"] > 0 else None
        peers = {}
        for dtype in (torch.float32, torch.float64):
            (tq, tk, tv), tp, tout = seed_gradients(seed_module_like(m, case, mask, dtype), case, dtype)
            peers[dtype] = dict(tp, output=tout, queries=tq, keys=tk, values=tv)
        exact = peers[torch.float64]
        for name, want in exact.items():
            scale = np.abs(want).max() if want.size else 0.0
            if name.endswith(".bias"):  # its exact gradient may be 0 (W_k.bias): use the layer's scale
                scale = max(scale, np.abs(exact[name.replace(".bias", ".weight")]).max())
            for who, got in (("blas", results["blas"][name]), ("reference", results["reference"][name]),
                             ("torch float32", peers[torch.float32][name])):
                record(name, who, got, want, scale)
    print(f"max |x - torch float64| / max |torch float64| over {cases} random cases")
    print(f"{'tensor':14} {'mha blas':>10} {'mha ref':>10} {'torch f32':>10}")
    for name in sorted(worst):
        w = worst[name]
        print(f"{name:14} {w['blas']:10.2e} {w['reference']:10.2e} {w['torch float32']:10.2e}")


if __name__ == "__main__":
    main()
