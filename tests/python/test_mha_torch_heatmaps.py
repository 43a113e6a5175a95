"""mha.show_heatmaps with d2l's arguments: figsize (inches at a dpi), cmap by
matplotlib's names, and the picture shown in a notebook through IPython."""
import sys
import types

import numpy as np
import pytest

import mha
from mha.plot import cell_center, colormap, render_heatmaps


def weights(rows=1, cols=2, Q=4, K=6, seed=0):
    w = np.random.default_rng(seed).random((rows, cols, Q, K)).astype(np.float32)
    return w / w.sum(-1, keepdims=True)


def test_reds_draws_the_lowest_and_highest_cells_in_matplotlibs_end_colours():
    w = weights()
    # The scale given as the data's own range: its ends are the map's ends.
    # (The automatic scale starts at 0 for weights, tested in test_show_heatmaps.py.)
    lo_hi = dict(vmin=float(w.min()), vmax=float(w.max()))
    img = mha.show_heatmaps(w, "Keys", "Queries", figsize=None, cmap="Reds", display=False, **lo_hi)
    own, layout = render_heatmaps(w, **lo_hi)
    assert img.shape == own.shape
    lo = np.unravel_index(np.argmin(w), w.shape)
    hi = np.unravel_index(np.argmax(w), w.shape)
    x, y = cell_center(layout, *lo)
    assert tuple(img[y, x, :3]) == (0xff, 0xf5, 0xf0)  # matplotlib's Reds at 0
    x, y = cell_center(layout, *hi)
    assert tuple(img[y, x, :3]) == (0x67, 0x00, 0x0d)  # ... and at 1
    # Every cell: the Reds entry at the index of mha's own colour there.
    own_table = mha.colormap_table()
    reds = colormap("Reds")
    for cell in [(0, c, q, k) for c in range(2) for q in range(4) for k in range(6)]:
        x, y = cell_center(layout, *cell)
        i = int(np.flatnonzero((own_table == own[y, x, :3]).all(axis=1))[0])
        assert tuple(img[y, x, :3]) == tuple(reds[i])
    # viridis is mha's own map; "_r" reverses.
    np.testing.assert_array_equal(mha.show_heatmaps(w, cmap="viridis", figsize=None, display=False, **lo_hi), own)
    np.testing.assert_array_equal(colormap("Blues_r"), colormap("Blues")[::-1])


def test_figsize_is_inches_of_the_panel_grid_at_dpi():
    w = weights(1, 2)
    img = mha.show_heatmaps(w, "Keys", "Queries", None, (5, 2.5), display=False)  # d2l's positions
    want, _ = render_heatmaps(w, panel_size=250)  # min(5 * 100 / 2, 2.5 * 100 / 1)
    assert img.shape == want.shape
    big = mha.show_heatmaps(w, figsize=(10, 5), display=False)
    small = mha.show_heatmaps(w, figsize=(10, 5), dpi=50, display=False)
    assert big.shape[1] > img.shape[1] and small.shape == img.shape
    with pytest.raises(ValueError, match="figsize"):
        mha.show_heatmaps(w, figsize=(0, 1))
    with pytest.raises(ValueError, match="cmap: 'Redz' is not one of"):
        mha.show_heatmaps(w, cmap="Redz")


def test_a_notebook_displays_the_picture_and_it_is_returned(monkeypatch):
    shown = []

    class ZMQInteractiveShell:  # what get_ipython() is in Jupyter
        pass

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: ZMQInteractiveShell()
    display = types.ModuleType("IPython.display")
    display.Image = lambda data, format: ("png", data)
    display.display = shown.append
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    img = mha.show_heatmaps(weights(), "Keys", "Queries")
    assert len(shown) == 1 and shown[0][0] == "png" and shown[0][1][:8] == b"\x89PNG\r\n\x1a\n"
    mha.show_heatmaps(weights(), display=False)
    assert len(shown) == 1
    assert img.ndim == 3 and img.shape[2] == 4
    # Outside a notebook (a plain IPython shell, or none), nothing is displayed.
    ipython.get_ipython = lambda: object()
    mha.show_heatmaps(weights())
    assert len(shown) == 1
