"""mha's safetensors files against an independent reader and writer."""
import numpy as np
import pytest

import mha
import safetensors_spec as spec


def test_our_files_parse_with_the_spec_reader(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"W_q.weight": rng.standard_normal((6, 5)).astype(np.float32),
               "W_o.bias": np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, 3.4e38], np.float32),
               "empty": np.zeros((0, 3), np.float32)}
    path = tmp_path / "ours.safetensors"
    mha.save_safetensors(str(path), tensors, {"num_heads": "3"})
    read, meta = spec.read(path)
    assert meta == {"num_heads": "3"}
    assert set(read) == set(tensors)
    for name, t in tensors.items():
        assert read[name].dtype == np.float32
        assert read[name].tobytes() == t.tobytes(), name  # every bit
    # data offsets start 8-byte aligned
    assert int.from_bytes(path.read_bytes()[:8], "little") % 8 == 0


def test_spec_files_load_in_mha(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"a": rng.standard_normal((2, 3, 4)).astype(np.float32),
               "lens32": np.array([3, 0, 7], np.int32),
               "lens64": np.array([[1, 2], [3, 4]], np.int64),
               "half": np.array([1.5, -2.0], np.float16)}
    path = tmp_path / "spec.safetensors"
    spec.write(path, tensors, {"k": "v"}, dtypes={"lens32": "I32", "lens64": "I64", "half": "F16"})
    loaded = mha.load_safetensors(str(path))
    assert mha.safetensors_metadata(str(path)) == {"k": "v"}
    assert loaded["a"].tobytes() == tensors["a"].tobytes()
    np.testing.assert_array_equal(loaded["lens32"], tensors["lens32"])
    assert loaded["lens64"].dtype == np.int64
    np.testing.assert_array_equal(loaded["lens64"], tensors["lens64"])
    np.testing.assert_array_equal(loaded["half"], tensors["half"].astype(np.float32))


def test_module_weights_round_trip_through_files(tmp_path):
    rng = np.random.default_rng(2)
    m = mha.MultiHeadAttention(12, 4, bias=True, seed=3).eval()
    q, kv = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 4, 7))
    out = m(q, kv, kv)
    path = tmp_path / "m.safetensors"
    mha.save_safetensors(str(path), m.state_dict())
    state, _ = spec.read(path)
    m2 = mha.MultiHeadAttention(12, 4, bias=True, seed=99).eval()
    m2.load_state_dict(state)
    np.testing.assert_array_equal(m2(q, kv, kv), out)


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b[:5], "too short"),
    (lambda b: b"", "too short"),
    (lambda b: (10 ** 6).to_bytes(8, "little") + b[8:], "runs past the end"),
    (lambda b: b[:8] + b"}" + b[9:], "not valid JSON"),
    (lambda b: b[:-4], "past the data buffer"),
])
def test_broken_files_are_refused(tmp_path, mutate, message):
    path = tmp_path / "x.safetensors"
    spec.write(path, {"x": np.arange(4, dtype=np.float32)})
    path.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(ValueError, match=message):
        mha.load_safetensors(str(path))
