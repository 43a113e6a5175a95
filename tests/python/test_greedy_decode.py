"""Greedy decoding of a small trained model (bench/bench_greedy.py's) with
KV caches, against the d2l chapter's re-projecting decoder loop run on the
chapter's own PyTorch MultiHeadAttention with the same weights.

Each step's logits within 1e-5 x max |reference logits| and the same tokens,
for 40 generated tokens after an 8-token prompt; and the cached loop's
logits are the trained model's own (AttentionModel's forward over the whole
generated sequence with the chapter's causal valid lengths).
"""
import pathlib
import sys

import numpy as np
import pytest
import torch

import mha

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import bench_greedy as bg  # noqa: E402

STEPS = 40


@pytest.fixture(scope="module")
def trained():
    model, _, _ = bg.train_model(mha, bg.PROMPT + STEPS, steps=40, length=16)
    return model, bg.Weights(mha, model)


def prompt():
    return [int(x) for x in bg.sequences(np.random.default_rng(3), 1, bg.PROMPT)[0]]


def err(got, ref):
    return float(np.max(np.abs(got - ref)) / max(1.0, np.max(np.abs(ref))))


def test_cached_greedy_matches_the_chapters_pytorch_loop(trained):
    _, w = trained
    torch.set_num_threads(1)
    ref_tokens, ref_logits = bg.torch_decoder(w)(prompt(), STEPS)
    tokens, logits = bg.greedy_cached(w, prompt(), STEPS)
    assert logits.shape == (STEPS, bg.VOCAB)
    assert err(logits, ref_logits) <= 1e-5
    assert tokens == ref_tokens


def test_cached_greedy_matches_mhas_reprojecting_loop(trained):
    _, w = trained
    ref_tokens, ref_logits = bg.greedy_reprojecting(w, prompt(), STEPS)
    tokens, logits = bg.greedy_cached(w, prompt(), STEPS)
    assert err(logits, ref_logits) <= 1e-5
    assert tokens == ref_tokens


def test_cached_greedy_logits_are_the_trained_models(trained):
    model, w = trained
    tokens, logits = bg.greedy_cached(w, prompt(), STEPS)
    n = len(tokens) - 1
    causal = np.arange(1, n + 1, dtype=np.float32)[None, :]
    full = model(np.array(tokens[:-1])[None, :], causal)[0]  # (n, V): position t predicts token t + 1
    assert err(logits, full[bg.PROMPT - 1:]) <= 1e-5
    assert tokens[bg.PROMPT:] == [int(i) for i in np.argmax(full[bg.PROMPT - 1:], axis=1)]
