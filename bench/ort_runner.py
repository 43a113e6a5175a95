"""bench/ort_runner.py: runs one ONNX graph with ONNX Runtime's Python package
(onnxruntime) for bench/ort_peer.py, and times it. Run by the torch 2.x line's
environment (build-venv, requirements/torch2.txt), which has the package:

    build-venv/bin/python bench/ort_runner.py <job.json>

job.json: {"model": path, "threads": n, "budget_s": s, "min_runs": n,
           "max_runs": n, "inputs": [{"name", "dims", "type": "float32" | "int32" |
           "int64", "file"}], "outputs_dir": path (or null), "keep": [names] (or null: all)}
Input files hold the raw little-endian elements, row-major. The first run
(a warm-up: session set-up, first allocations) writes each output to
<outputs_dir>/<name>.bin for the equality check; then the graph runs again
until budget_s is spent (at least min_runs times). Prints one JSON line:
{"times_s": [...], "outputs": {name: dims}}.

Threads: intra_op_num_threads = n (ORT's own pool), one inter-op thread,
sequential execution: the same core count mha gets. Time is wall time of
session.run.
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    job = json.load(open(sys.argv[1]))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = job["threads"]
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(job["model"], opts, providers=["CPUExecutionProvider"])
    feeds = {s["name"]: np.fromfile(s["file"], np.dtype(s["type"])).reshape(s["dims"]) for s in job["inputs"]}
    names = [o.name for o in session.get_outputs()]
    first = session.run(None, feeds)
    outputs = {}
    for name, value in zip(names, first):
        if job.get("keep") is None or name in job["keep"]:
            if job.get("outputs_dir"):
                np.ascontiguousarray(value, np.float32).tofile(f"{job['outputs_dir']}/{name}.bin")
            outputs[name] = list(value.shape)
    times = []
    start = time.perf_counter()
    while len(times) < job["max_runs"] and (len(times) < job["min_runs"]
                                             or time.perf_counter() - start < job["budget_s"]):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    print(json.dumps({"times_s": times, "outputs": outputs}))


if __name__ == "__main__":
    main()
