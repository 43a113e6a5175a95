"""ONNX Runtime as a peer of mha in bench/bench.py (optional, never in the tests).

The graph is built here with onnx's helpers and run by ONNX Runtime's Python
package (bench/ort_runner.py) in the torch 2.x line's environment, which
has both (build-venv, made by `make demo` / `make test` from
requirements/torch2.txt; MHA_ORT_PYTHON names another interpreter):

    X:[B,L,Dq] -> MatMul W_q^T, W_k^T, W_v^T (mha's own weights, stored (out, in)
    as PyTorch does, so transposed here) -> com.microsoft.MultiHeadAttention
    (num_heads = h, query/key/value [B,L,D]) -> MatMul W_o^T -> Y:[B,L,D]

ONNX Runtime runs that op on the CPU through its flash-attention path when no
mask, bias or cache is given; with a mask it takes its unfused path.

Valid lengths: the d2l chapter's masked_softmax *replaces* the scores of keys
k >= valid_len by -1e6; the op's key_padding_mask (1-D: one length per batch
row, keys 0 .. len-1 kept) *adds* mask_filter_value to them instead, so a
masked score is s - 1e6, not -1e6. Whenever a row keeps at least one key
(every padded case here does) and |s| is far below 1e6, both give masked keys
a weight of exactly 0 in float32 (exp(-1e6 + O(10)) underflows), so the
outputs agree; only rows with valid length 0 (uniform weights in the
chapter) would differ, and no benchmark case has one. Fractional lengths
cannot be expressed (the op takes int32): the cases use whole ones.

Before any timing, ORT's output is checked against mha's on the same inputs
and weights: max |y_ort - y_mha| <= 1e-4 * max |y_mha| (float32; the two sum
in different orders, so bitwise equality is not expected; a wrong transpose,
head split or mask gives errors of the order of the output itself).
"""
import json
import os
import pathlib
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
RUNNER = HERE / "ort_runner.py"
PYTHON = os.environ.get("MHA_ORT_PYTHON", str(HERE.parent / "build-venv" / "bin" / "python"))
RTOL = 1e-4


def build_in_peer(kind, model, *args):
    """Writes the graph of `kind` ("forward": forward_graph's arguments with the weights as an .npz
    file; "decode": decode_graph's) with onnx in ONNX Runtime's environment (PYTHON)."""
    r = subprocess.run([PYTHON, str(pathlib.Path(__file__).resolve()), kind, str(model), *map(str, args)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        raise RuntimeError("onnx: " + (lines[-1] if lines else f"exit {r.returncode}"))


def why_missing():
    """None when ONNX Runtime's Python package and onnx can be run, else why not."""
    if not pathlib.Path(PYTHON).exists():
        return f"{PYTHON} not found (make demo or make test makes it; MHA_ORT_PYTHON names another)"
    r = subprocess.run([PYTHON, "-c", "import onnx, onnxruntime"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"onnx or onnxruntime missing in {PYTHON}"
    return None


def forward_graph(path, sd, Dq, Dk, Dv, D, h, self_attention, masked):
    """Writes the ONNX graph of mha's forward with the weights `sd` (mha's
    state_dict: 'W_q.weight' (D, Dq) ... 'W_o.weight' (D, D)).
    Inputs: X:[B,L,Dq] (self-attention) or queries:[B,Q,Dq], keys:[B,K,Dk],
    values:[B,K,Dv]; with `masked`, valid_lens:[B] int32. Output Y:[B,Q,D]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save
    f32 = TensorProto.FLOAT
    if self_attention:
        inputs = [helper.make_tensor_value_info("X", f32, ["B", "L", Dq])]
        q_in = k_in = v_in = "X"
    else:
        inputs = [helper.make_tensor_value_info("queries", f32, ["B", "Q", Dq]),
                  helper.make_tensor_value_info("keys", f32, ["B", "K", Dk]),
                  helper.make_tensor_value_info("values", f32, ["B", "K", Dv])]
        q_in, k_in, v_in = "queries", "keys", "values"
    inits = [numpy_helper.from_array(np.ascontiguousarray(sd[f"W_{n}.weight"].T), f"W_{n}_t")
             for n in "qkvo"]
    nodes = [helper.make_node("MatMul", [q_in, "W_q_t"], ["q"]),
             helper.make_node("MatMul", [k_in, "W_k_t"], ["k"]),
             helper.make_node("MatMul", [v_in, "W_v_t"], ["v"])]
    mha_inputs = ["q", "k", "v"]
    if masked:
        inputs.append(helper.make_tensor_value_info("valid_lens", TensorProto.INT32, ["B"]))
        mha_inputs += ["", "valid_lens"]  # (no bias), key_padding_mask
    nodes.append(helper.make_node("MultiHeadAttention", mha_inputs, ["attn"], domain="com.microsoft",
                                  num_heads=h, mask_filter_value=-1e6))
    nodes.append(helper.make_node("MatMul", ["attn", "W_o_t"], ["Y"]))
    graph = helper.make_graph(nodes, "mha_forward", inputs,
                              [helper.make_tensor_value_info("Y", f32, ["B", "Q", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    save(model, str(path))


def run(model, feeds, threads, budget_s, min_runs=3, max_runs=50, keep=None):
    """Runs `model` with ONNX Runtime's Python package (bench/ort_runner.py) with `feeds` ({name: numpy
    array}); returns
    (sorted run times in s, {output name: numpy array} of the first run, only
    those named in `keep` when it is given)."""
    import numpy as np
    types = {np.dtype(np.float32): "float32", np.dtype(np.int32): "int32", np.dtype(np.int64): "int64"}
    with tempfile.TemporaryDirectory(prefix="mha-ort-") as tmp:
        tmp = pathlib.Path(tmp)
        specs = []
        for name, a in feeds.items():
            a = np.ascontiguousarray(a)
            a.tofile(tmp / f"in_{name}.bin")
            specs.append({"name": name, "dims": list(a.shape), "type": types[a.dtype],
                          "file": str(tmp / f"in_{name}.bin")})
        job = {"model": str(model), "threads": threads, "budget_s": budget_s, "min_runs": min_runs,
               "max_runs": max_runs, "inputs": specs, "outputs_dir": str(tmp), "keep": keep}
        (tmp / "job.json").write_text(json.dumps(job))
        r = subprocess.run([PYTHON, str(RUNNER), str(tmp / "job.json")], capture_output=True, text=True)
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            raise RuntimeError("onnxruntime: " + (lines[-1] if lines else f"exit {r.returncode}"))
        res = json.loads(r.stdout.strip().splitlines()[-1])
        outs = {n: np.fromfile(tmp / f"{n}.bin", np.float32).reshape(dims)
                for n, dims in res["outputs"].items() if keep is None or n in keep}
    return sorted(res["times_s"]), outs


def check_close(name, got, want, rtol=RTOL):
    """Raises unless max |got - want| <= rtol * max |want|; returns that relative error."""
    import numpy as np
    if got.shape != want.shape:
        raise RuntimeError(f"{name}: ONNX Runtime gave shape {got.shape}, mha {want.shape}")
    err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
    if not err <= rtol:
        raise RuntimeError(f"{name}: ONNX Runtime and mha differ: max |diff| / max |mha| = {err:.2e} > {rtol:g}")
    return err


def time_forward(case, dims, inputs, threads, budget_s):
    """mha's module forward as an ONNX graph, checked against mha, then timed.
    dims: (B, Q, K, Dq, Dk, Dv, D, h, kind); inputs: (X, K, V, lens or None),
    as bench.py makes them. Returns (median s, relative error of the check)."""
    import numpy as np
    import mha
    B, Q, K, Dq, Dk, Dv, D, h, kind = dims
    X, Kx, Vx, lens = inputs
    m = mha.MultiHeadAttention(D, h, 0.0, False).eval()
    want = m(X, Kx, Vx, lens)
    sd = m.state_dict()
    self_attention = Kx is X and Vx is X
    if lens is not None and not np.array_equal(lens, np.round(lens)):
        raise RuntimeError("fractional valid lengths have no ONNX Runtime equivalent")
    feeds = {"X": X} if self_attention else {"queries": X, "keys": Kx, "values": Vx}
    if lens is not None:
        feeds["valid_lens"] = lens.astype(np.int32)
    with tempfile.TemporaryDirectory(prefix="mha-ort-model-") as tmp:
        model = pathlib.Path(tmp) / "forward.onnx"
        np.savez(pathlib.Path(tmp) / "weights.npz", **{k: np.asarray(v) for k, v in sd.items()})
        build_in_peer("forward", model, pathlib.Path(tmp) / "weights.npz", Dq, Dk, Dv, D, h, int(self_attention),
                      int(lens is not None))
        times, outs = run(model, feeds, threads, budget_s)
    err = check_close(case, outs["Y"], want)
    return times[len(times) // 2], err


# ---------------------------------------------------------------- decoding

def decode_graph(path, H, d):
    """One com.microsoft.MultiHeadAttention node with a cache:
    query, key, value:[B,Qn,H*d] (the new block, already projected),
    past_key, past_value:[B,H,P,d] -> out:[B,Qn,H*d], present_key/value:[B,H,P+Qn,d].
    unidirectional = 1: query i sees the past and new keys 0..i (checked
    against mha's causal decode, whose query i keeps keys j < P + i + 1)."""
    from onnx import TensorProto, helper, save
    f32 = TensorProto.FLOAT
    D = H * d
    inputs = [helper.make_tensor_value_info(n, f32, ["B", "Qn", D]) for n in ("query", "key", "value")]
    inputs += [helper.make_tensor_value_info(n, f32, ["B", H, "P", d]) for n in ("past_key", "past_value")]
    node = helper.make_node("MultiHeadAttention",
                            ["query", "key", "value", "", "", "", "past_key", "past_value"],
                            ["out", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=H, unidirectional=1)
    outputs = [helper.make_tensor_value_info("out", f32, ["B", "Qn", D]),
               helper.make_tensor_value_info("present_key", f32, ["B", H, "T", d]),
               helper.make_tensor_value_info("present_value", f32, ["B", H, "T", d])]
    model = helper.make_model(helper.make_graph([node], "mha_decode", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    save(model, str(path))


def time_decode(name, q, k_cache, v_cache, want, threads, budget_s):
    """ONNX Runtime's decode step on the same data as mha's, checked, then timed.
    q:[B,H,Qn,d]; k_cache, v_cache:[B,H,K,d] float32 holding the past keys and,
    as the last Qn, the new block's; want: mha's output [B,H,Qn,d].
    ORT gets the past (K - Qn keys) and the new keys as separate inputs and
    builds present = past + new itself, a copy of the cache each step: that is
    how the op keeps a cache on the CPU. Returns (median s, relative error)."""
    import numpy as np
    B, H, Qn, d = q.shape
    K = k_cache.shape[2]
    flat = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(B, Qn, H * d)  # noqa: E731
    feeds = {"query": flat(q), "key": flat(k_cache[:, :, K - Qn:]), "value": flat(v_cache[:, :, K - Qn:]),
             "past_key": k_cache[:, :, :K - Qn], "past_value": v_cache[:, :, :K - Qn]}
    with tempfile.TemporaryDirectory(prefix="mha-ort-model-") as tmp:
        model = pathlib.Path(tmp) / "decode.onnx"
        build_in_peer("decode", model, H, d)
        times, outs = run(model, feeds, threads, budget_s, max_runs=20, keep=["out"])
    err = check_close(name, outs["out"], flat(want))
    return times[len(times) // 2], err


if __name__ == "__main__":  # build_in_peer's child: writes one graph
    import sys
    import numpy as np
    kind, path = sys.argv[1], sys.argv[2]
    if kind == "forward":
        weights, dims = np.load(sys.argv[3]), [int(a) for a in sys.argv[4:]]
        forward_graph(path, dict(weights), *dims[:5], bool(dims[5]), bool(dims[6]))
    else:
        decode_graph(path, int(sys.argv[3]), int(sys.argv[4]))
