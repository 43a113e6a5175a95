#!/usr/bin/python3
"""The attention variants' cost: a packed batch against its sequences one by one and padded, and the
score and mask options (ALiBi, a window, softcap, rotary) against plain attention in the module.

    flock /tmp/mha-bench.lock /usr/bin/python3 bench/attention_variants.py
    /usr/bin/python3 bench/attention_variants.py --section packed --reps 5 --causal 0
    flock /tmp/mha-bench.lock /usr/bin/python3 bench/attention_variants.py --section module --module-reps 21
    flock /tmp/mha-bench.lock /usr/bin/python3 bench/attention_variants.py --section functions

What is measured, --section packed (docs/performance.md keeps the numbers)
- A batch of 8 sequences of at most 1024 rows whose lengths average 40% of the longest (fixed
  lengths below), h8 d64, causal by default. Three ways to compute the same attention:
  packed:     one mha.torch.attention call on (T, H, d) rows with cu_seqlens (T = the sum of lengths);
  one by one: one mha.torch.attention call per sequence, (1, L_b, H, d);
  padded:     every sequence padded to 1024 rows, (B, 1024, H, d), through
              mha.torch.scaled_dot_product_attention with a boolean mask (causal and the keys past each
              length: the key padding mask), as a padded batch is computed without cu_seqlens.
- forward: under torch.no_grad(); fwd+bwd: on inputs that require grad, then backward of out.sum().
  Median of --reps calls after 2 warm-up calls, in ms; torch.set_num_threads(n) and
  mha.set_num_threads(n) for each n of --threads (1 and 2 by default).
- Targets: packed <= 1.1x one by one, packed <= 0.5x padded.

What is measured, --section module (docs/masks.md keeps the numbers)
- mha.torch.MultiheadAttention (batch_first, need_weights=False), at 1 and 2 threads
  (mha.set_num_threads and torch.set_num_threads alike):
  training: one step, forward and out.sum().backward() through autograd (the input and every
            parameter get gradients), at B8 L512 E768 h12 and B4 L1024 E512 h8: plain causal
            (is_causal=True) against causal with ALiBi (slopes 2^(-8(h+1)/H)), with window=(128, 0),
            with softcap=30;
  attention alone: the same variants through mha.torch.attention on (B, L, h, E/h) q, k, v,
            forward and backward (where the options' cost lies without the projections);
  forward:  under torch.no_grad() on dense (not causal) B8 L512 E768 h12: plain against ALiBi,
            softcap=30, a window (512, 512) that masks nothing (the option's own cost), window
            (128, 128), and rotary=True (a second module with the same parameters).
- The variants of one table run in turn within each repetition (so that a change in the machine's
  load falls on all of them alike); median of --module-reps after 2 warm-up rounds, in ms, and
  each variant's ratio to the plain call.
- Targets (the issue's benchmarks): training with ALiBi or a window within 10% of plain causal
  training; each option's forward overhead on dense B8 L512 <= 10%.

What is measured, --section functions
- mha.torch.scaled_dot_product_attention on contiguous (B, h, L, d) and mha.torch.attention on
  (B, L, h, d) q, k, v, full attention, at B8 h12 L512 d64 and B1 h8 L4096 d64: the first call on
  those inputs and the median of --reps after it, forward under torch.no_grad() and forward with
  backward of out.sum() (fresh buffers are slow to fault in on a VM: the first call shows it).
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


def medians_ms(fns, reps):
    """{name: median ms} of the callables in fns (name -> fn), run in turn within each repetition."""
    for _ in range(2):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def alibi_slopes(h):
    """ALiBi's slopes for h heads (a power of two or not: the common geometric 2^(-8(i+1)/h))."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)])


def module_section(reps, threads_list):
    torch.manual_seed(0)
    for threads in threads_list:
        torch.set_num_threads(threads)
        mha.set_num_threads(threads)
        for B, L, E, h in ((8, 512, 768, 12), (4, 1024, 512, 8)):
            m = mha.torch.MultiheadAttention(E, h, batch_first=True)
            x = torch.randn(B, L, E)
            slopes = alibi_slopes(h)
            variants = {
                "causal": dict(is_causal=True),
                "causal + ALiBi": dict(is_causal=True, alibi_slopes=slopes),
                "causal + window (128, 0)": dict(is_causal=True, window=(128, 0)),
                "causal + softcap 30": dict(is_causal=True, softcap=30.0),
            }

            def step(kw):
                def run():
                    xi = x.detach().requires_grad_()
                    m.zero_grad(set_to_none=True)
                    out, _ = m(xi, xi, xi, need_weights=False, **kw)
                    out.sum().backward()
                return run

            ms = medians_ms({n: step(kw) for n, kw in variants.items()}, reps)
            print_table(f"training step (forward + backward), B{B} L{L} E{E} h{h}, {threads} thread(s), "
                        f"median of {reps} (ms)", "variant", ms, "causal")

            # The attention alone on the module's shapes (mha.torch.attention, (B, L, h, E/h)): where
            # the options' cost lies when the projections are taken away.
            q, k, v = (torch.randn(B, L, h, E // h) for _ in range(3))
            fa = {"causal": dict(causal=True), "causal + ALiBi": dict(causal=True, alibi_slopes=slopes),
                  "causal + window (128, 0)": dict(causal=True, window=(128, 0)),
                  "causal + softcap 30": dict(causal=True, softcap=30.0)}

            def attention_step(kw):
                def run():
                    qi, ki, vi = (t.detach().requires_grad_() for t in (q, k, v))
                    mha.torch.attention(qi, ki, vi, **kw).sum().backward()
                return run

            ms = medians_ms({n: attention_step(kw) for n, kw in fa.items()}, reps)
            print_table(f"attention alone (mha.torch.attention) forward + backward, B{B} L{L} h{h} d{E // h}, "
                        f"{threads} thread(s), median of {reps} (ms)", "variant", ms, "causal")

        B, L, E, h = 8, 512, 768, 12
        m = mha.torch.MultiheadAttention(E, h, batch_first=True)
        mr = mha.torch.MultiheadAttention(E, h, batch_first=True, rotary=True)
        mr.load_state_dict(m.state_dict())
        x = torch.randn(B, L, E)
        slopes = alibi_slopes(h)

        def fwd(module, kw):
            def run():
                with torch.no_grad():
                    module(x, x, x, need_weights=False, **kw)
            return run

        ms = medians_ms({
            "dense": fwd(m, {}),
            "ALiBi": fwd(m, dict(alibi_slopes=slopes)),
            "softcap 30": fwd(m, dict(softcap=30.0)),
            "window (512, 512) (masks nothing)": fwd(m, dict(window=(L, L))),
            "window (128, 128)": fwd(m, dict(window=(128, 128))),
            "rotary": fwd(mr, {}),
        }, reps)
        print_table(f"forward (no grad), dense B{B} L{L} E{E} h{h}, {threads} thread(s), median of {reps} (ms)",
                    "option", ms, "dense")


def print_table(title, what, ms, base):
    print(f"\n{title}")
    print(f"| {what} | ms | / {base} |")
    print("|---|---:|---:|")
    for n, t in ms.items():
        print(f"| {n} | {t:.1f} | {t / ms[base]:.3f} |", flush=True)


def functions_section(reps, threads):
    torch.set_num_threads(threads)
    mha.set_num_threads(threads)
    print(f"\nmha.torch's functions, full attention, {threads} thread(s): first call, then median of {reps} (ms)")
    print("| function | shape | direction | first | median |")
    print("|---|---|---|---:|---:|")
    for B, h, L in ((8, 12, 512), (1, 8, 4096)):
        torch.manual_seed(0)
        for name, layout, fn in (("scaled_dot_product_attention", (B, h, L, D), mha.torch.scaled_dot_product_attention),
                                 ("attention", (B, L, h, D), mha.torch.attention)):
            q, k, v = (torch.randn(*layout) for _ in range(3))
            for direction in ("forward", "fwd+bwd"):
                def run():
                    if direction == "forward":
                        with torch.no_grad():
                            fn(q, k, v)
                    else:
                        xs = [x.detach().requires_grad_() for x in (q, k, v)]
                        fn(*xs).sum().backward()
                t0 = time.perf_counter()
                run()
                first = (time.perf_counter() - t0) * 1e3
                print(f"| {name} | B{B} h{h} L{L} d{D} | {direction} | {first:.1f} | {median_ms(run, reps):.1f} |",
                      flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--section", choices=("packed", "module", "functions", "all"), default="all")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--causal", type=int, default=1, help="1: causal (default), 0: full attention per sequence")
    ap.add_argument("--module-reps", type=int, default=15)
    ap.add_argument("--threads", default="1,2", help="thread counts of torch and mha, comma-separated (1,2)")
    args = ap.parse_args()
    threads_list = [int(t) for t in args.threads.split(",")]
    if args.section in ("packed", "all"):
        for threads in threads_list:
            packed_section(args, threads)
    if args.section in ("module", "all"):
        module_section(args.module_reps, threads_list)
    if args.section in ("functions", "all"):
        for threads in threads_list:
            functions_section(args.reps, threads)


def packed_section(args, threads):
    torch.set_num_threads(threads)
    mha.set_num_threads(threads)
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
          f"{'causal' if causal else 'full'}, {threads} thread(s), median of {args.reps} (ms)")
    print("| direction | packed | one by one | padded | packed / one by one | packed / padded |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, wrap in (("forward", forward), ("fwd+bwd", training)):
        a = median_ms(wrap(packed, (q, k, v)), args.reps)
        b = median_ms(wrap(one_by_one, (q, k, v)), args.reps)
        c = median_ms(wrap(padded, (qp, kp, vp)), args.reps)
        print(f"| {name} | {a:.2f} | {b:.2f} | {c:.2f} | {a / b:.2f}x | {a / c:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
