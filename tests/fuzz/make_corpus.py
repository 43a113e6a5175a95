#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus: small valid and broken safetensors files.

    /usr/bin/python3 tests/fuzz/make_corpus.py      # rewrites tests/fuzz/corpus/

corpus/safetensors/ seeds the reader's fuzzer, corpus/run_inputs/ the one for
`mha run`'s inputs file. Files are written by hand (struct + json), not by
mha, so that the broken ones can be broken in every way the reader checks.
The regression test (tests/cpp/tools/test_fuzz_corpus.cpp) replays all of them.
"""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def st(entries, data, metadata=None, pad=True, header_len=None):
    """A safetensors file from a header dict (name -> dtype, shape, offsets)."""
    header = dict(entries)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + data


def f32(*values):
    return struct.pack(f"<{len(values)}f", *values)


def tensors(named):
    """(entries, data) for [(name, dtype, shape, bytes)] laid out in order."""
    entries, data = {}, b""
    for name, dtype, shape, raw in named:
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return entries, data


def reader_corpus():
    out = {}
    e, d = tensors([("a", "F32", [2, 3], f32(*range(6)))])
    out["valid_f32"] = st(e, d)
    e, d = tensors([("x", "F64", [2], struct.pack("<2d", 1.5, -2)), ("y", "F16", [3], struct.pack("<3H", 0x3c00, 0x7c00, 0x7e00)),
                    ("z", "BF16", [1], struct.pack("<H", 0x3f80)), ("i", "I64", [1], struct.pack("<q", -7)),
                    ("j", "I32", [2], struct.pack("<2i", 1, 2)), ("k", "I16", [1], struct.pack("<h", 3)),
                    ("l", "I8", [1], b"\xff"), ("u", "U8", [2], b"\x01\x02"), ("b", "BOOL", [2], b"\x00\x01")])
    out["valid_all_dtypes"] = st(e, d, metadata={"format": "pt", "k": "v"})
    out["valid_empty"] = st({}, b"")
    e, d = tensors([("s", "F32", [], f32(4.0)), ("z", "F32", [0, 5], b"")])
    out["valid_scalar_and_zero"] = st(e, d)
    out["short"] = b"\x01\x02\x03"
    out["header_too_long"] = struct.pack("<Q", 1 << 40) + b"{}"
    out["header_past_end"] = struct.pack("<Q", 64) + b"{}"
    out["not_json"] = st({}, b"")[:8] + b"{not json"
    out["not_object"] = struct.pack("<Q", 2) + b"[]"
    out["bad_dtype"] = st({"a": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}, b"\x00")
    out["negative_dim"] = st({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, f32(1))
    out["size_mismatch"] = st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, f32(1, 2))
    out["offsets_reversed"] = st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, f32(1))
    out["hole"] = st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, f32(1, 2))
    out["overlap"] = st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, f32(1, 2))
    out["terabyte_tensor"] = st({"a": {"dtype": "F32", "shape": [1 << 38], "data_offsets": [0, 1 << 40]}}, f32(1))
    out["overflow_shape"] = st({"a": {"dtype": "F32", "shape": [1 << 32, 1 << 32], "data_offsets": [0, 0]}}, b"")
    out["metadata_not_string"] = st({}, b"", metadata={"n": 1})
    out["deep_nesting"] = struct.pack("<Q", 2000) + b"[" * 1000 + b"]" * 1000
    return out


def run_inputs_corpus():
    out = {}
    q, k = f32(*[0.1 * i for i in range(2 * 3 * 4)]), f32(*[0.2 * i for i in range(2 * 5 * 6)])
    v = f32(*[-0.1 * i for i in range(2 * 5 * 3)])
    base = [("queries", "F32", [2, 3, 4], q), ("keys", "F32", [2, 5, 6], k), ("values", "F32", [2, 5, 3], v)]
    out["valid_no_lens"] = st(*tensors(base))
    out["valid_lens_batch_i64"] = st(*tensors(base + [("valid_lens", "I64", [2], struct.pack("<2q", 3, 0))]))
    out["valid_lens_query_f32"] = st(*tensors(base + [("valid_lens", "F32", [2, 3], f32(1, 2.5, 9, 0, 5, 1))]))
    out["valid_lens_i32"] = st(*tensors(base + [("valid_lens", "I32", [2], struct.pack("<2i", 1, 5))]))
    out["lens_nan"] = st(*tensors(base + [("valid_lens", "F32", [2], f32(float("nan"), 1))]))
    out["lens_negative"] = st(*tensors(base + [("valid_lens", "I32", [2], struct.pack("<2i", -1, 5))]))
    out["lens_wrong_shape"] = st(*tensors(base + [("valid_lens", "F32", [3], f32(1, 2, 3))]))
    out["lens_bad_dtype"] = st(*tensors(base + [("valid_lens", "U8", [2], b"\x01\x02")]))
    out["missing_values"] = st(*tensors(base[:2]))
    out["extra_tensor"] = st(*tensors(base + [("bias", "F32", [1], f32(0))]))
    out["queries_f64"] = st(*tensors([("queries", "F64", [1, 1, 1], struct.pack("<d", 1))] + base[1:]))
    out["batch_mismatch"] = st(*tensors([("queries", "F32", [1, 3, 4], q[:48])] + base[1:]))
    out["no_keys"] = st(*tensors([base[0], ("keys", "F32", [2, 0, 6], b""), ("values", "F32", [2, 0, 3], b"")]))
    out["zero_width"] = st(*tensors([("queries", "F32", [2, 3, 0], b"")] + base[1:]))
    out["rank2_queries"] = st(*tensors([("queries", "F32", [6, 4], q)] + base[1:]))
    out["nonfinite"] = st(*tensors([("queries", "F32", [1, 1, 2], f32(float("inf"), float("nan"))),
                                    ("keys", "F32", [1, 2, 2], f32(1, float("-inf"), 0, 1)),
                                    ("values", "F32", [1, 2, 1], f32(float("nan"), 2))]))
    # Large B*Q*K from tiny inputs: weights (B, 2, Q, K) above the fuzz memory limit.
    out["huge_attention"] = st(*tensors([("queries", "F32", [1, 8192, 1], f32(*([0] * 8192))), ("keys", "F32", [1, 8192, 1], f32(*([0] * 8192))),
                                         ("values", "F32", [1, 8192, 1], f32(*([0] * 8192)))]))
    return out


def main():
    for folder, files in (("safetensors", reader_corpus()), ("run_inputs", run_inputs_corpus())):
        d = HERE / "corpus" / folder
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.safetensors"):
            old.unlink()
        for name, data in files.items():
            (d / f"{name}.safetensors").write_bytes(data)
        print(f"{d}: {len(files)} files")


if __name__ == "__main__":
    main()
