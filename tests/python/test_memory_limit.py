"""The memory limit from Python and from the tool (docs/errors.md has the
messages; tests/cpp/core/test_memory_limit.cpp the C++ side)."""
import os
import subprocess

import numpy as np
import pytest

import mha


@pytest.fixture(autouse=True)
def default_limit():
    yield
    mha.set_memory_limit(0)


def test_default_is_physical_memory_and_zero_restores_it():
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    assert mha.memory_limit() == phys
    mha.set_memory_limit(5000)
    assert mha.memory_limit() == 5000
    mha.set_memory_limit(0)
    assert mha.memory_limit() == phys


def test_a_refused_call_changes_nothing_and_runs_once_the_limit_allows():
    m = mha.MultiHeadAttention(8, 2)
    m.kernel = mha.Kernel.BLAS      # forms the weights in the call
    q, kv = np.ones((1, 512, 4), np.float32), np.ones((1, 512, 3), np.float32)
    mha.set_memory_limit(1 << 20)   # the (1, 2, 512, 512) weights need 2 MiB
    with pytest.raises(ValueError, match="above the memory limit of 1048576 bytes"):
        m(q, kv, kv)
    assert m.state_dict() == {}     # the lazy layers were not created
    mha.set_memory_limit(4 << 20)
    assert m(q, kv, kv).shape == (1, 512, 8)


def test_the_fused_call_needs_no_weights_and_attention_weights_is_checked():
    m = mha.MultiHeadAttention(8, 2).eval()  # fused: the weights only on first access
    q, kv = np.ones((1, 512, 4), np.float32), np.ones((1, 512, 3), np.float32)
    mha.set_memory_limit(1 << 20)   # the (1, 2, 512, 512) weights need 2 MiB
    assert m(q, kv, kv).shape == (1, 512, 8)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.attention_weights\] needs 2097152 bytes"):
        m.attention_weights
    assert m.attention_weights_of([0], [1]).shape == (1, 1, 512, 512)  # 1 MiB fits
    mha.set_memory_limit(4 << 20)
    assert m.attention_weights.shape == (1, 2, 512, 512)


@pytest.mark.parametrize("size,bytes_", [("1048576", 1048576), ("1MB", 1 << 20), ("1MiB", 1 << 20), ("2kb", 2048)])
def test_cli_memory_limit_takes_sizes_with_units(mha_tool, tmp_path, size, bytes_):
    w, i = tmp_path / "w.safetensors", tmp_path / "i.safetensors"
    mha.save_safetensors(str(w), {"x": np.ones(bytes_ // 4 + 64, np.float32)})  # just above the limit
    mha.save_safetensors(str(i), {"queries": np.ones((1, 1, 1), np.float32)})
    r = subprocess.run([mha_tool, "--memory-limit", size, "run", "--weights", str(w), "--inputs", str(i),
                        "--out", str(tmp_path / "o"), "--heads", "1"], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"above the memory limit of {bytes_} bytes" in r.stderr, r.stderr
