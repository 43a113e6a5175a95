"""The mha tool: the demo, `mha run` against the seed's PyTorch code, errors."""
import subprocess

import numpy as np
import pytest
import torch

import safetensors_spec as spec
from seed_reference import make_seed_module, state_dict_numpy


def run(tool, *args):
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)


def test_demo_prints_the_seed_check(mha_tool, tmp_path):
    r = subprocess.run([mha_tool, "demo"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "output shape: (2, 4, 100)" in r.stdout
    # batch row 0 has valid_len 3: every head shows 1/3 on keys 0..2, 0 beyond.
    rows = [l.split() for l in r.stdout.splitlines() if l.strip().startswith("query")]
    assert len(rows) == 5 * 4
    for row in rows:
        assert [float(x) for x in row[2:]] == pytest.approx([1 / 3] * 3 + [0.0] * 3, abs=1e-4)


def test_every_command_has_help(mha_tool):
    for cmd in ([], ["demo"], ["run"]):
        r = run(mha_tool, *cmd, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, cmd


@pytest.mark.parametrize("lens", [None, np.array([0, 3, 9], np.int64), np.array([[1, 2.5], [0, 4], [7, 1]], np.float32), np.array([2, 1, 0], np.int32)])
def test_run_matches_the_seed(mha_tool, tmp_path, lens):
    rng = np.random.default_rng(0)
    B, Q, K, H, D = 3, 2, 6, 4, 12
    seed_mod = make_seed_module(D, H, 5, 7, 3, bias=True).eval()
    weights, inputs, out = tmp_path / "w.safetensors", tmp_path / "i.safetensors", tmp_path / "o.safetensors"
    spec.write(weights, state_dict_numpy(seed_mod))
    tensors = {"queries": rng.standard_normal((B, Q, 5)), "keys": rng.standard_normal((B, K, 7)),
               "values": rng.standard_normal((B, K, 3))}
    dtypes = {}
    if lens is not None:
        tensors["valid_lens"] = lens
        dtypes["valid_lens"] = {np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.float32): "F32"}[lens.dtype]
    spec.write(inputs, tensors, dtypes=dtypes)
    r = run(mha_tool, "run", "--weights", str(weights), "--inputs", str(inputs), "--out", str(out), "--heads", str(H))
    assert r.returncode == 0, r.stderr
    got, _ = spec.read(out)
    with torch.no_grad():
        t = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in tensors.items() if k != "valid_lens"}
        expected = seed_mod(t["queries"], t["keys"], t["values"], None if lens is None else torch.from_numpy(lens)).numpy()
        expected_w = seed_mod.attention.attention_weights.reshape(B, H, Q, K).numpy()
    np.testing.assert_allclose(got["output"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["attention_weights"], expected_w, rtol=1e-5, atol=1e-6)


def test_run_in_bfloat16_is_the_modules_bfloat16_mode(mha_tool, tmp_path):
    """--precision bf16 gives what MultiHeadAttention(precision='bf16') gives, bit for bit,
    and differs from the float32 run by bfloat16 rounding (not 0, under 5e-2 of the scale)."""
    import mha
    rng = np.random.default_rng(3)
    B, Q, K, H, D = 2, 5, 7, 4, 16
    seed_mod = make_seed_module(D, H, 6, 6, 6, bias=True).eval()
    state = state_dict_numpy(seed_mod)
    weights, inputs = tmp_path / "w.safetensors", tmp_path / "i.safetensors"
    spec.write(weights, state)
    tensors = {n: rng.standard_normal((B, L, 6)).astype(np.float32) for n, L in (("queries", Q), ("keys", K), ("values", K))}
    spec.write(inputs, tensors)
    outs = {}
    for precision in ("float32", "bf16"):
        out = tmp_path / f"{precision}.safetensors"
        r = run(mha_tool, "run", "--weights", str(weights), "--inputs", str(inputs), "--out", str(out),
                "--heads", str(H), "--precision", precision)
        assert r.returncode == 0, r.stderr
        outs[precision] = spec.read(out)[0]["output"]
    m = mha.MultiHeadAttention(D, H, 0.0, True, precision="bf16")
    m.load_state_dict(state)
    m.eval()
    np.testing.assert_array_equal(outs["bf16"], m(tensors["queries"], tensors["keys"], tensors["values"]))
    err = np.abs(outs["bf16"] - outs["float32"]).max() / np.abs(outs["float32"]).max()
    assert 0 < err < 5e-2, err
    r = run(mha_tool, "run", "--weights", str(weights), "--inputs", str(inputs), "--out",
            str(tmp_path / "x.safetensors"), "--heads", str(H), "--precision", "fp16")
    assert r.returncode == 1 and "precision: 'fp16' is not a precision" in r.stderr
    assert not (tmp_path / "x.safetensors").exists()


def test_run_errors_leave_no_output(mha_tool, tmp_path):
    rng = np.random.default_rng(1)
    weights, inputs, out = tmp_path / "w.safetensors", tmp_path / "i.safetensors", tmp_path / "o.safetensors"
    spec.write(weights, state_dict_numpy(make_seed_module(8, 2, 4, 4, 4, bias=False)))

    def expect_error(tensors, message, heads="2", dtypes=None, weights_path=weights):
        spec.write(inputs, tensors, dtypes=dtypes)
        r = run(mha_tool, "run", "--weights", str(weights_path), "--inputs", str(inputs), "--out", str(out), "--heads", heads)
        assert r.returncode != 0
        assert message in r.stderr, r.stderr
        assert not out.exists()
        assert not list(tmp_path.glob("o.safetensors*")), "a temporary file was left behind"

    good = {"queries": rng.standard_normal((2, 3, 4)), "keys": rng.standard_normal((2, 5, 4)),
            "values": rng.standard_normal((2, 5, 4))}
    expect_error({k: v for k, v in good.items() if k != "keys"}, "no tensor 'keys'")
    expect_error({**good, "keys": rng.standard_normal((3, 5, 4))}, "keys: batch size 3 differs from queries' 2")
    expect_error({**good, "values": rng.standard_normal((2, 6, 4))}, "has 6 positions but keys (2, 5, 4) have 5")
    expect_error({**good, "queries": rng.standard_normal((2, 3, 6))}, "queries: width 6")
    expect_error({**good, "valid_lens": np.array([1, -3], np.float32)}, "valid_lens: entry 1 is -3")
    expect_error({**good, "valid_lens": np.array([1, np.nan], np.float32)}, "valid_lens: entry 1 is NaN")
    expect_error({**good, "valid_lens": np.array([1, 2, 3], np.float32)}, "valid_lens: shape (3,)")
    expect_error({**good, "valid_lens": np.array([1, 2], np.float64)}, "dtype F64 where F32, I32 or I64 is wanted", dtypes={"valid_lens": "F64"})
    expect_error({**good, "queries": np.ones((2, 3, 4))}, "dtype F64 where F32 is wanted", dtypes={"queries": "F64"})
    expect_error(good, "num_hiddens: 8 is not divisible by num_heads 3", heads="3")
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    expect_error(good, "not valid JSON", weights_path=broken)
    misshapen = tmp_path / "misshapen.safetensors"
    state = state_dict_numpy(make_seed_module(8, 2, 4, 4, 4, bias=False))
    spec.write(misshapen, {**state, "W_o.weight": np.ones((8, 5), np.float32)})
    expect_error(good, "W_o.weight: shape (8, 5) is not (8, 8)", weights_path=misshapen)
    spec.write(misshapen, {k: v for k, v in state.items() if k != "W_v.weight"})
    expect_error(good, "missing parameter 'W_v.weight'", weights_path=misshapen)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    expect_error(good, "too short", weights_path=empty)


def test_run_keeps_a_good_output_on_error(mha_tool, tmp_path):
    out = tmp_path / "o.safetensors"
    out.write_bytes(b"previous result")
    weights, inputs = tmp_path / "w.safetensors", tmp_path / "i.safetensors"
    spec.write(weights, state_dict_numpy(make_seed_module(8, 2, 4, 4, 4, bias=False)))
    spec.write(inputs, {"queries": np.ones((1, 2, 4)), "keys": np.ones((1, 3, 4)), "values": np.ones((1, 2, 4))})
    r = run(mha_tool, "run", "--weights", str(weights), "--inputs", str(inputs), "--out", str(out), "--heads", "2")
    assert r.returncode != 0
    assert out.read_bytes() == b"previous result"
