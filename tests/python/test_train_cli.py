"""`mha train`: progress, outputs, the stated accuracy, reproducibility, resuming."""
import csv
import re
import subprocess

import numpy as np

import mha


def train(tool, tmp_path, name, *args):
    out, curves = tmp_path / f"{name}.safetensors", tmp_path / f"{name}.csv"
    plot = tmp_path / f"{name}.png"
    r = subprocess.run([tool, "train", "--out", str(out), "--curves", str(curves), "--plot", str(plot), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with open(curves) as f:
        rows = list(csv.DictReader(f))
    return r.stdout, out, rows


def test_train_reaches_the_stated_accuracy(mha_tool, tmp_path):
    stdout, out, rows = train(mha_tool, tmp_path, "target", "--steps", "400", "--stop-at-target",
                              "--target", "0.99", "--threads", "1")
    m = re.search(r"held-out accuracy reached 99.0% at step (\d+) after ([\d.]+) s", stdout)
    assert m, stdout
    step = int(m.group(1))
    assert rows[-1]["step"] == str(step)
    assert float(rows[-1]["held_out_accuracy"]) >= 0.99
    # The checkpoint holds a model that really is that accurate on new sequences.
    model, task, meta = mha.load_checkpoint(str(out))
    assert meta["train.step"] == str(step)
    correct = scored = 0
    for seed in range(4):
        b = task.sample(128, 1000 + seed)
        pred = model(b["tokens"], b["valid_lens"]).argmax(-1)
        keep = b["targets"] != -100
        correct += int((pred[keep] == b["targets"][keep]).sum())
        scored += int(keep.sum())
    assert correct / scored >= 0.98


def test_progress_lines_and_outputs(mha_tool, tmp_path):
    stdout, out, rows = train(mha_tool, tmp_path, "p", "--steps", "40", "--eval-every", "20", "--layers", "2",
                              "--positions", "sinusoidal", "--optimizer", "sgd", "--lr", "0.1")
    # Not a terminal: one plain line per evaluation, no carriage returns.
    assert "\r" not in stdout
    lines = [l for l in stdout.splitlines() if l.startswith("step ")]
    assert len(lines) == 2, stdout
    assert re.match(r"step +20/40  loss \d+\.\d{4}  acc +[\d.]+%  held-out +[\d.]+%  +[\d.]+ steps/s", lines[0])
    assert [r["step"] for r in rows] == [str(i) for i in range(1, 41)]
    assert rows[19]["held_out_accuracy"] != "" and rows[18]["held_out_accuracy"] == ""
    meta = mha.safetensors_metadata(str(out))
    assert meta["model.num_layers"] == "2" and meta["model.positions"] == "sinusoidal"
    assert meta["optim.name"] == "sgd" and meta["train.step"] == "40"
    assert "optim.readout.weight.momentum_buffer" in mha.load_safetensors(str(out))
    # The plot of the curves: a real PNG with two panels' worth of width.
    image = mha.read_png(str(tmp_path / "p.png"))
    assert image.ndim == 3 and image.shape[1] > 2 * image.shape[0] / 2 and image.shape[0] >= 300
    assert f"wrote {tmp_path / 'p.png'}" in stdout


def test_same_seed_and_threads_give_the_same_curve_bit_for_bit(mha_tool, tmp_path):
    args = ["--steps", "30", "--eval-every", "10", "--threads", "2", "--dropout", "0.1"]
    _, out_a, a = train(mha_tool, tmp_path, "a", "--seed", "7", *args)
    _, out_b, b = train(mha_tool, tmp_path, "b", "--seed", "7", *args)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # 17 digits: the exact doubles
    assert [r["held_out_accuracy"] for r in a] == [r["held_out_accuracy"] for r in b]
    ta, tb = mha.load_safetensors(str(out_a)), mha.load_safetensors(str(out_b))
    assert all(np.array_equal(ta[n], tb[n]) for n in ta)
    _, _, c = train(mha_tool, tmp_path, "c", "--seed", "8", *args)
    assert [r["loss"] for r in c] != [r["loss"] for r in a]


def test_resume_continues_the_run_exactly(mha_tool, tmp_path):
    common = ["--seed", "2", "--threads", "1", "--eval-every", "1000", "--dropout", "0.1"]
    _, _, straight = train(mha_tool, tmp_path, "straight", "--steps", "30", *common)
    _, half, _ = train(mha_tool, tmp_path, "half", "--steps", "15", *common)
    stdout, _, rest = train(mha_tool, tmp_path, "rest", "--resume", str(half), "--steps", "30", "--threads", "1")
    assert "resumed from" in stdout and "at step 15" in stdout
    assert [r["step"] for r in rest] == [str(i) for i in range(16, 31)]
    assert [r["loss"] for r in rest] == [r["loss"] for r in straight[15:]]


def test_bad_options_are_refused(mha_tool, tmp_path):
    r = subprocess.run([mha_tool, "train", "--heads", "3", "--hiddens", "64", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "num_hiddens: 64 is not divisible by num_heads 3" in r.stderr
    r = subprocess.run([mha_tool, "train", "--near", "5", "--far", "3"], capture_output=True, text=True)
    assert r.returncode == 1 and "[OffsetPairTask] far: 3 is not greater than near 5" in r.stderr
    _, ck, _ = train(mha_tool, tmp_path, "short", "--steps", "2")
    r = subprocess.run([mha_tool, "train", "--resume", str(ck), "--lr", "0.1"], capture_output=True, text=True)
    assert r.returncode == 1 and "--lr: a resumed run takes its config from the checkpoint" in r.stderr
