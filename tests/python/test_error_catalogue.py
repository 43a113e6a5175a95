"""Walks docs/errors.md through Python and the command-line tool.

Every row that lists Python has a trigger in PY, every row that lists CLI
one in CLI (below, and in catalogue_triggers.py for the newer parts:
training, the PyTorch drop-in, pictures, `mha viz` and `mha train`); each
must raise (Python: ValueError) or print (CLI: `mha <command>: error:
<message>`, exit status 1) the row's message, where <placeholders> match any
text. tests/cpp/errors/test_error_catalogue.cpp does the same for the C++ API.
"""
import json
import pathlib
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import catalogue_triggers
import mha

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
from make_corpus import st, tensors  # noqa: E402  (raw safetensors writer)


def read_catalogue():
    rows = []
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0].strip("`"), cells[1][1:-1], {s.strip() for s in cells[2].split(",")}))
    return rows


ROWS = read_catalogue()


def message_regex(pattern):
    """The row's message with each <placeholder> matching any non-empty text."""
    parts = re.split(r"(<[^<> ]+>)", pattern)
    return "".join(".+?" if p.startswith("<") and p.endswith(">") else re.escape(p) for p in parts)


def ones(*shape):
    return np.ones(shape, np.float32)


def raw_file(path, header=None, data=b"", raw=None):
    """A safetensors file from a header dict, or exactly the bytes `raw`."""
    path.write_bytes(raw if raw is not None else st(header, data))
    return str(path)


def raw_header(n, text):
    return struct.pack("<Q", n) + text


def state(D, inp, bias=False, **override):
    s = {}
    for n in ("W_q", "W_k", "W_v", "W_o"):
        s[f"{n}.weight"] = ones(D, D if n == "W_o" else inp)
        if bias:
            s[f"{n}.bias"] = ones(D)
    s.update(override)
    return {k: v for k, v in s.items() if v is not None}


def forward(q, k, v, lens=None):
    mha.MultiHeadAttention(100, 5, 0.5)(q, k, v, lens)


X, Y = ones(2, 4, 100), ones(2, 6, 100)
ST_HEADERS = {  # safetensors rows: the file's bytes
    "st.short": b"\x01\x02\x03",
    "st.header_limit": raw_header(1 << 40, b"{}"),
    "st.header_past_end": raw_header(64, b"{}"),
    "st.header_tiny": raw_header(1, b"{"),
    "st.json": raw_header(9, b"{not json"),
    "st.object": raw_header(2, b"[]"),
    "st.metadata_object": st({"__metadata__": [1]}, b""),
    "st.metadata_string": st({"__metadata__": {"n": 1}}, b""),
    "st.entry_object": st({"a": []}, b""),
    "st.dtype_missing": st({"a": {"shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
    "st.shape_missing": st({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, bytes(4)),
    "st.offsets_missing": st({"a": {"dtype": "F32", "shape": [1]}}, bytes(4)),
    "st.dtype": st({"a": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}, bytes(1)),
    "st.shape_entry": st({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4)),
    "st.dimension": st({"a": {"dtype": "U8", "shape": [1 << 63], "data_offsets": [0, 1]}}, bytes(1)),
    "st.offset_entry": st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, -4]}}, bytes(4)),
    "st.offsets_order": st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, bytes(4)),
    "st.past_end": st({"w": {"dtype": "F32", "shape": [1 << 38], "data_offsets": [0, 1 << 40]}}, bytes(4)),
    "st.shape_overflow": st({"w": {"dtype": "F32", "shape": [1 << 32, 1 << 32], "data_offsets": [0, 0]}}, b""),
    "st.size": st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
    "st.hole": st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)),
    "st.cover": st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8)),
}


def called_module():
    """A MultiHeadAttention(8, 2) after one call with B = 2."""
    m = mha.MultiHeadAttention(8, 2)
    m(ones(2, 3, 4), ones(2, 3, 4), ones(2, 3, 4))
    return m


def blas_module(num_hiddens, num_heads):
    """A module on the BLAS kernel, which forms the weights in forward."""
    m = mha.MultiHeadAttention(num_hiddens, num_heads)
    m.kernel = mha.Kernel.BLAS
    return m


def py_memory_limit(tmp):
    m = mha.MultiHeadAttention(8, 2)
    m.kernel = mha.Kernel.BLAS  # forms the weights in forward
    q, kv = ones(1, 1024, 4), ones(1, 1024, 3)
    mha.set_memory_limit(1 << 20)
    m(q, kv, kv)


def py_weights_limit(tmp):
    m = mha.MultiHeadAttention(8, 2)  # fused: forms the weights on first access
    q, kv = ones(1, 1024, 4), ones(1, 1024, 3)
    mha.set_memory_limit(1 << 20)
    m(q, kv, kv)
    m.attention_weights


def py_read_limit(tmp):
    mha.save_safetensors(str(tmp / "big.safetensors"), {"x": ones(512, 1024)})
    mha.set_memory_limit(1 << 20)
    mha.load_safetensors(str(tmp / "big.safetensors"))


def py_width(tmp):
    m = mha.MultiHeadAttention(100, 5)
    m(X, Y, Y)
    m(X, ones(2, 6, 50), Y)


def py_reinit(tmp):
    m = mha.MultiHeadAttention(8, 2)
    m.load_state_dict(state(8, 4))
    m.load_state_dict(state(8, 5))


def py_small_model():
    return mha.AttentionModel(5, 3, 8, num_hiddens=4, num_heads=2)


def py_pruned_state(tmp):
    m = mha.MultiHeadAttention(8, 2)
    m.prune_heads([1])
    m.load_state_dict(state(8, 4))


def py_pruned_twice(tmp):
    m = mha.MultiHeadAttention(12, 4)
    m.prune_heads([2])
    m.prune_heads([2])


PY = {
    "mha.num_heads": lambda t: mha.MultiHeadAttention(10, 0),
    "mha.num_hiddens": lambda t: mha.MultiHeadAttention(-4, 2),
    "mha.divisible": lambda t: mha.MultiHeadAttention(10, 3),
    "mha.dropout": lambda t: mha.MultiHeadAttention(10, 2, 1.5),
    "forward.rank": lambda t: forward(ones(2, 4), Y, Y),
    "forward.keys_batch": lambda t: forward(X, ones(3, 6, 100), ones(3, 6, 100)),
    "forward.values_batch": lambda t: forward(X, Y, ones(1, 6, 100)),
    "forward.values_positions": lambda t: forward(X, Y, ones(2, 5, 100)),
    "forward.no_keys": lambda t: forward(X, ones(2, 0, 100), ones(2, 0, 100)),
    "forward.no_features": lambda t: forward(ones(2, 4, 0), Y, Y),
    "forward.width": py_width,
    "forward.overflow": lambda t: blas_module(1 << 24, 1 << 24)(*[ones(1, 1 << 20, 1)] * 3),
    "forward.memory_limit": py_memory_limit,
    "weights.memory_limit": py_weights_limit,
    "weights.no_call": lambda t: mha.MultiHeadAttention(8, 2).attention_weights_of([0], [0]),
    "weights.row": lambda t: called_module().attention_weights_of([2], [0]),
    "weights.head": lambda t: called_module().attention_weights_of([0], [-1]),
    "threads.count": lambda t: mha.set_num_threads(0),
    "lens.batch": lambda t: forward(X, Y, Y, np.array([1, 2, 3])),
    "lens.query": lambda t: forward(X, Y, Y, ones(2, 3)),
    "lens.nan": lambda t: forward(X, Y, Y, np.array([np.nan, 2])),
    "lens.negative": lambda t: forward(X, Y, Y, np.array([3, -1])),
    "py.lens_rank": lambda t: forward(X, Y, Y, ones(2, 4, 1)),
    "py.lens_numeric": lambda t: forward(X, Y, Y, np.array([object(), object()])),
    "state.unexpected": lambda t: mha.MultiHeadAttention(8, 2).load_state_dict(state(8, 4, bias=True)),
    "state.missing": lambda t: mha.MultiHeadAttention(8, 2).load_state_dict(state(8, 4, **{"W_o.weight": None})),
    "state.weight_shape": lambda t: mha.MultiHeadAttention(8, 2).load_state_dict(state(8, 4, **{"W_o.weight": ones(8, 7)})),
    "state.weight_initialised": py_reinit,
    "state.bias_shape": lambda t: mha.MultiHeadAttention(8, 2, 0.0, bias=True).load_state_dict(
        state(8, 4, bias=True, **{"W_k.bias": ones(7)})),
    "py.array": lambda t: mha.MultiHeadAttention(8, 2).load_state_dict({"W_q.weight": object()}),
    "softmax.rank": lambda t: mha.masked_softmax(ones(4, 6)),
    "dpa.dropout": lambda t: mha.DotProductAttention(-0.1),
    "dpa.queries_rank": lambda t: mha.DotProductAttention()(ones(4, 2), ones(2, 6, 2), ones(2, 6, 3)),
    "dpa.keys_rank": lambda t: mha.DotProductAttention()(ones(2, 4, 2), ones(6, 2), ones(2, 6, 3)),
    "dpa.values_rank": lambda t: mha.DotProductAttention()(ones(2, 4, 2), ones(2, 6, 2), ones(6, 3)),
    "dpa.keys_shape": lambda t: mha.DotProductAttention()(ones(2, 4, 2), ones(2, 6, 3), ones(2, 6, 3)),
    "dpa.values_shape": lambda t: mha.DotProductAttention()(ones(2, 4, 2), ones(2, 6, 2), ones(2, 5, 3)),
    "dpa.no_keys": lambda t: mha.DotProductAttention()(ones(2, 4, 2), ones(2, 0, 2), ones(2, 0, 3)),
    "st.metadata_name": lambda t: mha.save_safetensors(str(t / "m.safetensors"), {"__metadata__": ones(1)}),
    "read.open": lambda t: mha.load_safetensors(str(t / "missing.safetensors")),
    "read.not_regular": lambda t: mha.load_safetensors(str(t)),
    "read.memory_limit": py_read_limit,
    "write.empty": lambda t: mha.save_safetensors("", {}),
    "write.folder": lambda t: mha.save_safetensors(str(t), {}),
    "write.create": lambda t: mha.save_safetensors(str(t / "no" / "such" / "x.safetensors"), {}),
    "prune.gates_size": lambda t: setattr(mha.MultiHeadAttention(12, 4), "head_gates", [1, 1, 1]),
    "prune.gates_finite": lambda t: setattr(mha.MultiHeadAttention(12, 4), "head_gates", [1, 1, np.nan, 1]),
    "prune.head_range": lambda t: mha.MultiHeadAttention(12, 4).prune_heads([4]),
    "prune.already": py_pruned_twice,
    "prune.twice": lambda t: mha.MultiHeadAttention(12, 4).prune_heads([1, 1]),
    "prune.all": lambda t: mha.MultiHeadAttention(12, 4).prune_heads([0, 1, 2, 3]),
    "prune.state_shape": py_pruned_state,
    "py.importance_keys": lambda t: mha.gradient_importance(
        py_small_model(), [{"tokens": np.zeros((1, 2), np.int64), "valid_lens": np.ones(1)}]),
    "py.importance_numeric": lambda t: mha.gradient_importance(
        py_small_model(), [{"tokens": np.array([["a", "b"]]), "targets": np.zeros((1, 2), np.int64),
                            "valid_lens": np.ones(1)}]),
    "py.importance_shapes": lambda t: mha.gradient_importance(
        py_small_model(), [{"tokens": np.zeros((1, 2), np.int64), "targets": np.zeros((1, 3), np.int64),
                            "valid_lens": np.ones(1)}]),
}
for _id, _bytes in ST_HEADERS.items():
    PY[_id] = lambda t, b=_bytes: mha.load_safetensors(raw_file(t / "bad.safetensors", raw=b))
assert not set(PY) & set(catalogue_triggers.PY), "a row has two Python triggers"
PY.update(catalogue_triggers.PY)


def rows_for(surface):
    return [(i, m) for i, m, s in ROWS if surface in s]


@pytest.fixture(autouse=True)
def default_memory_limit():
    yield
    mha.set_memory_limit(0)


def test_catalogue_is_there():
    assert len(ROWS) >= 50
    ids = [i for i, _, _ in ROWS]
    assert len(ids) == len(set(ids)), "duplicate ids in docs/errors.md"


@pytest.mark.parametrize("row_id,message", rows_for("Python"), ids=[i for i, _ in rows_for("Python")])
def test_python_row(row_id, message, tmp_path):
    assert row_id in PY, f"no Python trigger for catalogue row {row_id}"
    with pytest.raises(ValueError) as err:
        PY[row_id](tmp_path)
    assert re.fullmatch(message_regex(message), str(err.value)), f"\ndocumented: {message}\n    raised: {err.value}"


def test_every_python_trigger_is_catalogued():
    assert set(PY) <= {i for i, _ in rows_for("Python")}


# ---- the command-line tool -------------------------------------------------

def files(tmp, weights=None, inputs=None, D=100, inp=100, B=2, Q=4, K=6, lens=None):
    """Writes weights and inputs files (defaults: a valid D=100 run, seed shapes)."""
    w = tmp / "w.safetensors"
    i = tmp / "i.safetensors"
    if isinstance(weights, bytes):
        w.write_bytes(weights)
    else:
        mha.save_safetensors(str(w), weights if weights is not None else state(D, inp))
    if isinstance(inputs, bytes):
        i.write_bytes(inputs)
    else:
        t = inputs if inputs is not None else {"queries": ones(B, Q, inp), "keys": ones(B, K, inp),
                                                "values": ones(B, K, inp)}
        if lens is not None:
            t = dict(t, valid_lens=lens)
        mha.save_safetensors(str(i), t)
    return ["run", "--weights", str(w), "--inputs", str(i), "--out", str(tmp / "o.safetensors"), "--heads", "5"]


def qkv(q=(2, 4, 100), k=(2, 6, 100), v=(2, 6, 100)):
    return {"queries": ones(*q), "keys": ones(*k), "values": ones(*v)}


def with_heads(argv, h):
    return argv[:-1] + [str(h)]


def with_out(argv, out):
    return argv[:-3] + [out] + argv[-2:]


def raw_inputs(entries):
    return st(*tensors(entries))


def f32(shape):
    return np.ones(shape, np.float32).tobytes()


def with_recorded_heads(t, meta, heads):
    """A D=8 run whose weights file records `meta` (a pruned module's layout keys)."""
    argv = with_heads(files(t, D=8, inp=4, B=1, Q=1, K=1), heads)
    mha.save_safetensors(str(t / "w.safetensors"), state(8, 4), meta)
    return argv


def with_recorded_pruned(t):
    """A D=8 run on the weights of a 2-head module pruned to head 1 (one process, MPI's singleton)."""
    argv = with_heads(files(t, D=8, inp=4, B=1, Q=1, K=1), 2)
    weights = {"W_q.weight": ones(4, 4), "W_k.weight": ones(4, 4), "W_v.weight": ones(4, 4), "W_o.weight": ones(8, 4)}
    mha.save_safetensors(str(t / "w.safetensors"), weights, {"num_heads": "2", "heads_kept": "1"})
    return argv


CLI = {
    "mha.divisible": lambda t: with_heads(files(t, D=10, inp=4, B=1, Q=1, K=1), 3),
    "forward.rank": lambda t: files(t, inputs=qkv(q=(2, 4))),
    "forward.keys_batch": lambda t: files(t, inputs=qkv(k=(3, 6, 100), v=(3, 6, 100))),
    "forward.values_batch": lambda t: files(t, inputs=qkv(v=(1, 6, 100))),
    "forward.values_positions": lambda t: files(t, inputs=qkv(v=(2, 5, 100))),
    "forward.no_keys": lambda t: files(t, inputs=qkv(k=(2, 0, 100), v=(2, 0, 100))),
    "forward.no_features": lambda t: files(t, inputs=qkv(q=(2, 4, 0))),
    "forward.width": lambda t: files(t, inputs=qkv(k=(2, 6, 50))),
    "weights.memory_limit": lambda t: ["--memory-limit", "1048576"] + with_heads(files(
        t, weights=dict(state(8, 4), **{"W_k.weight": ones(8, 3), "W_v.weight": ones(8, 3)}),
        inputs=qkv(q=(1, 1024, 4), k=(1, 1024, 3), v=(1, 1024, 3))), 2),
    "lens.batch": lambda t: files(t, lens=np.array([1, 2, 3], np.float32)),
    "lens.query": lambda t: files(t, lens=ones(2, 3)),
    "lens.nan": lambda t: files(t, lens=np.array([np.nan, 2], np.float32)),
    "lens.negative": lambda t: files(t, lens=np.array([3, -1], np.float32)),
    "lens.rank": lambda t: files(t, lens=ones(2, 2, 1)),
    "state.unexpected": lambda t: with_heads(files(t, weights=state(8, 4, **{"W_k.bias": ones(8)}), inp=4), 2),
    "state.missing": lambda t: with_heads(files(t, weights=state(8, 4, **{"W_o.weight": None}), inp=4), 2),
    "state.weight_shape": lambda t: with_heads(files(t, weights=state(8, 4, **{"W_o.weight": ones(8, 7)}), inp=4), 2),
    "state.bias_shape": lambda t: with_heads(files(t, weights=state(8, 4, bias=True, **{"W_k.bias": ones(7)}), inp=4), 2),
    "st.f32": lambda t: files(t, weights=st(*tensors([("W_q.weight", "F64", [100, 100], bytes(80000))]))),
    "read.memory_limit": lambda t: ["--memory-limit", "1048576"] + files(t, weights={"x": ones(512, 1024)}),
    "write.empty": lambda t: with_out(files(t), ""),
    "write.folder": lambda t: with_out(files(t), str(t)),
    "write.create": lambda t: with_out(files(t), str(t / "no" / "such" / "x.safetensors")),
    "run.no_wq": lambda t: files(t, weights={"W_k.weight": ones(8, 4)}),
    "run.wq_rank": lambda t: files(t, weights={"W_q.weight": ones(8)}),
    "run.missing_input": lambda t: files(t, inputs={"queries": X, "keys": Y}),
    "run.lens_dtype": lambda t: files(t, inputs=raw_inputs([("queries", "F32", [2, 4, 100], f32((2, 4, 100))),
                                                            ("keys", "F32", [2, 6, 100], f32((2, 6, 100))),
                                                            ("values", "F32", [2, 6, 100], f32((2, 6, 100))),
                                                            ("valid_lens", "U8", [2], b"\x01\x02")])),
    "run.extra": lambda t: files(t, inputs=dict(qkv(), bias=ones(1))),
    "run.heads_metadata": lambda t: with_recorded_heads(t, {"num_heads": "x"}, 2),
    "run.heads_disagree": lambda t: with_recorded_heads(t, {"num_heads": "2"}, 4),
    "run.head_groups": lambda t: files(t) + ["--head-groups", "2"],
    "run.parallel_pruned": lambda t: with_recorded_pruned(t) + ["--parallel", "heads"],
    "run.input_dtype": lambda t: files(t, inputs=raw_inputs([("queries", "F64", [1], bytes(8)),
                                                             ("keys", "F32", [1], f32(1)),
                                                             ("values", "F32", [1], f32(1))])),
}
for _id, _bytes in ST_HEADERS.items():
    CLI[_id] = lambda t, b=_bytes: files(t, inputs=b)
assert not set(CLI) & set(catalogue_triggers.CLI), "a row has two CLI triggers"
CLI.update(catalogue_triggers.CLI)


def command_of(argv):
    """The subcommand of an argument list (after the tool's own options)."""
    i = 0
    while argv[i].startswith("--"):
        i += 2  # --memory-limit N
    return argv[i]


@pytest.mark.parametrize("row_id,message", rows_for("CLI"), ids=[i for i, _ in rows_for("CLI")])
def test_cli_row(row_id, message, tmp_path, mha_tool):
    assert row_id in CLI, f"no CLI trigger for catalogue row {row_id}"
    argv = CLI[row_id](tmp_path)
    r = subprocess.run([mha_tool] + argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr)
    want = f"mha {command_of(argv)}: error: " + message_regex(message) + "\n"
    assert re.fullmatch(want, r.stderr), f"\ndocumented: {message}\n   printed: {r.stderr}"
    # Nothing is written by a command that fails (the outputs are all named o.*).
    assert not list(tmp_path.glob("o.*"))


def test_every_cli_trigger_is_catalogued():
    assert set(CLI) <= {i for i, _ in rows_for("CLI")}
