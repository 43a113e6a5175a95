#!/usr/bin/python3
"""mha.torch.attention on a packed batch (cu_seqlens) against the same sequences run one by one and
against the padded batch, forward and forward+backward, at one thread (or --threads).

    flock /tmp/mha-bench.lock /usr/bin/python3 bench/attention_variants.py
    /usr/bin/python3 bench/attention_variants.py --reps 5 --causal 0

What is measured (docs/performance.md keeps the numbers)
- A batch of 8 sequences of at most 1024 rows whose lengths average 40% of the longest (fixed
  lengths below), h8 d64, causal by default. Three ways to compute the same attention:
  packed:     one mha.torch.attention call on (T, H, d) rows with cu_seqlens (T = the sum of lengths);
  one by one: one mha.torch.attention call per sequence, (1, L_b, H, d);
  padded:     every sequence padded to 1024 rows, (B, 1024, H, d), through
              mha.torch.scaled_dot_product_attention with a boolean mask (causal and the keys past each
              length: the key padding mask), as a padded batch is computed without cu_seqlens.
- forward: under torch.no_grad(); fwd+bwd: on inputs that require grad, then backward of out.sum().
  Median of --reps calls after 2 warm-up calls, in ms; torch.set_num_threads(n) and
  mha.set_num_threads(n) with n = --threads (1 by default).
- Targets: packed <= 1.1x one by one, packed <= 0.5x padded.
"""
import argparse
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(pathlib.Path(os.environ.get("MHA_BUILD", HERE.parent / "build")) / "python"))

import torch  # noqa: E402

import mha  # noqa: E402
import mha.torch  # noqa: E402

# Mean 412.5 = 40% of the longest, 1024.
LENGTHS = [1024, 720, 560, 400, 300, 120, 60, 116]
H, D, LMAX = 8, 64, 1024


def median_ms(fn, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--causal", type=int, default=1, help="1: causal (default), 0: full attention per sequence")
    ap.add_argument("--threads", type=int, default=1, help="threads of torch and mha (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mha.set_num_threads(args.threads)
    causal = bool(args.causal)
    torch.manual_seed(0)
    T = sum(LENGTHS)
    cu = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0)), dtype=torch.int32)
    q, k, v = (torch.randn(T, H, D) for _ in range(3))
    # The padded batch: (B, LMAX, H, d) for sdpa as (B, H, L, d); keep[b, 0, i, j] = j < len_b (and j <= i).
    B = len(LENGTHS)
    qp, kp, vp = (torch.zeros(B, H, LMAX, D) for _ in range(3))
    for b, (s, n) in enumerate(zip(cu[:-1].tolist(), LENGTHS)):
        for src, dst in ((q, qp), (k, kp), (v, vp)):
            dst[b, :, :n] = src[s:s + n].transpose(0, 1)
    keep = torch.arange(LMAX)[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, S)
    keep = keep[:, None, None, :].expand(B, 1, LMAX, LMAX)
    if causal:
        keep = keep & torch.ones(LMAX, LMAX, dtype=torch.bool).tril()
    keep = keep.contiguous()

    def packed(q, k, v):
        return mha.torch.attention(q, k, v, causal=causal, cu_seqlens=cu, max_seqlen=LMAX)

    def one_by_one(q, k, v):
        return [mha.torch.attention(q[None, s:e], k[None, s:e], v[None, s:e], causal=causal)
                for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())]

    def padded(q, k, v):
        return mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    def forward(fn, inputs):
        def run():
            with torch.no_grad():
                fn(*inputs)
        return run

    def training(fn, inputs):
        def run():
            xs = [x.detach().requires_grad_() for x in inputs]
            out = fn(*xs)
            total = sum(o.sum() for o in out) if isinstance(out, list) else out.sum()
            total.backward()
        return run

    print(f"B{B} lengths {LENGTHS} (mean {T / B:.1f} = {T / B / LMAX:.0%} of {LMAX}) h{H} d{D} "
          f"{'causal' if causal else 'full'}, {args.threads} thread(s), median of {args.reps} (ms)")
    print("| direction | packed | one by one | padded | packed / one by one | packed / padded |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, wrap in (("forward", forward), ("fwd+bwd", training)):
        a = median_ms(wrap(packed, (q, k, v)), args.reps)
        b = median_ms(wrap(one_by_one, (q, k, v)), args.reps)
        c = median_ms(wrap(padded, (qp, kp, vp)), args.reps)
        print(f"| {name} | {a:.2f} | {b:.2f} | {c:.2f} | {a / b:.2f}x | {a / c:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
