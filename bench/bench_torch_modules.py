#!/usr/bin/python3
"""mha.torch.MultiheadAttention against torch.nn.MultiheadAttention, as a PyTorch
user calls them: the drop-in inside a model, batch_first, need_weights=False.

    /usr/bin/python3 bench/bench_torch_modules.py            # 1 and 2 threads (~6 min on 2 cores)
    /usr/bin/python3 bench/bench_torch_modules.py --threads 1 --reps 5

What is measured
- forward: one call under torch.no_grad() in eval mode; fwd+bwd: a training-mode
  call (dropout 0) on inputs that require grad, then backward of output.sum().
  Median of --reps calls after 3 warm-up calls, in ms.
- Each side runs in its own process, once with the default OpenMP wait policy
  and once with OMP_WAIT_POLICY=PASSIVE, and is credited with the better of
  the two for each row (torch 1.13 at 2 threads needs PASSIVE, or its OpenMP
  and OpenBLAS pools fight).
- Both modules are built with torch's default initialisation and biases
  (PyTorch 1.13's fast path crashes only with bias=False); eval-mode forward
  calls under no_grad take torch's fused fast path where it applies.
- speedup: torch's ms over mha.torch's ms (> 1: mha is faster).
- overhead: the toy call (B2 L4 E100 h5) through mha.torch.MultiheadAttention
  against the same call through mha's own binding (mha.TorchMultiheadAttention,
  numpy in and out), both eval, no grad: the microseconds the torch layer adds.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
BUILD = pathlib.Path(os.environ.get("MHA_BUILD", HERE.parent / "build"))
SHAPES = [(32, 65, 192, 3), (32, 197, 384, 6), (8, 128, 768, 12), (8, 512, 768, 12)]
IMPLS = ("torch", "mha.torch")


def child(impl, threads, reps):
    sys.path.insert(0, str(BUILD / "python"))
    import torch
    from torch import nn
    import mha
    import mha.torch as mt

    torch.set_num_threads(threads)
    mha.set_num_threads(threads)
    rows = []

    def median(f):
        for _ in range(3):
            f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2] * 1e3

    for B, L, E, h in SHAPES:
        torch.manual_seed(0)
        cls = mt.MultiheadAttention if impl == "mha.torch" else nn.MultiheadAttention
        m = cls(E, h, batch_first=True)
        x = torch.randn(B, L, E)
        xg = x.clone().requires_grad_(True)

        def forward():
            with torch.no_grad():
                m(x, x, x, need_weights=False)

        def train_step():
            out, _ = m(xg, xg, xg, need_weights=False)
            out.sum().backward()

        m.eval()
        fwd = median(forward)
        m.train()
        fb = median(train_step)
        rows.append({"shape": f"B{B} L{L} E{E} h{h}", "fwd": fwd, "fwdbwd": fb})
    overhead = None
    if impl == "mha.torch":
        torch.manual_seed(0)
        m = mt.MultiheadAttention(100, 5, batch_first=True).eval()
        x = torch.randn(2, 4, 100)
        core = mha.TorchMultiheadAttention.from_state_dict(
            {k: v.numpy() for k, v in m.state_dict().items()}, 5, batch_first=True)
        core.eval()
        xn = x.numpy()

        def loop(f, n=2000):
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(n):
                    f()
                best = min(best, (time.perf_counter() - t) / n)
            return best * 1e6

        def via_torch():
            with torch.no_grad():
                m(x, x, x, need_weights=False)

        loop(via_torch, 200)
        overhead = {"torch_us": loop(via_torch), "core_us": loop(lambda: core(xn, xn, xn, need_weights=False))}
    print(json.dumps({"rows": rows, "overhead": overhead}))


def run_child(impl, threads, policy, reps):
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, __file__, "--child", impl, str(threads), str(reps)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    for t in args.threads:
        if t < 1:
            ap.error(f"--threads: {t} is not positive")
    best = {}
    overhead = None
    for t in args.threads:
        for impl in IMPLS:
            for policy in (None, "PASSIVE"):
                sys.stderr.write(f"\r\033[K[{impl}, {t} thread(s), OMP_WAIT_POLICY={policy or 'default'}]")
                sys.stderr.flush()
                r = run_child(impl, t, policy, args.reps)
                if r["overhead"] and t == args.threads[0] and policy is None:
                    overhead = r["overhead"]
                for row in r["rows"]:
                    for k in ("fwd", "fwdbwd"):
                        key = (t, impl, row["shape"], k)
                        best[key] = min(best.get(key, float("inf")), row[k])
    sys.stderr.write("\r\033[K")
    print("mha.torch.MultiheadAttention vs torch.nn.MultiheadAttention (torch "
          f"{__import__('torch').__version__}), batch_first, need_weights=False, ms (median of {args.reps}),")
    print("each side in its own process at its better OpenMP wait policy; speedup = torch / mha.torch")
    print()
    print("| threads | shape | torch fwd | mha.torch fwd | speedup | torch fwd+bwd | mha.torch fwd+bwd | speedup |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for t in args.threads:
        for B, L, E, h in SHAPES:
            s = f"B{B} L{L} E{E} h{h}"
            tf, mf = best[(t, "torch", s, "fwd")], best[(t, "mha.torch", s, "fwd")]
            tb, mb = best[(t, "torch", s, "fwdbwd")], best[(t, "mha.torch", s, "fwdbwd")]
            print(f"| {t} | {s} | {tf:.2f} | {mf:.2f} | {tf / mf:.2f}x | {tb:.2f} | {mb:.2f} | {tb / mb:.2f}x |")
    if overhead:
        print()
        print(f"toy call (B2 L4 E100 h5, eval, no grad, {args.threads[0]} thread(s)): mha.torch "
              f"{overhead['torch_us']:.1f} us, mha's own binding {overhead['core_us']:.1f} us: the torch layer "
              f"adds {overhead['torch_us'] - overhead['core_us']:.1f} us")


if __name__ == "__main__":
    main()
