"""examples/torch_encoder/train.py, a few steps: the d2l encoder block with torch's
attention and with mha.torch's tracks step for step (same seed, same data)."""
import csv
import importlib.util
import pathlib

import mha

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_two_models_train_alike(tmp_path):
    spec = importlib.util.spec_from_file_location("torch_encoder_train",
                                                  ROOT / "examples" / "torch_encoder" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    r = train.main(["--steps", "8", "--held-out", "64", "--out-dir", str(tmp_path)])
    assert r["gap"] < 1e-4  # float32 rounding only: same weights, same batches, no dropout
    rows = list(csv.reader(open(tmp_path / "torch_encoder_curves.csv")))
    assert rows[0] == ["step", "loss_torch", "loss_mha", "ms_torch", "ms_mha"]
    assert len(rows) == 1 + 8 + 1 and rows[-1][0] == "held_out_accuracy"
    img = mha.read_png(str(tmp_path / "torch_encoder_curves.png"))
    assert img.shape[0] > 100 and img.shape[1] > 400
