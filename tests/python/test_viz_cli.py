"""`mha viz` and the demo's heatmap, end to end: files in, PNG out, colours
read back (through cairo) and compared with the seed's PyTorch weights."""
import json
import subprocess

import numpy as np
import pytest
import torch

import mha
from mha.plot import cell_center, colormap_inverse
from seed_reference import make_seed_module, state_dict_numpy

RES = 0.5 / 255


def run(tool, *args, cwd=None):
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


def make_case(tmp_path, B, H, Q, K, valid_lens=None, D=None, seed=0):
    """Weights and inputs files, and the seed's (B, H, Q, K) weights for them."""
    D = D or 4 * H
    peer = make_seed_module(D, H, 6, 5, 3, bias=False, seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    X, Y, V = (torch.randn(B, n, d, generator=g) * 2 for n, d in ((Q, 6), (K, 5), (K, 3)))
    lens = None if valid_lens is None else torch.tensor(valid_lens, dtype=torch.float32)
    with torch.no_grad():
        peer(X, Y, V, lens)
    weights = peer.attention.attention_weights.reshape(B, H, Q, K).numpy()
    wpath, ipath = tmp_path / "w.safetensors", tmp_path / "x.safetensors"
    mha.save_safetensors(str(wpath), state_dict_numpy(peer))
    inputs = {"queries": X.numpy(), "keys": Y.numpy(), "values": V.numpy()}
    if lens is not None:
        inputs["valid_lens"] = lens.numpy()
    mha.save_safetensors(str(ipath), inputs)
    return wpath, ipath, weights


def length(valid_lens, b, q):
    if valid_lens is None:
        return np.inf
    v = np.asarray(valid_lens, dtype=np.float32)
    return v[b] if v.ndim == 1 else v[b, q]


def check_picture(png, layout, weights, valid_lens, rows, heads):
    """Every cell of panel (i, j) shows weights[rows[i], heads[j]] or the mask."""
    img = mha.read_png(str(png))
    assert img.shape == (layout["height"], layout["width"], 4)
    assert layout["batch_rows"] == rows and layout["heads"] == heads
    lo, hi = layout["vmin"], layout["vmax"]
    assert lo == 0.0
    Q, K = weights.shape[2:]
    qb, kb = layout["q_block"], layout["k_block"]
    for i, b in enumerate(rows):
        for j, h in enumerate(heads):
            for ci in range(layout["cells_q"]):
                for cj in range(layout["cells_k"]):
                    q0, k0 = ci * qb, cj * kb
                    x, y = cell_center(layout, i, j, q0, k0)
                    px = tuple(int(c) for c in img[y, x, :3])
                    qs, ks = range(q0, min(Q, q0 + qb)), range(k0, min(K, k0 + kb))
                    kept = [weights[b, h, q, k] for q in qs for k in ks if k < length(valid_lens, b, q)]
                    where = f"panel ({i}, {j}) = row {b} head {h}, cell ({ci}, {cj})"
                    if not kept:
                        assert px == mha.MASK_COLOR, where
                        continue
                    assert px != mha.MASK_COLOR, where
                    got = lo + colormap_inverse(px) * (hi - lo)
                    assert got == pytest.approx(np.mean(kept), abs=RES * (hi - lo) + 1e-5), where


@pytest.mark.parametrize("valid_lens", [None, [5, 3, 0], [[1, 2, 3, 4], [6, 6, 2, 1], [0, 3, 3, 3]]])
def test_viz_draws_the_chosen_rows_and_heads_as_the_seed_computes_them(tmp_path, mha_tool, valid_lens):
    w, x, weights = make_case(tmp_path, B=3, H=4, Q=4, K=6, valid_lens=valid_lens)
    out, lay = tmp_path / "heads.png", tmp_path / "heads.json"
    r = run(mha_tool, "viz", "--weights", w, "--inputs", x, "--heads", 4, "--rows", "2,0",
            "--show-heads", "3,1", "--out", out, "--layout-json", lay)
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout
    layout = json.loads(lay.read_text())
    assert (layout["rows"], layout["cols"]) == (2, 2)
    check_picture(out, layout, weights, valid_lens, rows=[2, 0], heads=[3, 1])


def test_viz_defaults_to_row_0_and_every_head(tmp_path, mha_tool):
    w, x, weights = make_case(tmp_path, B=2, H=5, Q=3, K=7, valid_lens=[4, 7])
    out, lay = tmp_path / "a.png", tmp_path / "a.json"
    r = run(mha_tool, "viz", "--weights", w, "--inputs", x, "--heads", 5, "--out", out, "--layout-json", lay)
    assert r.returncode == 0, r.stderr
    check_picture(out, json.loads(lay.read_text()), weights, [4, 7], rows=[0], heads=[0, 1, 2, 3, 4])


def test_viz_averages_long_sequences(tmp_path, mha_tool):
    w, x, weights = make_case(tmp_path, B=1, H=2, Q=130, K=250, valid_lens=[200])
    out, lay = tmp_path / "big.png", tmp_path / "big.json"
    r = run(mha_tool, "viz", "--weights", w, "--inputs", x, "--heads", 2, "--out", out,
            "--layout-json", lay, "--max-cells", 40)
    assert r.returncode == 0, r.stderr
    layout = json.loads(lay.read_text())
    assert (layout["q_block"], layout["k_block"]) == (4, 7)
    assert "averaged over 4 x 7" in r.stdout
    check_picture(out, layout, weights, [200], rows=[0], heads=[0, 1])


def test_run_still_matches_the_seed_after_sharing_its_loader(tmp_path, mha_tool):
    w, x, weights = make_case(tmp_path, B=2, H=2, Q=3, K=4, valid_lens=[2, 4])
    out = tmp_path / "out.safetensors"
    r = run(mha_tool, "run", "--weights", w, "--inputs", x, "--heads", 2, "--out", out)
    assert r.returncode == 0, r.stderr
    got = mha.load_safetensors(str(out))["attention_weights"]
    np.testing.assert_allclose(got, weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--rows", "5"], "--rows: row 5 is outside the inputs' batch of 3 rows"),
    (["--rows", "-1"], "--rows: '-1' is not an integer in [0, 2^31 - 1]"),
    (["--rows", "0,x"], "rows"),
    (["--show-heads", "4"], "--show-heads: head 4 is outside the module's 4 heads"),
    (["--heads", "0"], "--heads: '0' is not an integer in [1, 2^31 - 1]"),
    (["--heads", "3"], "num_heads"),
    (["--max-cells", "0"], "--max-cells: '0' is not an integer in [1, 2^31 - 1]"),
    (["--rows", "0,1,2,0,1,2,0,1,2,0,1,2,0,1,2,0,1"], "panels; at most 64"),
    (["--bogus"], "bogus"),
])
def test_viz_errors_say_what_is_wrong_and_write_nothing(tmp_path, mha_tool, args, message):
    w, x, _ = make_case(tmp_path, B=3, H=4, Q=2, K=3)
    out = tmp_path / "never.png"
    base = {"--weights": w, "--inputs": x, "--heads": 4, "--out": out}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    argv = [a for kv in base.items() for a in kv] + ([args[0]] if len(args) == 1 else [])
    r = run(mha_tool, "viz", *argv)
    assert r.returncode != 0
    assert message in r.stderr + r.stdout, r.stderr
    assert not out.exists()
    assert list(tmp_path.glob("never.png*")) == []


def test_viz_missing_files_and_flags(tmp_path, mha_tool):
    w, x, _ = make_case(tmp_path, B=1, H=2, Q=2, K=2)
    out = tmp_path / "never.png"
    r = run(mha_tool, "viz", "--weights", w, "--inputs", x, "--heads", 2)  # no --out
    assert r.returncode != 0 and "--out" in r.stderr
    r = run(mha_tool, "viz", "--weights", tmp_path / "nope", "--inputs", x, "--heads", 2, "--out", out)
    assert r.returncode != 0 and "nope" in r.stderr
    mha.save_safetensors(str(tmp_path / "odd.safetensors"),
                         {**mha.load_safetensors(str(x)), "extra": np.zeros(1, np.float32)})
    r = run(mha_tool, "viz", "--weights", w, "--inputs", tmp_path / "odd.safetensors", "--heads", 2,
            "--out", out)
    assert r.returncode != 0 and "unexpected tensor 'extra'" in r.stderr
    r = run(mha_tool, "viz", "--weights", w, "--inputs", x, "--heads", 2, "--out",
            tmp_path / "no" / "dir" / "a.png")
    assert r.returncode != 0 and "a.png" in r.stderr
    assert not out.exists()


def test_demo_writes_the_seed_heatmap_where_asked(tmp_path, mha_tool):
    r = run(mha_tool, "demo", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    default = tmp_path / "mha-demo-heatmap.png"
    assert default.exists() and str(default.name) in r.stdout
    assert "query 0" in r.stdout  # the table is still there
    img = mha.read_png(str(default))
    # The seed's valid_lens [3, 2] mask 3 + 4 of 6 keys in every head's 4 queries:
    # the mask colour covers a large part of the picture.
    is_mask = (img[..., :3] == np.array(mha.MASK_COLOR, np.uint8)).all(axis=2)
    assert is_mask.sum() > 1000
    other = tmp_path / "sub.png"
    r = run(mha_tool, "demo", "--heatmap", other, cwd=tmp_path)
    assert r.returncode == 0 and other.exists() and str(other) in r.stdout
    (tmp_path / "quiet").mkdir()
    r = run(mha_tool, "demo", "--no-heatmap", cwd=tmp_path / "quiet")
    assert r.returncode == 0 and list((tmp_path / "quiet").iterdir()) == []
