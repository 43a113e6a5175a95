#!/usr/bin/env python3
"""mha against PyTorch 2.x's CPU attention and ONNX Runtime, in one run, at 1 and 2 threads.

    build-venv/bin/python bench/bench_torch2.py            # the torch 2.x line's environment
    build-venv/bin/python bench/bench_torch2.py --quick    # fewer repeats, fewer cases
    /usr/bin/python3 bench/bench.py --torch2               # the same, started from bench.py

Each side runs in its own process per thread count (torch.set_num_threads and
mha.set_num_threads to that count, OMP_NUM_THREADS too), so neither's thread
pool or wait policy is set by the other's:
- functions: mha.torch.scaled_dot_product_attention against torch's
  F.scaled_dot_product_attention (its default dispatch: the fused flash
  kernel where it applies) and FlexAttention (torch.compile'd
  flex_attention, forward only, no grad: it has no CPU backward);
- modules: mha.torch.MultiheadAttention against nn.MultiheadAttention
  (batch first, need_weights=False; forward under no_grad in eval, and
  forward + backward of sum(output) in training mode with dropout 0), and
  ONNX Runtime's com.microsoft.MultiHeadAttention graph (its Python package;
  bench/ort_peer.py's graph: bias-free projections around the op) forward.
Times are medians of warm calls (ms). Each row prints the ratio peer / mha (> 1:
mha faster) and both sides' share of the float32 FMA peak measured in this
run at that thread count (mha._core._fma_peak, a register-only loop).
FLOPs: attention 4 B H L S d (halved when causal), projections 8 B L E^2 for
the modules; a forward + backward counts 3x (2.5x for attention alone would
be closer; 3x is the usual convention).
"""
import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent

# name, kind, B, H, Hkv, L, d, causal
FUNCTION_CASES = [
    ("BERT-base B8 L512 h12 d64", 8, 12, 12, 512, 64, False),
    ("GPT-2 B8 L1024 h12 d64 causal", 8, 12, 12, 1024, 64, True),
    ("long causal B1 L8192 h8 d64", 1, 8, 8, 8192, 64, True),
    ("grouped h32 kv8 d128 L2048 causal", 1, 32, 8, 2048, 128, True),
]
# name, B, L, E, H
MODULE_CASES = [
    ("ViT-B B32 L197 E768 h12", 32, 197, 768, 12),
    ("BERT-base B8 L512 E768 h12", 8, 512, 768, 12),
]
QUICK_FUNCTIONS = FUNCTION_CASES[:2]
QUICK_MODULES = MODULE_CASES[1:]


def median_ms(fn, reps, budget_s=20.0):
    fn()  # warm-up (and first-call allocations)
    times = []
    start = time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    times.sort()
    return 1e3 * times[len(times) // 2]


def attention_flops(B, H, L, d, causal):
    return 4.0 * B * H * L * L * d * (0.5 if causal else 1.0)


def module_flops(B, L, E):
    return 8.0 * B * L * E * E + 4.0 * B * L * L * E


def worker(side, threads, quick):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    reps = 3 if quick else 7
    out = {}
    functions = QUICK_FUNCTIONS if quick else FUNCTION_CASES
    modules = QUICK_MODULES if quick else MODULE_CASES
    if side in ("mha", "torch"):
        import mha
        import mha.torch as mt
        mha.set_num_threads(threads)
        if side == "mha":
            out["fma_peak"] = mha._core._fma_peak(threads, 0.5)["gflops"]
        sdpa = mt.scaled_dot_product_attention if side == "mha" else torch.nn.functional.scaled_dot_product_attention
        for name, B, H, Hkv, L, d, causal in functions:
            q = torch.randn(B, H, L, d)
            k, v = torch.randn(B, Hkv, L, d), torch.randn(B, Hkv, L, d)
            gqa = Hkv != H
            with torch.no_grad():
                out[f"sdpa fwd|{name}"] = median_ms(lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=gqa), reps)
            qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))

            def step():
                sdpa(qg, kg, vg, is_causal=causal, enable_gqa=gqa).sum().backward()
            out[f"sdpa fwd+bwd|{name}"] = median_ms(step, reps)
        cls = mt.MultiheadAttention if side == "mha" else torch.nn.MultiheadAttention
        for name, B, L, E, H in modules:
            m = cls(E, H, batch_first=True)
            x = torch.randn(B, L, E)
            m.eval()
            with torch.no_grad():
                out[f"module fwd|{name}"] = median_ms(lambda: m(x, x, x, need_weights=False), reps)
            m.train()
            xg = x.clone().requires_grad_(True)

            def module_step():
                m(xg, xg, xg, need_weights=False)[0].sum().backward()
            out[f"module fwd+bwd|{name}"] = median_ms(module_step, reps)
    elif side == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
        for name, B, H, Hkv, L, d, causal in functions:
            if Hkv != H:
                continue
            q, k, v = (torch.randn(B, H, L, d) for _ in range(3))
            mask = None
            if causal:
                mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, L, L, device="cpu")
            with torch.no_grad():
                out[f"sdpa fwd|{name}"] = median_ms(lambda: flex(q, k, v, block_mask=mask), reps)
    elif side == "ort":
        import numpy as np
        import onnxruntime as ort
        import ort_peer
        import tempfile
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        rng = np.random.default_rng(0)
        for name, B, L, E, H in modules:
            sd = {f"W_{n}.weight": (rng.standard_normal((E, E)) / math.sqrt(E)).astype(np.float32) for n in "qkvo"}
            x = rng.standard_normal((B, L, E)).astype(np.float32)
            with tempfile.TemporaryDirectory(prefix="mha-ort-") as tmp:
                path = pathlib.Path(tmp) / "forward.onnx"
                ort_peer.forward_graph(path, sd, E, E, E, E, H, True, False)
                session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            out[f"module fwd|{name}"] = median_ms(lambda: session.run(None, {"X": x}), reps)
    print(json.dumps(out))


def run_worker(side, threads, quick):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", side, "--threads", str(threads)]
    if quick:
        cmd.append("--quick")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(HERE))
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        print(f"  ({side} at {threads} thread(s) failed: {lines[-1] if lines else r.returncode})")
        return {}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and cases")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--worker", choices=["mha", "torch", "flex", "ort"], help=argparse.SUPPRESS)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes ~1 min)")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.threads[0], args.quick)
        return
    import torch
    print(f"mha against torch {torch.__version__} (CPU) and ONNX Runtime; ms, median of warm calls")
    functions = QUICK_FUNCTIONS if args.quick else FUNCTION_CASES
    modules = QUICK_MODULES if args.quick else MODULE_CASES
    flops = {}
    for name, B, H, Hkv, L, d, causal in functions:
        f = attention_flops(B, H, L, d, causal)
        flops[f"sdpa fwd|{name}"], flops[f"sdpa fwd+bwd|{name}"] = f, 3 * f
    for name, B, L, E, H in modules:
        f = module_flops(B, L, E)
        flops[f"module fwd|{name}"], flops[f"module fwd+bwd|{name}"] = f, 3 * f
    for threads in args.threads:
        ours = run_worker("mha", threads, args.quick)
        peers = {"torch": run_worker("torch", threads, args.quick)}
        if not args.no_flex:
            peers["FlexAttention"] = run_worker("flex", threads, args.quick)
        peers["ONNX Runtime"] = run_worker("ort", threads, args.quick)
        peak = ours.get("fma_peak", float("nan"))
        print(f"\n{threads} thread(s); float32 FMA peak {peak:.0f} GFLOP/s")
        print(f"| call | case | mha ms | mha % peak | peer | peer ms | peer % peak | peer / mha |")
        print("|---|---|---:|---:|---|---:|---:|---:|")
        for key in flops:
            if key not in ours:
                continue
            call, case = key.split("|")
            mine = ours[key]
            share = 100 * flops[key] / (mine * 1e6) / peak
            for peer, got in peers.items():
                if key not in got:
                    continue
                label = {"torch": "F.scaled_dot_product_attention" if call.startswith("sdpa")
                         else "nn.MultiheadAttention"}.get(peer, peer)
                theirs = got[key]
                print(f"| {call} | {case} | {mine:.2f} | {share:.0f}% | {label} | {theirs:.2f} | "
                      f"{100 * flops[key] / (theirs * 1e6) / peak:.0f}% | {theirs / mine:.2f}x |")


if __name__ == "__main__":
    main()
