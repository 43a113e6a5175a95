"""Pictures of attention weights: d2l's show_heatmaps, drawn by mha's cairo code.

    import mha
    attention = mha.MultiHeadAttention(100, 5).eval()
    attention(X, Y, Y, valid_lens)
    w = attention.attention_weights                     # (B, 5, Q, K)
    img = mha.show_heatmaps(w, xlabel="Keys", ylabel="Queries",
                            titles=[f"head {h}" for h in range(5)], path="heads.png")
    img.shape                                           # (H, W, 4) uint8 RGBA

Colours follow one colour map (show_heatmaps' cmap: d2l's "Reds" by default,
or "viridis", mha's own, mha.colormap_table(): dark purple = low, yellow =
high) over one scale shared by all panels and shown by the colour bar;
masked cells (NaN weights, or True in `mask`) are mha.MASK_COLOR grey.
"""
import numpy as np

from . import _checks, _core


def _as_float_array(x):
    """A float32 copy of numbers (never of strings: float("2.5") is not taken)."""
    return np.array(_checks.real_array(x, "show_heatmaps", "matrices"), dtype=np.float32, copy=True)


def render_heatmaps(matrices, xlabel="Keys", ylabel="Queries", titles=None, *, mask=None,
                    title=None, row_labels=None, colorbar_label=None, note=None,
                    vmin=None, vmax=None, max_cells=96, panel_size=0):
    """Like show_heatmaps, but returns (image, layout) and writes nothing.

    layout is a dict: rows, cols, queries, keys, q_block, k_block (matrix rows
    and columns averaged into one cell), cells_q, cells_k, cell_w, cell_h,
    gap, panels [(x, y, w, h)] row-major, colorbar and mask_swatch (x, y, w, h),
    and the colour scale vmin, vmax. cell_center(layout, ...) finds a cell.
    """
    w = _as_float_array(matrices)
    if w.ndim != 4:
        raise ValueError(f"[show_heatmaps] matrices: shape {tuple(w.shape)}, "
                         "wanted 4 dimensions (rows, cols, Q, K) as d2l's show_heatmaps")
    if mask is not None:
        if hasattr(mask, "detach") and hasattr(mask, "numpy"):  # a torch tensor
            mask = mask.detach().cpu().numpy()
        if isinstance(mask, (str, bytes, dict)):
            raise _checks.wrong_kind("show_heatmaps", "mask", mask, "a bool array (True = masked)")
        try:
            m = np.asarray(mask)
        except (TypeError, ValueError):  # ragged nested lists
            raise _core.ArgumentTypeError("[show_heatmaps] mask: cannot be read as a numeric array") from None
        if m.dtype != np.bool_:
            raise _core.ArgumentTypeError(f"[show_heatmaps] mask: dtype {m.dtype}, wanted bool (True = masked)")
        try:
            m = np.broadcast_to(m, w.shape)
        except ValueError:
            raise ValueError(f"[show_heatmaps] mask: shape {m.shape} does not broadcast to "
                             f"the matrices' {tuple(w.shape)}") from None
        w[m] = np.nan
    rows, cols = w.shape[:2]
    titles = list(titles) if titles is not None else []
    if len(titles) == cols and rows > 1:
        titles = titles * rows  # d2l gives one title per column
    elif titles and len(titles) != rows * cols:
        raise ValueError(f"[show_heatmaps] titles: {len(titles)} given, wanted one per column "
                         f"({cols}) or one per panel ({rows * cols})")
    return _core._render_heatmaps(
        w, xlabel or "", ylabel or "", [str(t) for t in titles],
        [str(r) for r in (row_labels or [])], title or "", colorbar_label or "", note or "",
        vmin, vmax, _checks.integer(max_cells, "show_heatmaps", "max_cells"),
        _checks.integer(panel_size, "show_heatmaps", "panel_size"))


# matplotlib's sequential colour maps (ColorBrewer's 9 classes, light to dark),
# interpolated to mha's 256 entries; "viridis" is mha's own map.
_BREWER = {
    "Reds": "fff5f0 fee0d2 fcbba1 fc9272 fb6a4a ef3b2c cb181d a50f15 67000d",
    "Blues": "f7fbff deebf7 c6dbef 9ecae1 6baed6 4292c6 2171b5 08519c 08306b",
    "Greens": "f7fcf5 e5f5e0 c7e9c0 a1d99b 74c476 41ab5d 238b45 006d2c 00441b",
    "Greys": "ffffff f0f0f0 d9d9d9 bdbdbd 969696 737373 525252 252525 000000",
    "Oranges": "fff5eb fee6ce fdd0a2 fdae6b fd8d3c f16913 d94801 a63603 7f2704",
    "Purples": "fcfbfd efedf5 dadaeb bcbddc 9e9ac8 807dba 6a51a3 54278f 3f007d",
    "YlOrRd": "ffffcc ffeda0 fed976 feb24c fd8d3c fc4e2a e31a1c bd0026 800026",
}
COLORMAPS = sorted(list(_BREWER) + ["viridis", "gray"]) + \
    sorted(n + "_r" for n in list(_BREWER) + ["viridis", "gray"])


def colormap(name):
    """(256, 3) uint8 table of a colour map by matplotlib's name (COLORMAPS; "_r" reverses)."""
    base = name[:-2] if name.endswith("_r") else name
    if base == "viridis":
        table = _core.colormap_table()
    elif base == "gray":
        ramp = np.linspace(0, 255, 256).round().astype(np.uint8)
        table = np.stack([ramp] * 3, axis=1)
    elif base in _BREWER:
        anchors = np.array([[int(h[i:i + 2], 16) for i in (0, 2, 4)] for h in _BREWER[base].split()],
                           np.float64)
        t = np.linspace(0, len(anchors) - 1, 256)
        table = np.stack([np.interp(t, np.arange(len(anchors)), anchors[:, c]) for c in range(3)],
                         axis=1).round().astype(np.uint8)
    else:
        raise ValueError(f"[show_heatmaps] cmap: '{name}' is not one of {', '.join(COLORMAPS)}")
    return table[::-1].copy() if name.endswith("_r") else table


def _recolour(image, cmap):
    """mha's colour map -> cmap: every pixel whose colour is an entry of mha's map
    (cells and colour bar; text, axes and the mask grey are not) takes the
    same entry of cmap."""
    if cmap == "viridis":
        return image
    own = _core.colormap_table().astype(np.int64)
    key = lambda rgb: (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]  # noqa: E731
    own_keys = key(own)
    order = np.argsort(own_keys)
    px = key(image[..., :3].astype(np.int64))
    pos = np.clip(np.searchsorted(own_keys[order], px), 0, len(own_keys) - 1)
    hit = own_keys[order][pos] == px
    out = image.copy()
    out[..., :3][hit] = colormap(cmap)[order[pos[hit]]]
    return out


def _display_in_notebook(image):
    """Shows the picture in a Jupyter notebook (IPython's display); True if it did."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return False
    import os
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".png")
    os.close(fd)
    try:
        _core.write_png(path, image)
        with open(path, "rb") as f:
            display(Image(data=f.read(), format="png"))
    finally:
        os.unlink(path)
    return True


def show_heatmaps(matrices, xlabel="Keys", ylabel="Queries", titles=None, figsize=(2.5, 2.5),
                  cmap="Reds", *, path=None, dpi=100, display=None, mask=None, title=None,
                  row_labels=None, colorbar_label=None, note=None, vmin=None, vmax=None,
                  max_cells=96, panel_size=None):
    """Draw (rows, cols, Q, K) matrices as a grid of heatmaps; return the image.

    d2l's show_heatmaps(matrices, xlabel, ylabel, titles=None, figsize=(2.5, 2.5),
    cmap='Reds') with the same arguments, order and shapes: panel (i, j) shows
    matrices[i, j], the query index down and the key index across, with one
    colour bar for all.

    matrices: (rows, cols, Q, K), numpy or torch; NaN cells are drawn masked.
    titles:   one per column (d2l) or one per panel (row-major), or None.
    figsize:  (width, height) in inches of the grid of panels at `dpi` pixels per
              inch (d2l's figure size; labels and the colour bar come on top);
              None: mha's automatic size.
    cmap:     a matplotlib colour map name: Reds (d2l's), Blues, Greens, Greys,
              Oranges, Purples, YlOrRd, viridis (mha's), gray, or any with "_r".
    path:     if given, the PNG is written there (atomically).
    display:  show the picture in a Jupyter notebook through IPython's display
              (None: when running in one).
    mask:     optional bool array broadcastable to matrices; True = masked.
    title, row_labels (one per row), colorbar_label, note: more text.
    vmin, vmax: the colour scale (default: the drawn values' max, and their
        min or 0, whichever is lower, so that the map's first colour means 0).
    max_cells: longer axes are averaged over blocks to at most this many cells.
    panel_size: the longer side of a panel in pixels (overrides figsize).

    Returns the picture as an (H, W, 4) uint8 RGBA numpy array.
    """
    if isinstance(figsize, (str, bytes)) or hasattr(figsize, "__fspath__"):
        path, figsize = figsize, None  # mha 0.1's positional path
    dpi = _checks.real(dpi, "show_heatmaps", "dpi")
    if not 0 < dpi <= 10000:
        raise ValueError(f"[show_heatmaps] dpi: {dpi:g}; wanted 0 < dpi <= 10000 (pixels per inch)")
    matrices = _checks.real_array(matrices, "show_heatmaps", "matrices")
    if panel_size is None:
        panel_size = 0
        if figsize is not None:
            try:
                w_in, h_in = figsize
            except (TypeError, ValueError):
                raise _core.ArgumentTypeError(f"[show_heatmaps] figsize: {figsize!r}, wanted (width, height) "
                                              "in inches") from None
            w_in = _checks.real(w_in, "show_heatmaps", "figsize[0]")
            h_in = _checks.real(h_in, "show_heatmaps", "figsize[1]")
            if not (w_in > 0 and h_in > 0):
                raise ValueError(f"[show_heatmaps] figsize: {figsize!r}, wanted positive inches")
            shape = np.shape(matrices)
            rows, cols = (shape[0], shape[1]) if len(shape) == 4 else (1, 1)
            panel_size = max(16, int(min(w_in * dpi / max(cols, 1), h_in * dpi / max(rows, 1))))
    colormap(cmap)  # an unknown name fails before drawing
    image, _ = render_heatmaps(matrices, xlabel, ylabel, titles, mask=mask, title=title,
                               row_labels=row_labels, colorbar_label=colorbar_label, note=note,
                               vmin=vmin, vmax=vmax, max_cells=max_cells, panel_size=panel_size)
    image = _recolour(image, cmap)
    if path is not None:
        _core.write_png(str(path), image)
    if display or display is None:
        _display_in_notebook(image)
    return image


def cell_center(layout, row, col, q, k):
    """(x, y) pixel at the centre of the cell that shows element (q, k) of panel (row, col)."""
    if not isinstance(layout, dict):
        raise _checks.wrong_kind("plot.cell_center", "layout", layout, "the layout dict of render_heatmaps")
    op = "plot.cell_center"
    row = _checks.index(row, op, "row", layout["rows"])
    col = _checks.index(col, op, "col", layout["cols"])
    q = _checks.index(q, op, "q", layout["queries"])
    k = _checks.index(k, op, "k", layout["keys"])
    x, y, _, _ = layout["panels"][row * layout["cols"] + col]
    cw, ch, gap = layout["cell_w"], layout["cell_h"], layout["gap"]
    return (x + (k // layout["k_block"]) * cw + (cw - gap) // 2,
            y + (q // layout["q_block"]) * ch + (ch - gap) // 2)


def colormap_inverse(rgb):
    """The fraction of the colour scale (0..1) whose colour is nearest to rgb."""
    table = _core.colormap_table().astype(np.int64)
    rgb = np.atleast_1d(_checks.real_array(rgb, "plot.colormap_inverse", "rgb"))
    d = ((table - rgb[:3].astype(np.int64)) ** 2).sum(axis=1)
    return int(np.argmin(d)) / (len(table) - 1)
