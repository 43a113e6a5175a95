"""The tool's options and outputs are checked before any work (round two of
hardening): a command that fails leaves no file, never replaces a link or a
device, never writes two outputs to one file or over its input, and refuses
numbers it would otherwise wrap or ignore."""
import os
import pathlib
import stat
import subprocess

import numpy as np
import pytest

import mha

SMALL = ["--hiddens", "8", "--heads", "2", "--eval-size", "4"]


def tool(mha_tool, cwd, *args, timeout=120):
    return subprocess.run([mha_tool, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def files_in(folder):
    return sorted(p.name for p in pathlib.Path(folder).rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def checkpoint(mha_tool, tmp_path_factory):
    """A 1-step model with 4 heads, enough for mha prune."""
    folder = tmp_path_factory.mktemp("ck")
    r = tool(mha_tool, folder, "train", "--hiddens", "8", "--heads", "4", "--eval-size", "4", "--steps", "1",
             "--out", folder / "ck.safetensors", "--curves", "", "--plot", "")
    assert r.returncode == 0, r.stderr
    return folder / "ck.safetensors"


@pytest.mark.parametrize("args,message", [
    (["--steps", "0"], "--steps: 0 steps leave no curve to draw"),
    (["--curves", "no/such/folder/c.csv"], "cannot create a temporary file beside 'no/such/folder/c.csv'"),
    (["--plot", "."], "'.' is a folder, not a file"),
    (["--plot", "model.safetensors"], "--plot: 'model.safetensors' names a safetensors file, but --plot writes a PNG"),
    (["--curves", "model.safetensors", "--plot", ""], "--curves: 'model.safetensors' names a safetensors file"),
    (["--curves", "x.txt", "--plot", "x.txt"], "--plot: 'x.txt' is also --curves; each output needs its own file"),
    (["--out", "x.png"], "--out: 'x.png' names a PNG picture, but --out writes a safetensors file"),
    (["--target", "nan"], "--target: nan is not in (0, 1]"),
    (["--lr", "inf"], "lr: inf is not finite"),
])
def test_train_refuses_before_any_work_and_leaves_no_file(mha_tool, tmp_path, args, message):
    steps = [] if "--steps" in args else ["--steps", "2"]
    r = tool(mha_tool, tmp_path, "train", *SMALL, *steps, *args)
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stderr
    assert "trained" not in r.stdout  # refused before training, not after
    assert files_in(tmp_path) == []


def test_steps_zero_never_replaces_a_checkpoint(mha_tool, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"trained")
    r = tool(mha_tool, tmp_path, "train", *SMALL, "--steps", "0", "--plot", "", "--curves", "")
    assert r.returncode == 1 and "would replace 'model.safetensors' by an untrained model" in r.stderr
    assert (tmp_path / "model.safetensors").read_bytes() == b"trained"


def test_divergent_training_stops_and_keeps_the_last_checkpoint(mha_tool, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"the last good checkpoint")
    r = tool(mha_tool, tmp_path, "train", *SMALL, "--steps", "5", "--lr", "1e30", "--clip", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "training diverged" in r.stderr and "'model.safetensors' is kept as it was" in r.stderr
    assert files_in(tmp_path) == ["model.safetensors"]
    assert (tmp_path / "model.safetensors").read_bytes() == b"the last good checkpoint"


@pytest.mark.parametrize("option,value,message", [
    ("--seed", "-1", "'-1' is not an integer in [0, 2^64 - 1]"),
    ("--seed", str(2**64), "'18446744073709551616' is not an integer in [0, 2^64 - 1]"),
])
def test_seeds_do_not_wrap(mha_tool, tmp_path, option, value, message):
    r = tool(mha_tool, tmp_path, "train", *SMALL, "--steps", "1", option, value)
    assert r.returncode != 0 and message in r.stdout + r.stderr
    assert files_in(tmp_path) == []


def test_a_negative_memory_limit_is_refused(mha_tool, tmp_path):
    r = tool(mha_tool, tmp_path, "--memory-limit", "-1", "train", *SMALL, "--steps", "1")
    assert r.returncode == 2 and "--memory-limit: '-1' is not a size" in r.stdout + r.stderr
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("args,part", [
    (["train", "--hiddens", "100000", "--heads", "1"], "num_layers x (W_q, W_k, W_v, W_o)"),
    (["train", "--layers", "1000000000"], "num_layers x (W_q, W_k, W_v, W_o)"),
    (["train", "--heads", "1000000000", "--hiddens", "1000000000"], "needs"),
    (["train", "--batch", "1000000000"], "a batch's activations"),
    (["train", "--eval-size", "1000000000"], "held-out set"),
    (["prune", "--importance-size", "1000000000"], "importance set (--importance-size"),
    (["prune", "--latency-batch", "1000000000"], "latency probe's"),
])
def test_huge_sizes_are_planned_against_the_memory_limit_first(mha_tool, tmp_path, args, part):
    r = tool(mha_tool, tmp_path, "--memory-limit", "4GB", *args, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "above the memory limit" in r.stderr and part in r.stderr
    assert "step" not in r.stdout  # nothing was trained
    assert files_in(tmp_path) == []


def test_outputs_that_are_not_regular_files_are_refused(mha_tool, tmp_path):
    target = tmp_path / "target.safetensors"
    target.write_bytes(b"keep")
    os.symlink(target, tmp_path / "link.safetensors")
    r = tool(mha_tool, tmp_path, "train", *SMALL, "--steps", "1", "--out", "link.safetensors")
    assert r.returncode == 1 and "is not a regular file" in r.stderr
    assert (tmp_path / "link.safetensors").is_symlink() and target.read_bytes() == b"keep"
    os.mkfifo(tmp_path / "fifo.csv")
    r = tool(mha_tool, tmp_path, "train", *SMALL, "--steps", "1", "--curves", "fifo.csv")
    assert r.returncode == 1 and "is not a regular file" in r.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo.csv").st_mode)
    with pytest.raises(ValueError, match="is not a regular file"):
        mha.save_safetensors(str(tmp_path / "link.safetensors"), {"x": np.ones(1, np.float32)})


def test_a_name_at_the_systems_length_limit_is_written(tmp_path):
    name = "n" * (255 - len(".safetensors")) + ".safetensors"
    mha.save_safetensors(str(tmp_path / name), {"x": np.ones(1, np.float32)})
    assert (tmp_path / name).exists() and files_in(tmp_path) == [name]


def test_run_refuses_to_write_over_its_input(mha_tool, tmp_path):
    w = {f"{n}.weight": np.ones((4, 4), np.float32) for n in ("W_q", "W_k", "W_v", "W_o")}
    mha.save_safetensors(str(tmp_path / "w.safetensors"), w)
    mha.save_safetensors(str(tmp_path / "i.safetensors"), {k: np.ones((1, 2, 4), np.float32)
                                                           for k in ("queries", "keys", "values")})
    before = (tmp_path / "i.safetensors").read_bytes()
    r = tool(mha_tool, tmp_path, "run", "--weights", "w.safetensors", "--inputs", "i.safetensors", "--heads", "2",
             "--out", "./i.safetensors")
    assert r.returncode == 1 and "--out: './i.safetensors' is also the input --inputs" in r.stderr
    assert (tmp_path / "i.safetensors").read_bytes() == before
    r = tool(mha_tool, tmp_path, "viz", "--weights", "w.safetensors", "--inputs", "i.safetensors", "--heads", "2",
             "--out", "heads.jpg")
    assert r.returncode == 1 and "--out: 'heads.jpg' names a JPEG picture, but --out writes a PNG picture" in r.stderr
    r = tool(mha_tool, tmp_path, "viz", "--weights", "w.safetensors", "--inputs", "i.safetensors", "--heads", "2",
             "--out", "h.png", "--layout-json", "h.png")
    assert r.returncode == 1 and "names a PNG picture, but --layout-json writes a JSON file" in r.stderr


def test_prune_checks_its_options_and_outputs_first(mha_tool, tmp_path, checkpoint):
    for args, message in [(["--pruned-out", "p.safetensors", "--keep", "9"], "--keep: 9 heads is not in [1, 4]"),
                          (["--csv", "x.txt", "--plot", "x.txt"], "--plot: 'x.txt' is also --csv"),
                          (["--plot", "no/such/p.png"], "cannot create a temporary file beside"),
                          (["--pruned-out", str(checkpoint)], "is also the input --checkpoint")]:
        r = tool(mha_tool, tmp_path, "prune", "--checkpoint", checkpoint, *args)
        assert r.returncode == 1 and message in r.stderr, (args, r.stderr)
        assert files_in(tmp_path) == []


def test_prune_reports_progress_line_by_line_with_the_fused_kernel(mha_tool, tmp_path, checkpoint):
    p = subprocess.Popen([mha_tool, "prune", "--checkpoint", str(checkpoint), "--importance-size", "8",
                          "--random-orders", "1", "--latency-repeats", "1", "--latency-batch", "2", "--kernel",
                          "fused", "--plot", "", "--csv", "", "--threads", "1"],
                         stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    first = p.stdout.readline()  # block-buffered output would arrive only at exit
    rest = p.stdout.read()
    assert p.wait(timeout=120) == 0
    assert first.startswith("mha prune:") and "fused kernel" in first
    for step in ("scoring heads: gradient", "pruning order 1/", "timing the forward pass"):
        assert step in rest


def test_threads_set_mhas_own_thread_count(mha_tool, tmp_path):
    r = tool(mha_tool, tmp_path, "train", *SMALL, "--steps", "1", "--threads", "3", "--plot", "", "--curves", "")
    assert r.returncode == 0, r.stderr
    assert "3 thread(s)" in r.stdout.splitlines()[0]
