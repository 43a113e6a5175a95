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


def _default_limit():
    """Physical memory, or the address-space limit (ulimit -v) when lower."""
    import resource
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return phys if soft == resource.RLIM_INFINITY else min(phys, soft)


def test_default_is_physical_memory_and_zero_restores_it():
    phys = _default_limit()
    assert mha.memory_limit() == phys
    mha.set_memory_limit(5000)
    assert mha.memory_limit() == 5000
    mha.set_memory_limit(0)
    assert mha.memory_limit() == phys


def test_an_address_space_limit_lowers_the_default_and_huge_models_are_refused():
    """Under ulimit -v (RLIMIT_AS) the default limit is that limit, so a model of 10^7 layers is
    refused with mha's message before anything is allocated (it aborted the process in glibc when a
    thread's local data could not be mapped, or ran into std::bad_alloc); the per-layer objects count."""
    import resource
    import sys
    code = ("import mha\n"
            "print(mha.memory_limit())\n"
            "try:\n"
            "    mha.AttentionModel(9, 4, 8, 8, 2, num_layers=10**7)\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    limit = 8_000_000_000

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=cap, timeout=120)
    assert r.returncode == 0, r.stderr
    first, message = r.stdout.splitlines()[:2]
    assert int(first) == min(limit, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE"))
    assert message.startswith("[AttentionModel] needs ") and "above the memory limit of" in message, message
    assert "num_layers x the layers' own objects" in message or "num_layers x (W_q" in message, message


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
