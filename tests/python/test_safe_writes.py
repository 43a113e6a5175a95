"""Files the tool writes appear whole or not at all.

`mha run` writes its output through write_file_atomic: an unnamed file
(O_TMPFILE) in the target's folder, flushed, then linked and renamed into
place. These tests kill the tool with SIGKILL while it is writing a large
output and check that an existing good file is untouched and that nothing
else, partial or temporary, is left in the folder.
"""
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import mha

D, H, L, W = 64, 4, 4096, 8   # attention_weights (1, 4, 4096, 4096): 256 MiB of output


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    """weights and inputs files for a `mha run` whose output is 256 MiB."""
    d = tmp_path_factory.mktemp("bigrun")
    rng = np.random.default_rng(0)
    mha.save_safetensors(str(d / "weights.safetensors"), {
        "W_q.weight": rng.standard_normal((D, W)).astype(np.float32),
        "W_k.weight": rng.standard_normal((D, W)).astype(np.float32),
        "W_v.weight": rng.standard_normal((D, W)).astype(np.float32),
        "W_o.weight": rng.standard_normal((D, D)).astype(np.float32),
    })
    x = rng.standard_normal((1, L, W)).astype(np.float32)
    mha.save_safetensors(str(d / "inputs.safetensors"), {"queries": x, "keys": x, "values": x})
    return d


def write_fds(pid, folder):
    """Descriptors of `pid` open on a file in `folder` other than the inputs."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)) and not target.endswith(("weights.safetensors", "inputs.safetensors")):
            out.append(target)
    return out


def run_and_kill_mid_write(mha_tool, folder, out):
    """Starts `mha run`, SIGKILLs it once it has an output file open; the fd targets seen."""
    proc = subprocess.Popen(
        [mha_tool, "run", "--weights", str(folder / "weights.safetensors"),
         "--inputs", str(folder / "inputs.safetensors"), "--out", str(out), "--heads", str(H)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = []
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        seen = write_fds(proc.pid, folder)
        if seen:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.0005)
    proc.wait()
    if not seen:
        pytest.fail(f"never saw `mha run` writing (exit {proc.returncode}): {proc.stderr.read().decode()}")
    assert proc.returncode == -signal.SIGKILL
    return seen


def test_sigkill_mid_write_keeps_the_old_file_and_leaves_nothing(mha_tool, big_run, tmp_path):
    out = big_run / "out.safetensors"
    mha.save_safetensors(str(out), {"output": np.arange(6, dtype=np.float32).reshape(2, 3)})
    good = out.read_bytes()
    seen = run_and_kill_mid_write(mha_tool, big_run, out)
    assert out.read_bytes() == good, "the existing output was replaced by a partial one"
    assert sorted(os.listdir(big_run)) == ["inputs.safetensors", "out.safetensors", "weights.safetensors"], seen
    np.testing.assert_array_equal(mha.load_safetensors(str(out))["output"], np.arange(6).reshape(2, 3))
    # The descriptor killed mid-write was the unnamed file, not the target.
    assert all(s.endswith("(deleted)") or ".tmp-" in s for s in seen), seen
    out.unlink()


def test_sigkill_mid_write_with_no_old_file_leaves_no_file(mha_tool, big_run):
    out = big_run / "fresh.safetensors"
    assert not out.exists()
    run_and_kill_mid_write(mha_tool, big_run, out)
    assert sorted(os.listdir(big_run)) == ["inputs.safetensors", "weights.safetensors"]


def test_a_finished_write_is_complete_and_alone(mha_tool, big_run):
    out = big_run / "done.safetensors"
    subprocess.run([mha_tool, "run", "--weights", str(big_run / "weights.safetensors"),
                    "--inputs", str(big_run / "inputs.safetensors"), "--out", str(out),
                    "--heads", str(H)], check=True, capture_output=True)
    got = mha.load_safetensors(str(out))
    assert got["attention_weights"].shape == (1, H, L, L)
    assert got["output"].shape == (1, L, D)
    out.unlink()
    assert sorted(os.listdir(big_run)) == ["inputs.safetensors", "weights.safetensors"]


def test_a_failed_write_changes_nothing(tmp_path):
    """Into a missing folder or onto a folder: an error naming the file, no file made."""
    with pytest.raises(ValueError, match=r"\[write\] cannot create a temporary file beside '.*/missing/x.safetensors': "
                                         r"No such file or directory"):
        mha.save_safetensors(str(tmp_path / "missing" / "x.safetensors"), {"a": np.zeros(2, np.float32)})
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match=r"\[write\] '.*/dir' is a folder, not a file"):
        mha.save_safetensors(str(tmp_path / "dir"), {"a": np.zeros(2, np.float32)})
    assert sorted(os.listdir(tmp_path)) == ["dir"] and not os.listdir(tmp_path / "dir")


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_a_replaced_file_keeps_its_permissions(tmp_path, mode):
    """write_file_atomic renames a temporary file over the old one: it takes the old one's mode."""
    import stat
    path = tmp_path / "w.safetensors"
    mha.save_safetensors(str(path), {"a": np.ones(2, np.float32)})
    path.chmod(mode)
    mha.save_safetensors(str(path), {"b": np.ones(3, np.float32)})
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert list(mha.load_safetensors(str(path))) == ["b"]
