"""`mha run` and `mha viz` with --causal and --window: the outputs and weights
equal plain torch ops on the same parameters with the band as a mask, and
the picture draws every cell outside the band in the mask colour."""
import json
import subprocess

import numpy as np
import pytest
import torch

import mha
from mha.plot import cell_center, colormap_inverse
from test_viz_cli import make_case

RES = 0.5 / 255


def run(tool, *args):
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120)


def band(Q, K, causal, window):
    """allowed[i, j]: FlashAttention's bottom-right window, torch's top-left causal."""
    i = torch.arange(Q)[:, None]
    j = torch.arange(K)[None, :]
    diag = i + K - Q
    ok = torch.ones(Q, K, dtype=torch.bool)
    if causal == "top-left":
        ok &= j <= i
    if causal == "bottom-right":
        ok &= j <= diag
    if window is not None:
        left, right = window
        if left >= 0:
            ok &= j >= diag - left
        if right >= 0:
            ok &= j <= diag + right
    return ok


def plain_attention(wpath, xpath, H, causal, window):
    """The chapter's module written out in torch ops, masked scores -inf, rows with no key zeros."""
    p = {k: torch.from_numpy(v) for k, v in mha.load_safetensors(str(wpath)).items()}
    x = {k: torch.from_numpy(v) for k, v in mha.load_safetensors(str(xpath)).items()}
    X, Y, V = x["queries"], x["keys"], x["values"]
    B, Q, _ = X.shape
    K = Y.shape[1]
    q, k, v = (t @ p[f"{n}.weight"].T for t, n in ((X, "W_q"), (Y, "W_k"), (V, "W_v")))
    D = q.shape[-1]
    d = D // H
    q, k, v = (t.reshape(B, -1, H, d).permute(0, 2, 1, 3) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / d ** 0.5
    ok = band(Q, K, causal, window).expand(B, H, Q, K).clone()
    if "valid_lens" in x:
        ok &= (torch.arange(K)[None, None, None, :] < x["valid_lens"][:, None, None, None])
    w = torch.softmax(s.masked_fill(~ok, -float("inf")), dim=-1)
    w = torch.nan_to_num(w, nan=0.0)
    out = (w @ v).permute(0, 2, 1, 3).reshape(B, Q, D) @ p["W_o.weight"].T
    return out.numpy(), w.numpy(), ok.numpy()


CASES = [
    ("bottom-right", None), ("top-left", None), (None, (2, 0)), (None, (1, 1)), (None, (0, 0)),
    ("bottom-right", (3, -1)), ("top-left", (-1, 2)), (None, (-1, 0)), (None, (50, 50)),
]


@pytest.mark.parametrize("causal, window", CASES)
@pytest.mark.parametrize("Q, K, lens", [(5, 5, None), (4, 7, [6, 3]), (7, 4, [4, 1])])
def test_run_with_causal_and_window_equals_plain_torch(tmp_path, mha_tool, causal, window, Q, K, lens):
    w, x, _ = make_case(tmp_path, B=2, H=2, Q=Q, K=K, valid_lens=lens, seed=Q * 10 + K)
    out = tmp_path / "out.safetensors"
    args = ["run", "--weights", w, "--inputs", x, "--heads", 2, "--out", out]
    if causal:
        args += ["--causal", causal]
    if window:
        args += ["--window", f"{window[0]},{window[1]}"]
    r = run(mha_tool, *args)
    assert r.returncode == 0, r.stderr
    got = mha.load_safetensors(str(out))
    want_out, want_w, _ = plain_attention(w, x, 2, causal, window)
    np.testing.assert_allclose(got["attention_weights"], want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["output"], want_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal, window", [(None, (2, 0)), ("top-left", (1, 1)), (None, (0, 3))])
def test_viz_draws_the_band_and_masks_the_rest(tmp_path, mha_tool, causal, window):
    w, x, _ = make_case(tmp_path, B=2, H=3, Q=9, K=11, valid_lens=[10, 6])
    png, lay = tmp_path / "band.png", tmp_path / "band.json"
    args = ["viz", "--weights", w, "--inputs", x, "--heads", 3, "--rows", "1,0", "--show-heads", "2,0",
            "--out", png, "--layout-json", lay, "--window", f"{window[0]},{window[1]}"]
    if causal:
        args += ["--causal", causal]
    r = run(mha_tool, *args)
    assert r.returncode == 0, r.stderr
    layout = json.loads(lay.read_text())
    assert (layout["q_block"], layout["k_block"]) == (1, 1)
    _, weights, ok = plain_attention(w, x, 3, causal, window)
    img = mha.read_png(str(png))
    lo, hi = layout["vmin"], layout["vmax"]
    for i, b in enumerate([1, 0]):
        for j, h in enumerate([2, 0]):
            for q in range(9):
                for k in range(11):
                    cx, cy = cell_center(layout, i, j, q, k)
                    px = tuple(int(c) for c in img[cy, cx, :3])
                    where = f"row {b} head {h} cell ({q}, {k})"
                    if not ok[b, h, q, k]:
                        assert px == mha.MASK_COLOR, where
                        continue
                    assert px != mha.MASK_COLOR, where
                    got = lo + colormap_inverse(px) * (hi - lo)
                    assert got == pytest.approx(weights[b, h, q, k], abs=RES * (hi - lo) + 1e-5), where


@pytest.mark.parametrize("args, message", [
    (["--window", "2"], "--window"),
    (["--window", "1,2,3"], "--window"),
    (["--window", "-2,0"], "--window: '-2' is not an integer in [-1, 2^31 - 1]"),
    (["--window", "a,0"], "--window"),
    (["--causal", "upper"], "--causal"),
])
def test_mask_options_refuse_bad_values(tmp_path, mha_tool, args, message):
    w, x, _ = make_case(tmp_path, B=1, H=2, Q=3, K=3)
    for cmd, out in (("run", tmp_path / "never.safetensors"), ("viz", tmp_path / "never.png")):
        r = run(mha_tool, cmd, "--weights", w, "--inputs", x, "--heads", 2, "--out", out, *args)
        assert r.returncode != 0, (cmd, args)
        assert message in r.stderr + r.stdout, r.stderr
        assert not out.exists()


def test_mask_options_refused_where_they_cannot_apply(tmp_path, mha_tool):
    w, x, _ = make_case(tmp_path, B=1, H=2, Q=3, K=3)
    r = run(mha_tool, "viz", "--checkpoint", w, "--out", tmp_path / "o.png", "--causal", "top-left")
    assert r.returncode != 0 and "--causal: not taken with --checkpoint" in r.stderr, r.stderr
