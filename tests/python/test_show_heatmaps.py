"""mha.show_heatmaps: d2l's argument order and shapes, colours that read back as
the weights PyTorch computes, masks, and errors."""
import numpy as np
import pytest
import torch

import mha
from mha.plot import cell_center, colormap_inverse, render_heatmaps
from seed_reference import make_seed_module

RES = 0.5 / 255  # the colour map's resolution as a fraction of the scale


def seed_weights(B, H, Q, K, valid_lens=None, seed=0):
    """(B, H, Q, K) attention weights of the seed's PyTorch module on random inputs."""
    m = make_seed_module(8 * H, H, 7, 9, 5, bias=False, seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    X, Y, V = (torch.randn(B, n, d, generator=g) * 2 for n, d in ((Q, 7), (K, 9), (K, 5)))
    with torch.no_grad():
        m(X, Y, V, None if valid_lens is None else torch.tensor(valid_lens, dtype=torch.float32))
    return m.attention.attention_weights.reshape(B, H, Q, K)


def values_drawn(image, layout, q_k_pairs):
    """The value each listed (row, col, q, k) cell's colour stands for."""
    lo, hi = layout["vmin"], layout["vmax"]
    out = []
    for r, c, q, k in q_k_pairs:
        x, y = cell_center(layout, r, c, q, k)
        out.append(lo + colormap_inverse(image[y, x]) * (hi - lo))
    return np.array(out)


def all_cells(R, C, Q, K):
    return [(r, c, q, k) for r in range(R) for c in range(C) for q in range(Q) for k in range(K)]


def test_d2l_call_returns_the_image_and_writes_the_same_png(tmp_path):
    w = seed_weights(2, 5, 4, 6)  # the seed's shapes
    path = tmp_path / "heads.png"
    img = mha.show_heatmaps(w, xlabel="Keys", ylabel="Queries",
                            titles=[f"Head {i}" for i in range(1, 6)], path=path)
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 4
    assert (img[..., 3] == 255).all()
    back = mha.read_png(str(path))
    np.testing.assert_array_equal(back, img)
    # Positional arguments in d2l's order give the same picture.
    img2 = mha.show_heatmaps(w.numpy(), "Keys", "Queries", [f"Head {i}" for i in range(1, 6)])
    np.testing.assert_array_equal(img2, img)


def test_each_cell_reads_back_as_the_torch_weight():
    w = seed_weights(2, 3, 5, 8, seed=3)
    img, layout = render_heatmaps(w)
    cells = all_cells(2, 3, 5, 8)
    got = values_drawn(img, layout, cells)
    want = np.array([float(w[c]) for c in cells])
    span = layout["vmax"] - layout["vmin"]
    assert layout["vmin"] == 0  # the automatic scale starts at 0 for weights
    assert layout["vmax"] == pytest.approx(float(w.max()), abs=1e-7)
    np.testing.assert_allclose(got, want, rtol=0, atol=RES * span + 1e-6)


def test_mask_argument_and_nan_both_draw_the_mask_colour():
    B, H, Q, K = 2, 2, 3, 6
    lens = [4, 2]
    w = seed_weights(B, H, Q, K, valid_lens=lens, seed=5).numpy()
    keys = np.arange(K)
    mask = keys[None, None, None, :] >= np.array(lens, dtype=float)[:, None, None, None]
    img_mask, layout = render_heatmaps(w, mask=mask)
    w_nan = w.copy()
    w_nan[np.broadcast_to(mask, w.shape)] = np.nan
    img_nan, _ = render_heatmaps(w_nan)
    np.testing.assert_array_equal(img_mask, img_nan)
    for r, c, q, k in all_cells(B, H, Q, K):
        x, y = cell_center(layout, r, c, q, k)
        is_mask = tuple(int(v) for v in img_mask[y, x, :3]) == mha.MASK_COLOR
        assert is_mask == (k >= lens[r]), (r, c, q, k)


def test_titles_per_column_as_d2l_or_per_panel():
    w = np.random.default_rng(0).random((2, 3, 4, 4), dtype=np.float32)
    per_column = mha.show_heatmaps(w, titles=["a", "b", "c"])
    per_panel = mha.show_heatmaps(w, titles=["a", "b", "c"] * 2)
    np.testing.assert_array_equal(per_column, per_panel)
    with pytest.raises(ValueError, match="titles: 4 given"):
        mha.show_heatmaps(w, titles=["a", "b", "c", "d"])


def test_panels_in_order_each_head_its_own_value():
    R, C, Q, K = 2, 4, 3, 3
    w = np.zeros((R, C, Q, K), np.float32)
    for i in range(R * C):
        w[i // C, i % C] = i / (R * C - 1)
    img, layout = render_heatmaps(w)
    for r in range(R):
        for c in range(C):
            got = values_drawn(img, layout, [(r, c, q, k) for q in range(Q) for k in range(K)])
            np.testing.assert_allclose(got, (r * C + c) / (R * C - 1), atol=RES + 1e-9)


def test_large_matrices_are_block_averaged():
    w = seed_weights(1, 2, 200, 300, seed=7).numpy()
    img, layout = render_heatmaps(w, max_cells=50)
    qb, kb = layout["q_block"], layout["k_block"]
    assert (qb, kb) == (4, 6)
    span = layout["vmax"] - layout["vmin"]
    for c in range(2):
        for i in range(0, 50, 7):
            for j in range(0, 50, 3):
                want = w[0, c, i * qb:(i + 1) * qb, j * kb:(j + 1) * kb].mean()
                got = values_drawn(img, layout, [(0, c, i * qb, j * kb)])[0]
                assert got == pytest.approx(want, abs=RES * span + 1e-6)


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 3, 4)), r"\(rows, cols, Q, K\)"),
    (np.zeros((1, 1, 0, 4)), "empty axis"),
    (np.full((1, 1, 2, 2), np.inf), "infinite"),
])
def test_bad_matrices_raise_value_error(bad, message):
    with pytest.raises(ValueError, match=message):
        mha.show_heatmaps(bad)


def test_bad_mask_and_scale_raise_value_error():
    w = np.ones((1, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match="wanted bool"):
        mha.show_heatmaps(w, mask=np.ones((3,)))
    with pytest.raises(ValueError, match="does not broadcast"):
        mha.show_heatmaps(w, mask=np.ones((4,), bool))
    with pytest.raises(ValueError, match="vmin 1 > vmax 0"):
        mha.show_heatmaps(w, vmin=1, vmax=0)


def test_write_png_accepts_rgb_and_rejects_other_shapes(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    mha.write_png(str(tmp_path / "a.png"), rgb)
    back = mha.read_png(str(tmp_path / "a.png"))
    np.testing.assert_array_equal(back[..., :3], rgb)
    assert (back[..., 3] == 255).all()
    with pytest.raises(ValueError, match=r"wanted \(H, W, 4\)"):
        mha.write_png(str(tmp_path / "b.png"), np.zeros((5, 7), np.uint8))
    assert not (tmp_path / "b.png").exists()


def test_a_panel_size_asked_for_is_honoured_or_refused():
    """panel_size is the longer side of a panel in pixels: honoured for small matrices too (cells grow
    past the automatic 48 pixels; it was silently capped), refused beyond the largest picture."""
    w = np.random.default_rng(0).random((1, 1, 3, 3)).astype(np.float32)
    auto = mha.show_heatmaps(w)
    big = mha.show_heatmaps(w, panel_size=600)
    small = mha.show_heatmaps(w, panel_size=300)
    assert big.shape[0] > small.shape[0] > auto.shape[0] and big.shape[1] > small.shape[1]
    assert big.shape[0] - small.shape[0] >= 290  # the panel grew by the 300 pixels asked
    with pytest.raises(ValueError, match=r"panel_size: 1000000, wanted at most 20000 pixels"):
        mha.show_heatmaps(w, panel_size=10**6)
