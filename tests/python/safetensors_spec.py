"""An independent safetensors reader and writer, written from the format's
specification (not from mha's code), to check mha's files both ways.

Layout: u64 little-endian N; N bytes of UTF-8 JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}; then the data
buffer, offsets relative to its start, little-endian row-major values.
"""
import json
import struct

import numpy as np

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header runs past the end"
    header = json.loads(data[8:8 + n].decode("utf-8"))
    buffer = data[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dt = np.dtype(DTYPES[e["dtype"]])
        count = int(np.prod(e["shape"], dtype=np.int64))
        assert end - begin == count * dt.itemsize, name
        tensors[name] = np.frombuffer(buffer[begin:end], dtype=dt).reshape(e["shape"]).copy()
    return tensors, meta


def write(path, tensors, metadata=None, dtypes=None):
    """Write numpy arrays; dtypes maps a name to a spec dtype (default F32)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dt = (dtypes or {}).get(name, "F32")
        raw = np.ascontiguousarray(tensors[name], dtype=np.dtype(DTYPES[dt])).tobytes()
        header[name] = {"dtype": dt, "shape": list(np.shape(tensors[name])),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
