// bench/ort_runner.js: runs one ONNX graph with ONNX Runtime (onnxruntime-node)
// for bench/ort_peer.py, and times it.
//
//   node bench/ort_runner.js <job.json>
//
// job.json: {"model": path, "threads": n, "budget_s": s, "min_runs": n,
//            "max_runs": n, "inputs": [{"name", "dims", "type": "float32" | "int32" |
//            "int64", "file"}], "outputs_dir": path (or null), "keep": [names] (or null: all)}
// Input files hold the raw little-endian elements, row-major. The first run
// (a warm-up: session set-up, first allocations) writes each output to
// <outputs_dir>/<name>.bin for the equality check; then the graph runs
// again until budget_s is spent (at least min_runs times). Prints one JSON
// line: {"times_s": [...], "outputs": {name: dims}}.
//
// Threads: intra_op_num_threads = n (ORT's own pool, n - 1 workers plus the
// caller), one inter-op thread, sequential execution: the same core count
// mha gets. Time is wall time of session.run, including onnxruntime-node's
// copy of the inputs into its tensors (mha's Python binding copies too).
"use strict";
const fs = require("fs");
const path = require("path");

function loadOrt() {
  // The package lives in bench/node_modules (npm install --ignore-scripts);
  // MHA_ORT_NODE_MODULES points elsewhere.
  const dirs = [process.env.MHA_ORT_NODE_MODULES, path.join(__dirname, "node_modules")].filter(Boolean);
  for (const d of dirs) {
    try {
      return require(path.join(d, "onnxruntime-node"));
    } catch (e) {
      if (e.code !== "MODULE_NOT_FOUND") throw e;
    }
  }
  return require("onnxruntime-node");
}

const kTypes = {float32: Float32Array, int32: Int32Array, int64: BigInt64Array};

function readInput(spec, ort) {
  const buf = fs.readFileSync(spec.file);
  const T = kTypes[spec.type];
  const data = new T(buf.buffer, buf.byteOffset, buf.byteLength / T.BYTES_PER_ELEMENT);
  return new ort.Tensor(spec.type, data, spec.dims);
}

async function main() {
  const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const ort = loadOrt();
  const session = await ort.InferenceSession.create(job.model, {
    intraOpNumThreads: job.threads,
    interOpNumThreads: 1,
    executionMode: "sequential",
    graphOptimizationLevel: "all",
  });
  const feeds = {};
  for (const spec of job.inputs) feeds[spec.name] = readInput(spec, ort);

  const first = await session.run(feeds);
  const outputs = {};
  for (const [name, t] of Object.entries(first)) {
    outputs[name] = t.dims;
    if (job.outputs_dir && (!job.keep || job.keep.includes(name))) {
      const d = t.data;
      fs.writeFileSync(path.join(job.outputs_dir, name + ".bin"), Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    }
  }
  const times = [];
  const end = process.hrtime.bigint() + BigInt(Math.round(job.budget_s * 1e9));
  while (times.length < job.min_runs || (process.hrtime.bigint() < end && times.length < job.max_runs)) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  process.stdout.write(JSON.stringify({times_s: times, outputs}) + "\n");
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + "\n");
  process.exit(1);
});
