#!/usr/bin/env python3
"""Projected forward times of mha::dist for 8-64 ranks (docs/distributed.md,
"Time model"): the formulas there evaluated for a cluster, not measured.

  /usr/bin/python3 bench/dist_projection.py [--flops 1e12] [--bandwidth 25e9] [--latency 2e-6]
"""
import argparse
import math


def one_process(B, L, N, F):
    return (8 * B * L * N * N + 4 * B * L * L * N) / F  # four projections; Q K^T and P V


def ring(B, L, N, P, F, beta, alpha, groups=1):
    """Projections of L/P rows, then P ring steps, each max(compute, transfer)."""
    S = P // groups  # ranks in each ring
    step_compute = 4 * B * (L / S) ** 2 * N / (groups * F)
    step_transfer = 8 * B * L * N / (S * groups * beta) + alpha
    t = 8 * B * L * N * N / (P * F) + S * max(step_compute, step_transfer)
    if groups > 1:  # the head groups' partial outputs added together
        t += 8 * B * (L / S) * N * (groups - 1) / groups / beta + 2 * (groups - 1) * alpha
    return t, step_compute, step_transfer


def heads(B, L, N, h, P, F, beta, alpha):
    return (one_process(B, L, N, F) * math.ceil(h / P) / h + 8 * B * L * N * (P - 1) / P / beta
            + 2 * (P - 1) * alpha)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flops", type=float, default=1e12, help="flop/s of one rank")
    ap.add_argument("--bandwidth", type=float, default=25e9, help="bytes/s of a link")
    ap.add_argument("--latency", type=float, default=2e-6, help="seconds per message")
    a = ap.parse_args()
    F, beta, alpha = a.flops, a.bandwidth, a.latency
    for B, L, N, h in [(1, 65536, 256, 4), (8, 4096, 1024, 16)]:
        print(f"B {B}, L {L}, N {N}, h {h}: one process {one_process(B, L, N, F) * 1e3:.0f} ms")
        for P in (8, 16, 32, 64):
            t, c, x = ring(B, L, N, P, F, beta, alpha)
            line = f"  P {P:2d}: ring {t * 1e3:7.1f} ms (step compute {c * 1e3:.2f} ms, transfer {x * 1e3:.2f} ms)"
            if h >= 8:
                G = min(h, P)
                line += (f"; heads {heads(B, L, N, h, G, F, beta, alpha) * 1e3:.1f} ms on {G} ranks"
                         f"; grid {G} x {P // G} {ring(B, L, N, P, F, beta, alpha, G)[0] * 1e3:.1f} ms")
            print(line)


if __name__ == "__main__":
    main()
