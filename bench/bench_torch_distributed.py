"""mha.torch.distributed.SequenceParallel over Gloo against one process (not a test).

    flock /tmp/mha-bench.lock /usr/bin/python3 bench/bench_torch_distributed.py [--length 8192] [--causal]
        [--method ring|all_gather|both]

Times one training step (forward + backward) of the chapter's module (D 256, 4 heads, B 1) on the
whole sequence: one process with 2 threads, then SequenceParallel over 2 Gloo processes of 1 thread
each, with each --method (the point-to-point ring, the default, and the all-gather; each rank its
half of the sequence; the step's time is the slowest rank's). Every run is a
fresh process, so its peak resident memory (VmHWM from /proc/self/status) is the run's own; the
resident memory after importing torch and mha and building the inputs (VmRSS then) is printed beside
it, so the attention's own share can be read off. Prints the median of --reps steps after one warm-up.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def step_times(call, module, inputs, reps, sync=None):
    times = []
    for i in range(reps + 1):
        if sync:
            sync()
        t0 = time.perf_counter()
        out = call(*inputs)
        out.sum().backward()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
        for t in inputs[:1]:
            t.grad = None
        module.zero_grad(set_to_none=True)
    return times[1:]


def run_one(args):
    import torch
    import mha
    import mha.torch as mt
    torch.set_num_threads(args.threads)
    mha.set_num_threads(args.threads)
    torch.manual_seed(0)
    m = mt.MultiHeadAttention(args.dim, args.heads, 0.0)
    x = torch.randn(1, args.length, args.dim, requires_grad=True)
    with torch.no_grad():
        m(x[:, :8], x[:, :8], x[:, :8])
    base = status_kib("VmRSS")
    lens = torch.arange(1, args.length + 1, dtype=torch.float32)[None] if args.causal else None
    times = step_times(lambda a, b, c: m(a, b, c, lens), m, (x, x, x), args.reps)
    print(f"RESULT one {statistics.median(times):.4f} {base} {status_kib('VmHWM')}")


def run_rank(args):
    import datetime
    import torch
    import torch.distributed as dist
    import mha
    import mha.torch as mt
    import mha.torch.distributed as mtd
    rank = int(os.environ["RANK"])
    P = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=P, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(args.threads)
    mha.set_num_threads(args.threads)
    torch.manual_seed(0)
    m = mt.MultiHeadAttention(args.dim, args.heads, 0.0)
    x = torch.randn(1, args.length, args.dim)
    with torch.no_grad():
        m(x[:, :8], x[:, :8], x[:, :8])
    xs = mtd.shard(x, 1, rank, P, zigzag=args.causal).requires_grad_()
    del x
    sp = mtd.SequenceParallel(m, zigzag=args.causal, method=args.method)
    # Overlap: the time the ring's steps wait for their transfers after the block's kernel is done.
    import mha.torch_ring as ring
    waited = [0.0]
    plain_wait = ring._wait

    def timed_wait(reqs):
        t0 = time.perf_counter()
        plain_wait(reqs)
        waited[0] += time.perf_counter() - t0
    ring._wait = timed_wait
    base = status_kib("VmRSS")
    times = step_times(lambda a, b, c: sp(a, b, c, causal=args.causal), m, (xs, xs, xs), args.reps,
                       sync=dist.barrier)
    print(f"RESULT rank{rank} {statistics.median(times):.4f} {base} {status_kib('VmHWM')}", flush=True)
    if args.method == "ring":
        print(f"WAITED rank{rank} {waited[0] / (args.reps + 1) * 1e3:.1f} ms per step waiting for transfers",
              flush=True)
    dist.destroy_process_group()


def launch(args, mode, world, threads):
    base = [sys.executable, os.path.abspath(__file__), "--role", mode, "--threads", str(threads),
            "--length", str(args.length), "--dim", str(args.dim), "--heads", str(args.heads),
            "--reps", str(args.reps), "--method", args.method] + (["--causal"] if args.causal else [])
    if mode == "one":
        outs = [subprocess.run(base, capture_output=True, text=True, check=True).stdout]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen(base, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                                           MASTER_PORT=str(port))) for r in range(world)]
        outs = [p.communicate()[0] for p in procs]
        assert all(p.returncode == 0 for p in procs)
    for o in outs:
        for line in o.splitlines():
            if line.startswith("WAITED"):
                print("  " + line[len("WAITED "):])
    rows = [line.split()[1:] for o in outs for line in o.splitlines() if line.startswith("RESULT")]
    return [(name, float(t), int(b), int(h)) for name, t, b, h in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="main", choices=("main", "one", "rank"))
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--method", default="both", choices=("ring", "all_gather", "both"))
    args = ap.parse_args()
    if args.role == "one":
        return run_one(args)
    if args.role == "rank":
        return run_rank(args)
    print(f"B1 L{args.length} D{args.dim} h{args.heads} {'causal (zigzag)' if args.causal else 'full'}, "
          f"forward+backward, median of {args.reps}")
    one = launch(args, "one", 1, 2)
    t1, b1, h1 = one[0][1], one[0][2], one[0][3]
    print(f"  {'one':10s} step {t1 * 1e3:8.1f} ms   VmRSS before {b1 / 1024:7.1f} MiB   VmHWM {h1 / 1024:7.1f} MiB   "
          f"attention's own {(h1 - b1) / 1024:7.1f} MiB")
    methods = ("ring", "all_gather") if args.method == "both" else (args.method,)
    for method in methods:
        ring = launch(argparse.Namespace(**dict(vars(args), method=method)), "rank", 2, 1)
        for name, t, b, h in ring:
            print(f"  {method[:4] + ' ' + name:10s} step {t * 1e3:8.1f} ms   VmRSS before {b / 1024:7.1f} MiB   "
                  f"VmHWM {h / 1024:7.1f} MiB   attention's own {(h - b) / 1024:7.1f} MiB")
        tr = max(r[1] for r in ring)
        hr = max(r[3] for r in ring)
        own = max(r[3] - r[2] for r in ring)
        print(f"{method} / one process: time {tr / t1:.2f}x (target <= 1.15x); peak memory per rank {hr / h1:.2f}x, "
              f"attention's own {own / max(h1 - b1, 1):.2f}x (target <= 0.6x)")

if __name__ == "__main__":
    main()
