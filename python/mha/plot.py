"""Pictures of attention weights: d2l's show_heatmaps, drawn by mha's cairo code.

    import mha
    attention = mha.MultiHeadAttention(100, 5).eval()
    attention(X, Y, Y, valid_lens)
    w = attention.attention_weights                     # (B, 5, Q, K)
    img = mha.show_heatmaps(w, xlabel="Keys", ylabel="Queries",
                            titles=[f"head {h}" for h in range(5)], path="heads.png")
    img.shape                                           # (H, W, 4) uint8 RGBA

Colours follow one colour map (mha.colormap_table(); dark purple = low,
yellow = high) over one scale shared by all panels and shown by the colour
bar; masked cells (NaN weights, or True in `mask`) are mha.MASK_COLOR grey.
"""
import numpy as np

from . import _core


def _as_float_array(x):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.array(x, dtype=np.float32, copy=True)


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
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise ValueError(f"[show_heatmaps] mask: dtype {m.dtype}, wanted bool (True = masked)")
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
        vmin, vmax, int(max_cells), int(panel_size))


def show_heatmaps(matrices, xlabel="Keys", ylabel="Queries", titles=None, path=None, *,
                  mask=None, title=None, row_labels=None, colorbar_label=None, note=None,
                  vmin=None, vmax=None, max_cells=96, panel_size=0):
    """Draw (rows, cols, Q, K) matrices as a grid of heatmaps; return the image.

    d2l's show_heatmaps(matrices, xlabel, ylabel, titles) with the same
    argument order and shapes: panel (i, j) shows matrices[i, j], the query
    index down and the key index across, with one colour bar for all.

    matrices: (rows, cols, Q, K), numpy or torch; NaN cells are drawn masked.
    titles:   one per column (d2l) or one per panel (row-major), or None.
    path:     if given, the PNG is written there (atomically).
    mask:     optional bool array broadcastable to matrices; True = masked.
    title, row_labels (one per row), colorbar_label, note: more text.
    vmin, vmax: the colour scale (default: the drawn values' min and max).
    max_cells: longer axes are averaged over blocks to at most this many cells.
    panel_size: the longer side of a panel in pixels (0: automatic).

    Returns the picture as an (H, W, 4) uint8 RGBA numpy array.
    """
    image, _ = render_heatmaps(matrices, xlabel, ylabel, titles, mask=mask, title=title,
                               row_labels=row_labels, colorbar_label=colorbar_label, note=note,
                               vmin=vmin, vmax=vmax, max_cells=max_cells, panel_size=panel_size)
    if path is not None:
        _core.write_png(str(path), image)
    return image


def cell_center(layout, row, col, q, k):
    """(x, y) pixel at the centre of the cell that shows element (q, k) of panel (row, col)."""
    x, y, _, _ = layout["panels"][row * layout["cols"] + col]
    cw, ch, gap = layout["cell_w"], layout["cell_h"], layout["gap"]
    return (x + (k // layout["k_block"]) * cw + (cw - gap) // 2,
            y + (q // layout["q_block"]) * ch + (ch - gap) // 2)


def colormap_inverse(rgb):
    """The fraction of the colour scale (0..1) whose colour is nearest to rgb."""
    table = _core.colormap_table().astype(np.int64)
    d = ((table - np.asarray(rgb[:3], dtype=np.int64)) ** 2).sum(axis=1)
    return int(np.argmin(d)) / (len(table) - 1)
