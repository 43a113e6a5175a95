"""`mpirun -np N mha run --parallel heads|sequence|grid` against `mha run`.

Run by CTest (tests/dist/CMakeLists.txt) as run_parallel_np2 / _np4:

    test_run_parallel.py --mha build/mha --mpiexec mpirun --np 4

For inputs with and without the d2l chapter's valid lengths (per row, per
query, fractional, 0), odd sizes and head counts that do not divide the
ranks, each split's output file must hold what one process's `mha run` writes
(output and attention_weights within 1e-5 relative to each tensor's scale,
the same metadata), bitwise the same file when run twice on the same ranks;
one process without mpirun (P = 1) too. Exits non-zero on the first mismatch.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import safetensors_spec as spec  # noqa: E402

TOL = 1e-5


def write_case(folder, rng, D, H, B, Q, K, lens, bias):
    widths = {"W_q": 5, "W_k": 6, "W_v": 3, "W_o": D}
    weights = {f"{n}.weight": rng.uniform(-0.5, 0.5, (D, w)).astype(np.float32) for n, w in widths.items()}
    if bias:
        weights.update({f"{n}.bias": (0.3 * rng.standard_normal(D)).astype(np.float32) for n in widths})
    inputs = {"queries": rng.standard_normal((B, Q, 5)).astype(np.float32),
              "keys": rng.standard_normal((B, K, 6)).astype(np.float32),
              "values": rng.standard_normal((B, K, 3)).astype(np.float32)}
    dtypes = {}
    if lens is not None:
        inputs["valid_lens"] = lens
        dtypes["valid_lens"] = {np.dtype(np.int64): "I64", np.dtype(np.float32): "F32"}[lens.dtype]
    spec.write(folder / "w.safetensors", weights)
    spec.write(folder / "i.safetensors", inputs, dtypes=dtypes)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r


def relative_error(got, want):
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    diff = float(np.max(np.abs(got - want))) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mha", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np", type=int, required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(args.np)
    failures = []
    cases = [
        # D, H, B, Q, K, valid_lens, bias, masks (--causal / --window, over global positions)
        (12, 4, 2, 7, 9, np.array([4, 0], np.int64), True, []),
        (20, 5, 2, 6, 5, np.array([[1, 5, 2.5, 0, 3, 4], [2, 2, 0, 5, 1.5, 3]], np.float32), False, []),
        (8, 2, 3, 3, 3, None, True, []),
        (16, 4, 1, 1, 2, np.array([1.5], np.float32), True, []),
        (12, 4, 2, 9, 9, np.array([7, 9], np.int64), True, ["--window", "2,0"]),
        (8, 2, 2, 6, 10, None, False, ["--causal", "bottom-right", "--window", "3,-1"]),
        (8, 2, 1, 8, 8, None, True, ["--causal", "top-left"]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        for D, H, B, Q, K, lens, bias, masks in cases:
            write_case(folder, rng, D, H, B, Q, K, lens, bias)
            common = ["--weights", str(folder / "w.safetensors"), "--inputs", str(folder / "i.safetensors"),
                      "--heads", str(H), *masks]
            ref_path = folder / "ref.safetensors"
            r = run([args.mha, "run", *common, "--out", str(ref_path)])
            if r.returncode != 0:
                sys.exit(f"mha run failed: {r.stderr}")
            want, want_meta = spec.read(ref_path)
            splits = [["heads"], ["sequence"], ["grid"]]
            if args.np % 2 == 0 and H >= 2:
                splits.append(["grid", "--head-groups", "2"])
            for split in splits:
                name = (f"D{D} H{H} B{B} Q{Q} K{K} lens {None if lens is None else lens.tolist()} {' '.join(masks)}, "
                        f"{' '.join(split)}")
                launches = [([args.mpiexec, "-np", str(args.np)], f"-np {args.np}")]
                if split == ["sequence"]:
                    launches.append(([], "one process without mpirun"))
                for launch, how in launches:
                    files = []
                    for attempt in range(2 if launch else 1):
                        out = folder / f"out{attempt}.safetensors"
                        r = run([*launch, args.mha, "run", "--parallel", *split, *common, "--out", str(out)])
                        if r.returncode != 0:
                            failures.append(f"{name} ({how}): exit {r.returncode}: {r.stderr[-2000:]}")
                            break
                        files.append(out.read_bytes())
                        got, got_meta = spec.read(out)
                        for t in ("output", "attention_weights"):
                            if got[t].shape != want[t].shape:
                                failures.append(f"{name} ({how}): {t} shape {got[t].shape}, wanted {want[t].shape}")
                                continue
                            err = relative_error(got[t], want[t])
                            if not err < TOL:
                                failures.append(f"{name} ({how}): {t} differs from mha run's by {err:.3g} relative")
                        if got_meta != want_meta:
                            failures.append(f"{name} ({how}): metadata {got_meta}, wanted {want_meta}")
                    if len(files) == 2 and files[0] != files[1]:
                        failures.append(f"{name} ({how}): two runs on the same ranks wrote different bytes")

        # --precision bf16: every split rounds as `mha run --precision bf16`
        # does (the products' inputs, the projected q, k, v): the same
        # output but for the order of float32 sums, far inside the mode's
        # bound, and far from float32.
        write_case(folder, rng, 16, 4, 2, 7, 9, np.array([5, 9], np.int64), True)
        common = ["--weights", str(folder / "w.safetensors"), "--inputs", str(folder / "i.safetensors"),
                  "--heads", "4"]
        r16 = run([args.mha, "run", *common, "--precision", "bf16", "--out", str(folder / "ref16.safetensors")])
        r32 = run([args.mha, "run", *common, "--out", str(folder / "ref32.safetensors")])
        if r16.returncode != 0 or r32.returncode != 0:
            sys.exit(f"mha run --precision failed: {r16.stderr} {r32.stderr}")
        want16, want32 = spec.read(folder / "ref16.safetensors")[0], spec.read(folder / "ref32.safetensors")[0]
        for split in (["heads"], ["sequence"], ["grid"]):
            out = folder / "bf16.safetensors"
            r = run([args.mpiexec, "-np", str(args.np), args.mha, "run", "--parallel", *split, *common,
                     "--precision", "bf16", "--out", str(out)])
            if r.returncode != 0:
                failures.append(f"--precision bf16 {split}: exit {r.returncode}: {r.stderr[-2000:]}")
                continue
            got = spec.read(out)[0]["output"]
            if relative_error(got, want16["output"]) > 1e-4 or relative_error(got, want32["output"]) < 1e-4:
                failures.append(f"--precision bf16 {split}: {relative_error(got, want16['output']):.3g} from "
                                f"bf16, {relative_error(got, want32['output']):.3g} from float32")

        # Errors, named by the command.
        r = run([args.mha, "run", "--parallel", "heads", "--head-groups", "2", *common, "--out", str(folder / "x.safetensors")])
        if r.returncode == 0 or "--head-groups: 2 given without --parallel grid" not in r.stderr:
            failures.append(f"--head-groups without grid: exit {r.returncode}, stderr {r.stderr!r}")
        r = run([args.mpiexec, "-np", str(args.np), args.mha, "run", "--parallel", "grid", "--head-groups",
                 str(args.np + 1), *common, "--out", str(folder / "x.safetensors")])
        want_text = f"head_groups: {args.np + 1} does not divide the {args.np} ranks"
        if r.returncode == 0 or want_text not in r.stderr or (folder / "x.safetensors").exists():
            failures.append(f"--head-groups {args.np + 1}: exit {r.returncode}, stderr {r.stderr[-1000:]!r}")
        # Rank 0 alone cannot hold the whole weights [1, 2, 64, 64] (32 KiB) under a
        # 32000-byte limit, while each rank's ring share fits: every rank stops
        # (none waits for rank 0), and no file is written.
        write_case(folder, rng, 4, 2, 1, 64, 64, None, False)
        r = run([args.mpiexec, "-np", str(args.np), args.mha, "--memory-limit", "32000", "run", "--parallel",
                 "sequence", "--heads", "2", "--weights", str(folder / "w.safetensors"), "--inputs",
                 str(folder / "i.safetensors"), "--out", str(folder / "x.safetensors")])
        if (r.returncode == 0 or "above the memory limit of 32000 bytes" not in r.stderr
                or "rank 0 cannot hold the whole output and attention weights" not in r.stderr
                or (folder / "x.safetensors").exists()):
            failures.append(f"--memory-limit on rank 0: exit {r.returncode}, stderr {r.stderr[-1500:]!r}")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
