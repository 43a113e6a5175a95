"""Looking inside a trained model: mha.head_offsets against a numpy
definition, and `mha viz --checkpoint` end to end on models trained here by
`mha train`: its heads find both offsets of their task, and the picture's
cells give back the weights that the PyTorch twin of the model (the seed's
MultiHeadAttention, tests/python/test_model.py) computes on the same sampled
sequences, with padding in the mask colour."""
import json
import re
import subprocess

import numpy as np
import pytest
import torch

import mha
from test_model import TorchTwin
from test_viz_cli import check_picture

# The check: a head "attends to" an offset when, over the task's
# scored queries, it puts most of its weight there on average.
SUBSTANTIAL = 0.5


def run(tool, *args):
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=300)


def numpy_head_offsets(w, lens, first_query=0):
    """The definition of mha/inspect.h, written out: (offsets, mean, pairs)."""
    B, H, Q, K = w.shape
    t = np.arange(Q)[None, :, None]
    k = np.arange(K)[None, None, :]
    if lens is None:
        L = np.full((B, Q, 1), np.inf, np.float32)
    else:
        lens = np.asarray(lens, np.float32)
        L = (lens[:, None] if lens.ndim == 1 else lens)[:, :, None] * np.ones((1, Q, 1), np.float32)
    real = (t >= first_query) & (t < L) & (k < L)  # (B, Q, K)
    offsets = np.arange(-(K - 1), Q)
    mean = np.full((H, len(offsets)), np.nan)
    pairs = np.zeros(len(offsets), np.int64)
    for i, d in enumerate(offsets):
        sel = real & ((t - k) == d)
        pairs[i] = sel.sum()
        if pairs[i]:
            mean[:, i] = (w.astype(np.float64) * sel[:, None]).sum(axis=(0, 2, 3)) / pairs[i]
    return offsets, mean, pairs


def softmax_weights(rng, shape):
    x = rng.standard_normal(shape) * 3
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("kind", ["none", "batch", "query"])
@pytest.mark.parametrize("seed", range(4))
def test_head_offsets_matches_its_definition(kind, seed):
    rng = np.random.default_rng(seed)
    B, H = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    Q, K = int(rng.choice([1, 3, 8, 13])), int(rng.choice([1, 4, 8, 13]))
    w = softmax_weights(rng, (B, H, Q, K))
    lens = None
    if kind != "none":
        shape = (B,) if kind == "batch" else (B, Q)
        lens = rng.integers(1, max(Q, K) + 3, size=shape).astype(np.float32) * 0.5 + 0.5
        lens.flat[0] = max(Q, K)  # at least one real query
    first = int(rng.integers(0, Q))
    offsets, mean, pairs = numpy_head_offsets(w, lens, first)
    if pairs.sum() == 0:
        with pytest.raises(ValueError, match="is padding"):
            mha.head_offsets(w, lens, first_query=first)
        return
    got = mha.head_offsets(w, lens, first_query=first)
    assert (got.min_offset, got.max_offset) == (-(K - 1), Q - 1)
    np.testing.assert_array_equal(got.offsets, offsets)
    np.testing.assert_array_equal(got.pairs, pairs)
    np.testing.assert_array_equal(np.isnan(got.mean), np.isnan(mean))
    np.testing.assert_allclose(got.mean, mean, rtol=1e-6, atol=1e-7, equal_nan=True)
    # The argmax, and the weight there; no near-tie in random softmax weights.
    np.testing.assert_array_equal(got.offset, offsets[np.nanargmax(mean, axis=1)])
    np.testing.assert_allclose(got.weight, np.nanmax(mean, axis=1), rtol=1e-6)


def test_head_offsets_errors_name_the_argument():
    w = np.full((2, 1, 3, 3), 1 / 3, np.float32)
    with pytest.raises(ValueError, match=r"\[head_offsets\] weights: shape \(2, 3\), wanted \(B, H, Q, K\)"):
        mha.head_offsets(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"\[head_offsets\] valid_lens"):
        mha.head_offsets(w, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"first_query: 3 is outside the 3 queries"):
        mha.head_offsets(w, first_query=3)
    with pytest.raises(ValueError, match="is padding"):
        mha.head_offsets(w, np.array([0, 0]))
    bad = w.copy()
    bad[1, 0, 2, 1] = np.nan
    with pytest.raises(ValueError, match=r"element \(1, 0, 2, 1\) is nan"):
        mha.head_offsets(bad)


# ---- Trained models ---------------------------------------------------------

# The default task (offsets 1 and 10) and another one, so that nothing
# depends on the named example.
TASKS = {
    "default": [],
    "near2-far6": ["--vocab", "6", "--near", "2", "--far", "6", "--min-len", "8", "--max-len", "20"],
}


@pytest.fixture(scope="module", params=list(TASKS))
def trained(request, mha_tool, tmp_path_factory):
    """A checkpoint trained to 99% held-out accuracy (a few seconds)."""
    d = tmp_path_factory.mktemp(request.param)
    ck = d / "model.safetensors"
    r = run(mha_tool, "train", *TASKS[request.param], "--steps", "800", "--stop-at-target", "--threads", "2",
            "--eval-every", "25", "--out", ck, "--curves", "", "--plot", "")
    assert r.returncode == 0, r.stderr
    assert "held-out accuracy reached 99.0%" in r.stdout, r.stdout
    return ck


def twin_weights(ck, tokens, lens, layer=0):
    """Layer `layer`'s (B, H, T, T) weights of the checkpoint's model, computed by its PyTorch twin."""
    model, _, meta = mha.load_checkpoint(str(ck))
    cfg = {n: int(meta[f"model.{n}"]) for n in ("num_hiddens", "num_heads", "num_layers", "num_classes")}
    cfg.update(bias=meta["model.bias"] == "true", dropout=0.0)
    twin = TorchTwin(model, cfg, torch.float32).eval()
    with torch.no_grad():
        twin(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(lens))
    w = twin.layers[layer].attention.attention_weights.numpy()
    B, T = tokens.shape
    # Our own model on the same sequences agrees to float32 parity.
    model(tokens, lens)
    np.testing.assert_allclose(model.layer(layer).attention_weights, w.reshape(B, -1, T, T), rtol=1e-5, atol=1e-6)
    return w.reshape(B, -1, T, T)


def padded_view(w, lens, rows):
    """The weights as drawn: the first S = longest chosen length positions, and
    per-query lengths that mask both padded keys and padded queries."""
    S = int(max(lens[r] for r in rows))
    t = np.arange(S)[None, :]
    per_query = np.where(t < lens[:, None], lens[:, None], 0).astype(np.float32)
    return w[:, :, :S, :S], per_query


def test_trained_heads_find_both_offsets_and_the_picture_shows_them(trained, mha_tool, tmp_path):
    _, task, _ = mha.load_checkpoint(str(trained))
    near, far = task.config["near"], task.config["far"]
    seed, batch, rows = 5, 24, [3, 0]
    out, lay = tmp_path / "heads.png", tmp_path / "heads.json"
    r = run(mha_tool, "viz", "--checkpoint", trained, "--sample-seed", seed, "--sample-batch", batch,
            "--rows", ",".join(map(str, rows)), "--out", out, "--layout-json", lay)
    assert r.returncode == 0, r.stderr
    layout = json.loads(lay.read_text())

    b = task.sample(batch, seed)  # the tool's sample: Generator(seed), as in training
    lens = b["valid_lens"]
    w = twin_weights(trained, b["tokens"], lens)
    H = w.shape[1]

    # Dominant offsets over the scored queries (t >= far) of the whole sample.
    offsets, mean, _ = numpy_head_offsets(w, lens, first_query=far)
    want = offsets[np.nanargmax(mean, axis=1)]
    assert layout["offsets"] == want.tolist()
    np.testing.assert_allclose(layout["offset_weights"], np.nanmax(mean, axis=1), rtol=1e-5)
    for d in (near, far):
        heads = [h for h in range(H) if want[h] == d and layout["offset_weights"][h] > SUBSTANTIAL]
        assert heads, f"no head attends at offset {d}: {layout['offsets']} {layout['offset_weights']}"
    assert layout["head_titles"] == [f"head {h} (offset {want[h]}, mean {layout['offset_weights'][h]:.2f})"
                                     for h in range(H)]
    for h in range(H):
        assert re.search(rf"head {h}: dominant offset {want[h]} \(mean weight [\d.]+\)", r.stdout), r.stdout

    # The picture: every cell of every panel maps back to the twin's weight,
    # padded keys and queries to the mask colour.
    drawn, per_query = padded_view(w, lens, rows)
    assert (layout["queries"], layout["keys"]) == drawn.shape[2:]
    assert layout["lengths"] == [int(lens[r]) for r in rows]
    check_picture(out, layout, drawn, per_query, rows=rows, heads=list(range(H)))


def test_viz_checkpoint_defaults_to_the_longest_sequence(trained, mha_tool, tmp_path):
    _, task, _ = mha.load_checkpoint(str(trained))
    out, lay = tmp_path / "a.png", tmp_path / "a.json"
    r = run(mha_tool, "viz", "--checkpoint", trained, "--show-heads", "2,1", "--out", out, "--layout-json", lay)
    assert r.returncode == 0, r.stderr
    layout = json.loads(lay.read_text())
    b = task.sample(32, 0)  # the defaults: --sample-batch 32, --sample-seed 0
    longest = int(np.argmax(b["valid_lens"]))
    assert layout["batch_rows"] == [longest] and layout["heads"] == [2, 1]
    w = twin_weights(trained, b["tokens"], b["valid_lens"])
    drawn, per_query = padded_view(w, b["valid_lens"], [longest])
    check_picture(out, layout, drawn, per_query, rows=[longest], heads=[2, 1])
    # One sequence drawn to its own length: nothing is padding, no mask legend.
    assert layout["queries"] == int(b["valid_lens"][longest])
    assert layout["mask_swatch"][2] == 0


def test_viz_checkpoint_draws_the_chosen_layer(mha_tool, tmp_path):
    ck = tmp_path / "deep.safetensors"
    r = run(mha_tool, "train", "--layers", "2", "--heads", "2", "--hiddens", "8", "--steps", "3", "--positions",
            "sinusoidal", "--bias", "--out", ck, "--curves", "", "--plot", "")
    assert r.returncode == 0, r.stderr
    out, lay = tmp_path / "l1.png", tmp_path / "l1.json"
    r = run(mha_tool, "viz", "--checkpoint", ck, "--layer", 1, "--rows", "1,2", "--sample-batch", 4,
            "--sample-seed", 9, "--out", out, "--layout-json", lay)
    assert r.returncode == 0, r.stderr
    layout = json.loads(lay.read_text())
    assert layout["layer"] == 1
    _, task, _ = mha.load_checkpoint(str(ck))
    b = task.sample(4, 9)
    w = twin_weights(ck, b["tokens"], b["valid_lens"], layer=1)
    offsets, mean, _ = numpy_head_offsets(w, b["valid_lens"], first_query=task.config["far"])
    assert layout["offsets"] == offsets[np.nanargmax(mean, axis=1)].tolist()
    drawn, per_query = padded_view(w, b["valid_lens"], [1, 2])
    check_picture(out, layout, drawn, per_query, rows=[1, 2], heads=[0, 1])


def test_viz_checkpoint_errors_say_what_is_wrong_and_write_nothing(mha_tool, tmp_path):
    ck = tmp_path / "m.safetensors"
    r = run(mha_tool, "train", "--steps", "1", "--out", ck, "--curves", "", "--plot", "")
    assert r.returncode == 0, r.stderr
    weights = tmp_path / "w.safetensors"
    mha.save_safetensors(str(weights), {"W_q.weight": np.zeros((4, 4), np.float32)})
    out = tmp_path / "never.png"
    cases = [
        (["--checkpoint", ck, "--heads", "4"], "--heads: give either --checkpoint or --weights"),
        (["--checkpoint", ck, "--layer", "1"], "--layer: layer 1 is outside the model's 1 layer(s) (0 .. 0)"),
        (["--checkpoint", ck, "--layer", "-1"], "--layer: '-1' is not an integer in [0, 2^31 - 1]"),
        (["--checkpoint", ck, "--rows", "8", "--sample-batch", "8"],
         "--rows: row 8 is outside the sampled batch of 8 sequences (0 .. 7)"),
        (["--checkpoint", ck, "--show-heads", "4"], "--show-heads: head 4 is outside the module's 4 heads"),
        (["--checkpoint", ck, "--sample-batch", "0"], "--sample-batch: '0' is not an integer in [1, 4096]"),
        (["--checkpoint", ck, "--sample-batch", "5000"], "--sample-batch: '5000' is not an integer in [1, 4096]"),
        (["--checkpoint", weights], "w.safetensors"),
        (["--checkpoint", tmp_path / "nope"], "nope"),
        ([], "--weights: required unless --checkpoint is given"),
    ]
    for args, message in cases:
        r = run(mha_tool, "viz", *args, "--out", out)
        assert r.returncode != 0, args
        assert message in r.stderr + r.stdout, (args, r.stderr)
        assert not out.exists()
