#!/usr/bin/python3
"""Two builds of mha, timed in one run: rounds alternate between them, so a
noisy machine drifts out of the ratios. For a refactor that should not change
speed (docs/architecture.md: the engine under both modules).

    /usr/bin/python3 bench/compare_builds.py --before /path/to/old/build --after build

Each round runs one child process per build that imports that build's mha,
warms up, and times `--calls` calls of each case (median); the report gives,
per case, the median over rounds of each build's time and of the per-round
ratio after/before (< 1: the after build is faster).
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys

CASES = {
    # name: (module, B, Q, D, heads, padded fraction or None, training)
    "textbook B8 L512 D768 h12": ("textbook", 8, 512, 768, 12, None, False),
    "textbook B8 L512 valid 20-60%": ("textbook", 8, 512, 768, 12, 0.4, False),
    "textbook B1 L4096 D512 h8": ("textbook", 1, 4096, 512, 8, None, False),
    "textbook toy B2 Q4 K6 D100 h5": ("textbook", 2, 4, 100, 5, None, False),
    "textbook training B8 L512": ("textbook", 8, 512, 768, 12, None, True),
    "drop-in fused B8 L512 D768 h12": ("dropin", 8, 512, 768, 12, None, False),
    "drop-in fused B8 L512 key padding": ("dropin", 8, 512, 768, 12, 0.4, False),
}

CHILD = r'''
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import mha
mha.set_num_threads(int(sys.argv[3]))
cases = json.loads(sys.argv[2])
calls = int(sys.argv[4])
clock = time.process_time if sys.argv[5] == "cpu" else time.perf_counter
precision = sys.argv[6]
out = {}
rng = np.random.default_rng(0)
for name, (kind, B, Q, D, h, pad, training) in cases.items():
    K = 6 if Q == 4 else Q
    X = rng.standard_normal((B, Q, D)).astype(np.float32)
    Y = X if K == Q else rng.standard_normal((B, K, D)).astype(np.float32)
    lens = None
    if pad is not None:
        lens = np.linspace(0.2 * K, 0.6 * K, B).astype(np.float32)
    if kind == "textbook":
        m = mha.MultiHeadAttention(D, h, seed=1)
        if precision != "float32":
            m.precision = precision
        if not training:
            m.eval()
        def call():
            o = m(X, Y, Y, lens)
            if training:
                m.backward(np.ones_like(o))
    else:
        s = {"in_proj_weight": rng.standard_normal((3 * D, D)).astype(np.float32) * 0.02,
             "out_proj.weight": rng.standard_normal((D, D)).astype(np.float32) * 0.02}
        m = mha.TorchMultiheadAttention.from_state_dict(s, h, batch_first=True)
        m.kernel = mha.Kernel.FUSED
        if precision != "float32":
            m.precision = precision
        m.eval()
        kpm = None
        if lens is not None:
            kpm = np.arange(K)[None, :] >= lens[:, None]
        def call():
            m(X, Y, Y, key_padding_mask=kpm, need_weights=False)
    call()
    times = []
    for _ in range(calls):
        t = clock()
        call()
        times.append(clock() - t)
    out[name] = sorted(times)[len(times) // 2]
print(json.dumps(out))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="build folder of the earlier mha (with python/)")
    ap.add_argument("--after", required=True, help="build folder of the later mha")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu", action="store_true",
                    help="time the process's CPU time (all threads) instead of wall time: steadier when other "
                         "processes load the machine, blind to idle threads")
    ap.add_argument("--cases", nargs="+", default=list(CASES), help="case names (default: all)")
    ap.add_argument("--precision", default="float32", choices=["float32", "bfloat16"],
                    help="the modules' precision (both builds must have it)")
    args = ap.parse_args()
    builds = {"before": args.before, "after": args.after}
    chosen = {c: CASES[c] for c in args.cases}
    cases = json.dumps(chosen)
    times = {b: {c: [] for c in chosen} for b in builds}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for b in order:
            path = str(pathlib.Path(builds[b]).resolve() / "python")
            res = subprocess.run([sys.executable, "-c", CHILD, path, cases, str(args.threads), str(args.calls),
                              "cpu" if args.cpu else "wall", args.precision],
                                 capture_output=True, text=True, check=True)
            for c, t in json.loads(res.stdout.strip().splitlines()[-1]).items():
                times[b][c].append(t)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{'case':36s} {'before ms':>10s} {'after ms':>10s} {'after/before':>13s}   ({args.rounds} rounds, "
          f"median of {args.calls} calls, {args.threads} threads, "
          f"{'CPU' if args.cpu else 'wall'} time, {args.precision})")
    for c in chosen:
        ratios = [a / b for a, b in zip(times["after"][c], times["before"][c])]
        print(f"{c:36s} {1e3 * statistics.median(times['before'][c]):10.3f} "
              f"{1e3 * statistics.median(times['after'][c]):10.3f} {statistics.median(ratios):13.3f}")


if __name__ == "__main__":
    main()
