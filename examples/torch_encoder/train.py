#!/usr/bin/python3
"""Train the d2l Transformer encoder block twice, with torch's attention (the
d2l chapter's MultiHeadAttention in PyTorch) and with mha.torch's, on mha's
offset-pair task: same seed, same initial weights, same batches.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_encoder/train.py --out-dir .

Writes torch_encoder_curves.csv (step, both losses, both step times) and
torch_encoder_curves.png (loss curves and step times side by side), and prints
the largest loss gap, the final held-out accuracies and the time per training
step (forward + backward + Adam) of each, with their ratio. The steps of the
two models alternate so that both see the same machine load.
"""
import os

# Before torch and mha start their OpenMP threads: idle threads sleep instead
# of spinning. With busy-waiting, each library's spinning threads take the
# cores from the other's (measured with 2 threads on 2 loaded cores: 473 ms
# per torch step, 36 ms with passive waiting).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import csv  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import mha  # noqa: E402
import mha.torch  # noqa: E402
from d2l_encoder import Classifier, MultiHeadAttention  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hiddens", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout in every block (the two models then draw different masks)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="threads for torch and mha alike (default 1: both pools busy at once on a "
                        "small machine slow each other down)")
    p.add_argument("--held-out", type=int, default=512, help="held-out sequences for the accuracy")
    p.add_argument("--out-dir", default=".")
    return p.parse_args(argv)


def to_torch(batch):
    return (torch.from_numpy(batch["tokens"].astype(np.int64)),
            torch.from_numpy(batch["targets"].astype(np.int64)),
            torch.from_numpy(batch["valid_lens"].astype(np.int64)))


def accuracy(model, held_out):
    model.eval()
    right = total = 0
    with torch.no_grad():
        for b in held_out:
            tokens, targets, lens = to_torch(b)
            pred = model(tokens, lens).argmax(-1)
            scored = targets != -100
            right += int((pred[scored] == targets[scored]).sum())
            total += int(scored.sum())
    model.train()
    return right / max(total, 1)


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    mha.set_num_threads(a.threads)
    task = mha.OffsetPairTask(vocab=8, near=1, far=10, min_len=12, max_len=a.max_len)
    C = task.num_classes

    def build(attention):
        torch.manual_seed(a.seed)
        m = Classifier(task.input_vocab, C, a.max_len, a.hiddens, a.ffn, a.heads, a.blocks,
                       a.dropout, attention)
        b = task.sample(2, a.seed)
        tokens, _, lens = to_torch(b)
        with torch.no_grad():
            m(tokens, lens)  # materialise the lazy layers
        return m

    models = {"torch": build(MultiHeadAttention), "mha": build(mha.torch.MultiHeadAttention)}
    models["mha"].load_state_dict(models["torch"].state_dict())  # identical starting weights
    opts = {k: torch.optim.Adam(m.parameters(), lr=a.lr) for k, m in models.items()}
    held_out = mha.held_out_set(task, a.held_out, a.seed + 1_000_003)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    rows = []
    for step in range(1, a.steps + 1):
        tokens, targets, lens = to_torch(task.sample(a.batch, a.seed * 1_000_000 + step))
        row = {"step": step}
        for name, m in models.items():
            t0 = time.perf_counter()
            opts[name].zero_grad()
            logits = m(tokens, lens)
            loss = loss_fn(logits.reshape(-1, C), targets.reshape(-1))
            loss.backward()
            opts[name].step()
            row[f"ms_{name}"] = (time.perf_counter() - t0) * 1e3
            row[f"loss_{name}"] = float(loss)
        rows.append(row)
        if step % 50 == 0 or step == a.steps:
            print(f"step {step:5d}/{a.steps}  loss torch {row['loss_torch']:.4f}  mha {row['loss_mha']:.4f}",
                  flush=True)
    acc = {k: accuracy(m, held_out) for k, m in models.items()}
    gap = max(abs(r["loss_torch"] - r["loss_mha"]) for r in rows)
    gap_step = max(rows, key=lambda r: abs(r["loss_torch"] - r["loss_mha"]))["step"]
    skip = min(10, len(rows) // 2)  # warm-up steps
    ms = {k: statistics.median(r[f"ms_{k}"] for r in rows[skip:]) for k in models}
    os.makedirs(a.out_dir, exist_ok=True)
    csv_path = os.path.join(a.out_dir, "torch_encoder_curves.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss_torch", "loss_mha", "ms_torch", "ms_mha"])
        for r in rows:
            w.writerow([r["step"], repr(r["loss_torch"]), repr(r["loss_mha"]),
                        f"{r['ms_torch']:.3f}", f"{r['ms_mha']:.3f}"])
        w.writerow(["held_out_accuracy", acc["torch"], acc["mha"], "", ""])
    steps = [float(r["step"]) for r in rows]
    panels = [
        {"title": "Training loss", "xlabel": "step", "ylabel": "cross-entropy", "log_y": True,
         "series": [("torch attention", steps, [r["loss_torch"] for r in rows]),
                    ("mha.torch", steps, [r["loss_mha"] for r in rows])]},
        {"title": "Time per training step", "xlabel": "step", "ylabel": "ms",
         "series": [("torch attention", steps, [r["ms_torch"] for r in rows]),
                    ("mha.torch", steps, [r["ms_mha"] for r in rows])]},
    ]
    title = (f"d2l Transformer encoder block on the offset-pair task: held-out accuracy "
             f"torch {100 * acc['torch']:.1f}%, mha.torch {100 * acc['mha']:.1f}%")
    png_path = os.path.join(a.out_dir, "torch_encoder_curves.png")
    mha.write_png(png_path, mha._core._render_line_chart(panels, title))
    print(f"largest loss gap |torch - mha|: {gap:.3g} (step {gap_step})")
    print(f"held-out accuracy: torch {100 * acc['torch']:.2f}%, mha.torch {100 * acc['mha']:.2f}%")
    print(f"time per training step (median, {a.threads} thread(s)): torch {ms['torch']:.2f} ms, "
          f"mha.torch {ms['mha']:.2f} ms, ratio torch/mha {ms['torch'] / ms['mha']:.2f}")
    print(f"wrote {csv_path}\nwrote {png_path}")
    return {"gap": gap, "acc": acc, "ms": ms}


if __name__ == "__main__":
    main()
