#!/usr/bin/python3
"""mha against its peers, in one run: PyTorch 1.13's nn.MultiheadAttention
(eval, zeroed biases, its fast path where it applies), the d2l chapter's PyTorch
code (tests/python/seed_reference.py), ONNX Runtime's com.microsoft.MultiHeadAttention
graph with mha's weights (bench/ort_peer.py; optional: skipped with a message
when the torch 2.x environment (build-venv) lacks onnx or onnxruntime: see that file),
and a 4096x4096 sgemm as the machine's roofline, at 1 and 2 threads.

    /usr/bin/python3 bench/bench.py            # everything (~5 min on 2 cores)
    /usr/bin/python3 bench/bench.py --quick    # fewer repeats, no L16384 peers
    /usr/bin/python3 bench/bench.py --decode   # only the decode cases (bench/bench_decode.py)
    /usr/bin/python3 bench/bench.py --torch-modules   # mha.torch's drop-in against torch's module
    /usr/bin/python3 bench/bench.py --torch2   # against torch 2.13's SDPA, module, FlexAttention, ORT

What is measured
- ms: median wall time of one forward call (after a warm-up call), inputs
  already in memory. mha is called from Python: its time includes the
  binding's copy of the inputs into C++ tensors.
- GFLOP/s: the usual count, projections 2B(Q Dq D + K Dk D + K Dv D + Q D D)
  plus attention 4 B h Q K (D/h), over the time. Padded cases use the
  unpadded count, so their rate is "effective". The training step (forward,
  then backward of sum(output), dropout 0, training mode) counts 3x that.
- % sgemm: GFLOP/s over torch.mm's 4096x4096 rate at the same thread count,
  measured in this run just before and after each case (the larger of the
  two), so that load from other processes drifts out of the ratio.
- % peak: GFLOP/s over the machine's float32 FMA peak at the same thread
  count, measured in this run by a register-only loop of fused
  multiply-adds on the instruction set mha's GEMM uses (mha._core._fma_peak,
  src/cpu/gemm/fma_peak.h), at the start and at the end (the larger counts).
  bfloat16 rows are held to the same float32 figure (no AMX peak is
  measured: on an AMX machine its tiles' peak is 16x that per core).
- speedup: the peer's ms over mha's ms (> 1: mha is faster); for mha's
  bfloat16 mode (precision="bf16"), mha's float32 ms over its ms.
- padding target: besides the two separate cases (timed minutes apart), mha's
  padded and unpadded calls alternate on one module, and the median of the
  per-round ratios is the figure compared with the target.
- OpenBLAS threads: mha sets OpenBLAS's own pool to one thread (it runs its
  products on its own threads); before each PyTorch or numpy case this script
  sets it back to the case's thread count.
- peak MB: in a fresh child process per (case, implementation), at 1
  thread: the peak resident set (VmHWM, reset through /proc/self/clear_refs)
  minus the resident set after the imports and before the inputs are made.
  So it counts inputs, weights, outputs and all working memory of one call.
  Python's own allocations for the inputs are included.

OpenBLAS: PyTorch and the torch.mm roofline use OpenBLAS; mha does not (its
products run on its own GEMM, src/cpu/gemm), so mha is measured as a user
has it whatever OPENBLAS_CORETYPE says. OpenBLAS 0.3.21 does not know some
recent Xeons and falls back to its generic "Prescott" kernels (about 5x
slower); when it would, this script re-runs itself with OPENBLAS_CORETYPE set
to the best kernel set the CPU supports, so that the peers and the roofline
are measured at their best, and prints that it did.
"""
import argparse
import ctypes
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = pathlib.Path(os.environ.get("MHA_BUILD", ROOT / "build"))


def openblas():
    return ctypes.CDLL("libopenblas.so.0")


def ensure_openblas_core():
    if os.environ.get("OPENBLAS_CORETYPE"):
        return None
    lib = openblas()
    lib.openblas_get_corename.restype = ctypes.c_char_p
    core = lib.openblas_get_corename().decode()
    flags = open("/proc/cpuinfo").read()
    best = "SkylakeX" if " avx512f" in flags else "Haswell" if " avx2" in flags else None
    if core.lower() in ("prescott", "core2", "nehalem") and best:
        env = dict(os.environ, OPENBLAS_CORETYPE=best, MHA_BENCH_NOTE=f"OpenBLAS chose {core}")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    return core


CASES = {
    # name: (B, Q, K, Dq, Dk, Dv, D, h, kind); kind: self / cross / toy
    "toy B2 Q4 K6 D100 h5": (2, 4, 6, 100, 100, 100, 100, 5, "toy"),
    "B8 L512 D768 h12": (8, 512, 512, 768, 768, 768, 768, 12, "self"),
    "B8 L512 D768 h12 pad40%": (8, 512, 512, 768, 768, 768, 768, 12, "pad"),
    "B1 L4096 D512 h8": (1, 4096, 4096, 512, 512, 512, 512, 8, "self"),
    "B1 L16384 D256 h4": (1, 16384, 16384, 256, 256, 256, 256, 4, "self"),
    "cross B4 Q128 K1024": (4, 128, 1024, 512, 256, 384, 512, 8, "cross"),
    "train B8 L512 D768 h12": (8, 512, 512, 768, 768, 768, 768, 12, "train"),
}
BF16 = "mha precision=bf16"
IMPLS = ["mha", BF16, "torch.nn.MultiheadAttention", "the d2l chapter (PyTorch)", "onnxruntime"]
ORT = "onnxruntime"
# The forward cases ONNX Runtime runs (its graph: bench/ort_peer.py).
ORT_CASES = ("B8 L512 D768 h12", "B8 L512 D768 h12 pad40%", "B1 L4096 D512 h8", "B1 L16384 D256 h4")


def flops(B, Q, K, Dq, Dk, Dv, D, h, kind=None):
    forward = 2 * B * (Q * Dq * D + K * Dk * D + K * Dv * D + Q * D * D) + 4 * B * h * Q * K * (D // h)
    return 3 * forward if kind == "train" else forward  # backward: two products per forward one


def pad_lengths(B, K):
    # Valid lengths averaging 40% of K, spread from 15% to 60%.
    fr = [0.15, 0.25, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6]
    return [max(1, round(K * fr[i % len(fr)])) for i in range(B)]


def make_inputs(case, np):
    B, Q, K, Dq, Dk, Dv, D, h, kind = CASES[case]
    rng = np.random.default_rng(0)
    if kind == "toy":  # the d2l chapter's check: X = ones(2, 4, 100), keys = values = ones(2, 6, 100)
        X = np.ones((B, Q, Dq), np.float32)
        Y = np.ones((B, K, Dk), np.float32)
        return X, Y, Y, np.array([3, 2], np.float32)
    if kind in ("self", "pad", "train"):
        X = rng.standard_normal((B, Q, Dq), dtype=np.float32)
        lens = np.array(pad_lengths(B, K), np.float32) if kind == "pad" else None
        return X, X, X, lens
    return (rng.standard_normal((B, Q, Dq), dtype=np.float32),
            rng.standard_normal((B, K, Dk), dtype=np.float32),
            rng.standard_normal((B, K, Dv), dtype=np.float32), None)


def make_callable(case, impl, inputs):
    """A zero-argument function running one forward call of `impl`."""
    import numpy as np
    import torch
    B, Q, K, Dq, Dk, Dv, D, h, kind = CASES[case]
    X, Kx, Vx, lens = inputs
    train = kind == "train"
    if impl in ("mha", BF16):
        import mha
        m = mha.MultiHeadAttention(D, h, 0.0, False, precision="bf16" if impl == BF16 else "float32").train(train)
        if not train:
            return lambda: m(X, Kx, Vx, lens)
        ones = np.ones((B, Q, D), np.float32)

        def step():  # forward, then backward of sum(output)
            out = m(X, Kx, Vx, lens)
            m.backward(ones)
            return out
        return step
    tq, tk, tv = (torch.from_numpy(a) for a in (X, Kx, Vx))
    if impl == "the d2l chapter (PyTorch)":
        from seed_reference import make_seed_module
        m = make_seed_module(D, h, Dq, Dk, Dv, False).train(train)
        tl = None if lens is None else torch.from_numpy(lens)

        def run():
            if train:
                m.zero_grad()
                out = m(tq, tk, tv, tl)
                out.sum().backward()
                return out
            with torch.no_grad():
                return m(tq, tk, tv, tl)
        return run
    m = torch.nn.MultiheadAttention(D, h, bias=True, batch_first=True, kdim=Dk, vdim=Dv).train(train)
    with torch.no_grad():  # bias=False crashes 1.13's fast path; zero biases instead
        for name, p in m.named_parameters():
            if "bias" in name:
                p.zero_()
    mask = None
    if lens is not None:
        mask = torch.arange(K)[None, :] >= torch.from_numpy(lens)[:, None]  # True = padding

    def run():
        if train:
            m.zero_grad()
            out = m(tq, tk, tv, key_padding_mask=mask, need_weights=False)[0]
            out.sum().backward()
            return out
        with torch.inference_mode():
            return m(tq, tk, tv, key_padding_mask=mask, need_weights=False)[0]
    return run


def paired_padding_ratio(np, budget_s):
    """mha's padded over unpadded forward time at B8 L512 D768 h12, the two
    calls alternating on the same module and inputs: the median of the
    per-round ratios, so load that changes during the run cancels out."""
    import mha
    case = "B8 L512 D768 h12 pad40%"
    X, _, _, lens = make_inputs(case, np)
    B, Q, K, Dq, Dk, Dv, D, h, kind = CASES[case]
    m = mha.MultiHeadAttention(D, h, 0.0, False).eval()
    m(X, X, X), m(X, X, X, lens)  # warm-up
    ratios = []
    t_end = time.perf_counter() + budget_s
    while len(ratios) < 5 or (time.perf_counter() < t_end and len(ratios) < 30):
        t0 = time.perf_counter()
        m(X, X, X)
        t1 = time.perf_counter()
        m(X, X, X, lens)
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    ratios.sort()
    return ratios[len(ratios) // 2]


def set_threads(n):
    import torch
    import mha
    torch.set_num_threads(n)
    mha.set_num_threads(n)
    openblas().openblas_set_num_threads(n)  # torch's products go to OpenBLAS's own pool


def time_call(fn, budget_s):
    fn()  # warm-up: lazy initialisation, page faults, thread pools
    times = []
    t_end = time.perf_counter() + budget_s
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def sgemm_rate(budget_s):
    import torch
    a = torch.randn(4096, 4096)
    b = torch.randn(4096, 4096)
    t = time_call(lambda: torch.mm(a, b), budget_s)
    return 2 * 4096 ** 3 / t / 1e9


# ---------------------------------------------------------------- memory child

def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(case, impl):
    import numpy as np
    import torch  # noqa: F401
    import mha  # noqa: F401
    set_threads(1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = rss_kb("VmRSS")
    fn = make_callable(case, impl, make_inputs(case, np))
    out = fn()
    del out
    peak = rss_kb("VmHWM")
    print(json.dumps({"peak_mb": (peak - base) / 1024}))


def measure_memory(case, impl):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, __file__, "--memory-child", case, impl],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_mb"], None


def peer_memory_estimate_mb(case):
    B, Q, K, Dq, Dk, Dv, D, h, kind = CASES[case]
    return 3 * B * h * Q * K * 4 / 2 ** 20  # scores, softmax, dropout's copy


def available_mb():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="short timing budget; skip peers at L16384")
    ap.add_argument("--cases", nargs="+", default=list(CASES), help="case names (default: all)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    ap.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS, metavar="IMPL",
                    help="implementations to run (default: all; mha always runs): " + ", ".join(IMPLS))
    ap.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime even where it is installed")
    ap.add_argument("--decode", action="store_true",
                    help="only the decode cases: few queries over a KV cache (bench/bench_decode.py)")
    ap.add_argument("--torch-modules", action="store_true",
                    help="only mha.torch.MultiheadAttention against torch.nn.MultiheadAttention, forward and "
                         "forward+backward, each in its own process (bench/bench_torch_modules.py)")
    ap.add_argument("--torch2", action="store_true",
                    help="mha against torch 2.x (SDPA, nn.MultiheadAttention, FlexAttention) and ONNX Runtime's "
                         "Python package: bench/bench_torch2.py in the torch 2.x environment (build-venv)")
    ap.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch2:
        python = os.environ.get("MHA_TORCH2_PYTHON", str(ROOT / "build-venv" / "bin" / "python"))
        cmd = [python, str(HERE / "bench_torch2.py"), "--threads", *map(str, args.threads)]
        sys.exit(subprocess.call(cmd + (["--quick"] if args.quick else [])))
    if args.torch_modules:
        # The user's module against torch's, each side in a process of its own at its better
        # OpenMP wait policy (one process would let one side's thread pool slow the other).
        cmd = [sys.executable, str(HERE / "bench_torch_modules.py"), "--threads", *map(str, args.threads)]
        if args.quick:
            cmd += ["--reps", "5"]
        return subprocess.call(cmd)

    ensure_openblas_core()
    sys.path.insert(0, str(BUILD / "python"))
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    if args.memory_child:
        return memory_child(*args.memory_child)

    import numpy as np
    import torch
    import mha
    lib = openblas()
    lib.openblas_get_corename.restype = ctypes.c_char_p
    note = os.environ.get("MHA_BENCH_NOTE")
    print(f"mha {mha.__version__}, torch {torch.__version__}, numpy {np.__version__}; "
          f"OpenBLAS core {lib.openblas_get_corename().decode()}"
          + (f" (set by OPENBLAS_CORETYPE; {note} by itself)" if note else ""))
    budget = 0.5 if args.quick else 2.0
    import ort_peer
    ort_missing = "not asked for (--no-ort)" if args.no_ort else ort_peer.why_missing()
    print(f"ONNX Runtime peer: {'skipped: ' + ort_missing if ort_missing else 'onnxruntime (Python package, build-venv)'}")
    ort_notes = {}
    if args.decode:
        import bench_decode
        return bench_decode.main(args.threads, args.quick, budget, time_call, ort_missing, np)

    jobs = []
    for t in args.threads:
        for case in args.cases:
            for impl in IMPLS:
                if impl != "mha" and impl not in args.impls:
                    continue
                if args.quick and "L16384" in case and impl != "mha":
                    continue
                if impl == ORT and (ort_missing or case not in ORT_CASES):
                    continue
                jobs.append((t, case, impl))
    results = {}
    sgemm = {}
    total = len(jobs) + len(args.threads)  # (the roofline runs are not counted)
    done = 0

    def progress(what):
        sys.stderr.write(f"\r\033[K[{done}/{total}] {what}")
        sys.stderr.flush()

    # The roofline is measured around each case (before its first and after
    # its last implementation; the larger rate counts): on a machine shared
    # with other work the sgemm rate drifts, and a ratio is only meaningful
    # between runs under the same conditions.
    roof = {}
    import mha
    fma_peak = {}
    for t in args.threads:
        progress(f"threads={t}: FMA peak")
        fma_peak[t] = mha._core._fma_peak(t, 0.3)
    for t in args.threads:
        for case in args.cases:
            impls = [impl for (tt, c, impl) in jobs if tt == t and c == case]
            if not impls:
                continue
            set_threads(t)
            progress(f"threads={t} {case}: sgemm 4096x4096 before")
            before = sgemm_rate(0.1)
            for impl in impls:
                progress(f"threads={t} {case}: {impl}")
                if impl == ORT:
                    # Checked against mha's output on the same inputs and
                    # weights first (ort_peer.time_forward raises if they differ).
                    try:
                        ms, err = ort_peer.time_forward(case, CASES[case], make_inputs(case, np), t, budget)
                        results[(t, case, impl)] = ms
                        ort_notes[(t, case)] = f"output max |diff| / max |mha| = {err:.1e}"
                    except RuntimeError as e:
                        results[(t, case, impl)] = None
                        ort_notes[(t, case)] = str(e)
                elif impl not in ("mha", BF16) and "L16384" in case and peer_memory_estimate_mb(case) > 0.8 * available_mb():
                    results[(t, case, impl)] = None
                else:
                    inputs = make_inputs(case, np)
                    fn = make_callable(case, impl, inputs)
                    set_threads(t)
                    results[(t, case, impl)] = time_call(fn, budget)
                    del fn, inputs
                done += 1
            set_threads(t)
            progress(f"threads={t} {case}: sgemm 4096x4096 after")
            roof[(t, case)] = max(before, sgemm_rate(0.1))
        rates = sorted(r for (tt, _), r in roof.items() if tt == t)
        sgemm[t] = rates[len(rates) // 2] if rates else sgemm_rate(budget)
        done += 1

    paired = {}
    if "B8 L512 D768 h12 pad40%" in args.cases:
        for t in args.threads:
            progress(f"threads={t} padding: padded and unpadded calls alternating")
            set_threads(t)
            paired[t] = paired_padding_ratio(np, 2 * budget)

    for t in args.threads:  # the peak again at the end: the larger counts
        progress(f"threads={t}: FMA peak again")
        again = mha._core._fma_peak(t, 0.3)
        if again["gflops"] > fma_peak[t]["gflops"]:
            fma_peak[t] = again

    memory = {}
    if not args.no_memory:
        # ONNX Runtime runs in a process of its own: its memory is not comparable (n/a).
        cases_impls = sorted({(c, i) for (_, c, i) in jobs if i != ORT})
        for n, (case, impl) in enumerate(cases_impls):
            sys.stderr.write(f"\r\033[K[memory {n + 1}/{len(cases_impls)}] {case}: {impl}")
            sys.stderr.flush()
            if impl not in ("mha", BF16) and peer_memory_estimate_mb(case) > 0.8 * available_mb():
                memory[(case, impl)] = (None, "skipped: not enough free memory")
                continue
            memory[(case, impl)] = measure_memory(case, impl)
    sys.stderr.write("\r\033[K")

    print(f"\n{'case':26} {'thr':>3} {'implementation':28} {'ms':>10} {'GFLOP/s':>8} "
          f"{'% sgemm':>8} {'% peak':>7} {'speedup':>8} {'peak MB':>9}  (% of the sgemm rate measured around the case; "
          f"% of the FMA peak)")
    for t in args.threads:
        p = fma_peak[t]
        print(f"{'FMA peak':26} {t:>3} {'register-only FMA, ' + p['isa']:28} {'':>10} {p['gflops']:>8.1f} "
              f"{'':>8} {100.0:>6.1f}%")
    for t in args.threads:
        rates = [f"{roof[(t, c)]:.0f}" for c in args.cases if (t, c) in roof]
        print(f"{'sgemm 4096x4096':26} {t:>3} {'torch.mm (OpenBLAS), median':28} {2 * 4096 ** 3 / sgemm[t] / 1e6:>10.2f} "
              f"{sgemm[t]:>8.1f} {100.0:>7.1f}% {100 * sgemm[t] / fma_peak[t]['gflops']:>6.1f}%   per case: "
              f"{' '.join(rates)} GFLOP/s")
    for case in args.cases:
        fl = flops(*CASES[case])
        for t in args.threads:
            ours = results.get((t, case, "mha"))
            for impl in IMPLS:
                if (t, case, impl) not in results:
                    continue
                ms = results[(t, case, impl)]
                mem, why = memory.get((case, impl), (None, None))
                mem_s = f"{mem:9.1f}" if mem is not None else f"{'n/a':>9}"
                if ms is None:
                    why = "failed" if impl == ORT else "skipped (memory)"
                    print(f"{case:26} {t:>3} {impl:28} {why:>10} {'':>8} {'':>8} {'':>7} {'':>8} {mem_s}")
                    continue
                rate = fl / ms / 1e9
                speed = ("" if impl == "mha" or ours is None else
                         f"{ours / ms:7.2f}x" if impl == BF16 else f"{ms / ours:7.2f}x")
                print(f"{case:26} {t:>3} {impl:28} {ms * 1e3:>10.3f} {rate:>8.1f} "
                      f"{100 * rate / roof[(t, case)]:>7.1f}% {100 * rate / fma_peak[t]['gflops']:>6.1f}% "
                      f"{speed:>8} {mem_s}")

    if ort_notes:
        print("\nONNX Runtime (com.microsoft.MultiHeadAttention; mha's time / ORT's time, same run; "
              "outputs checked first, tolerance 1e-4 x max |output|):")
        for (t, case), note in ort_notes.items():
            a, b = results.get((t, case, "mha")), results.get((t, case, ORT))
            ratio = f"{a / b:.2f}" if a and b else "n/a"
            print(f"  {case:26} threads={t}: mha/ORT = {ratio}; {note}")

    # The targets, as measured above.
    print("\nTargets (2 threads where measured, else the largest thread count):")
    t = max(args.threads)

    def pct_of(case):  # mha's rate in % of the sgemm rate measured around the case
        ms = results.get((t, case, "mha"))
        return None if ms is None else 100 * flops(*CASES[case]) / ms / 1e9 / roof[(t, case)]

    for case in ("B8 L512 D768 h12", "B1 L4096 D512 h8", "B1 L16384 D256 h4"):
        pct = pct_of(case)
        if pct is not None:
            print(f"  module forward {case}: {pct:.1f}% of sgemm (target >= 90%): "
                  f"{'met' if pct >= 90 else 'MISSED'}")
    for case, want in (("B8 L512 D768 h12", 1.3), ("B8 L512 D768 h12 pad40%", 2.0),
                       ("B1 L4096 D512 h8", 1.3), ("B1 L16384 D256 h4", 1.3)):
        a, b = results.get((t, case, "mha")), results.get((t, case, ORT))
        if a and b:
            print(f"  against ONNX Runtime, {case}: mha {b / a:.2f}x faster (target >= {want}x): "
                  f"{'met' if b / a >= want else 'MISSED'}")
    case = "B1 L16384 D256 h4"
    if (case, "mha") in memory and memory[(case, "mha")][0] is not None:
        B, Q, K, Dq, Dk, Dv, D, h, kind = CASES[case]
        bound = 2 * 4 * (B * Q * Dq + B * Q * D + 4 * D * D) / 2 ** 20 + 64
        mem = memory[(case, "mha")][0]
        print(f"  peak memory {case}: {mem:.1f} MB, bound 2 x (inputs + outputs + weights) + 64 MB = "
              f"{bound:.1f} MB: {'met' if mem <= bound else 'MISSED'}")
    a, b = results.get((t, "B8 L512 D768 h12 pad40%", "mha")), results.get((t, "B8 L512 D768 h12", "mha"))
    if a and b:
        # Also with each time scaled by the sgemm rate measured around it,
        # which takes out load that changed between the two cases.
        norm = (a * roof[(t, "B8 L512 D768 h12 pad40%")]) / (b * roof[(t, "B8 L512 D768 h12")])
        print(f"  padding (valid lengths averaging 40% of K), separate cases: {a / b:.3f} x the unpadded "
              f"time, {norm:.3f} x in sgemm-normalised time")
    if t in paired:
        print(f"  padding, padded and unpadded calls alternating (median of per-round ratios): "
              f"{paired[t]:.3f} x the unpadded time (target <= 0.7): {'met' if paired[t] <= 0.7 else 'MISSED'}")
    toy = results.get((t, "toy B2 Q4 K6 D100 h5", "mha"))
    if toy:
        print(f"  the d2l chapter's toy shape: {toy * 1e3:.4f} ms per forward call from Python "
              f"(target <= 0.02 ms): {'met' if toy <= 2e-5 else 'MISSED'}")
    for case, want in (("B8 L512 D768 h12", 1.7), ("B1 L4096 D512 h8", 1.7), ("train B8 L512 D768 h12", 1.5)):
        a, b = results.get((t, case, "mha")), results.get((t, case, BF16))
        if a and b:
            print(f"  bfloat16 mode, {case}: {a / b:.2f}x mha's float32 (target >= {want}x): "
                  f"{'met' if a / b >= want else 'MISSED'}")
    pct = pct_of("train B8 L512 D768 h12")
    if pct is not None:
        print(f"  training step B8 L512 D768 h12 (3x forward FLOPs): {pct:.1f}% of sgemm (target >= 80%): "
              f"{'met' if pct >= 80 else 'MISSED'}")


if __name__ == "__main__":
    main()
