#!/usr/bin/python3
"""Draws docs/images/attention-variants.png: one head's attention weights
under each variant mha.torch.attention takes (docs/masks.md), computed by
mha's kernels (the weights read back through values = the identity), masked
cells grey.

    MHA_BUILD=build /usr/bin/python3 scripts/draw-attention-variants.py [out.png]
"""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(pathlib.Path(os.environ.get("MHA_BUILD", ROOT / "build")) / "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mha  # noqa: E402
import mha.torch  # noqa: E402

L, d = 16, 8


def weights(q, k, **options):
    """(L, L) weights of head 0: out = weights @ v with v the identity."""
    v = torch.eye(L).reshape(1, L, 1, L) if "cu_seqlens" not in options else torch.eye(L).reshape(L, 1, L)
    return mha.torch.attention(q, k, v, **options).reshape(L, L).numpy()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "docs" / "images" / "attention-variants.png")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, L, 1, d, generator=g)
    k = torch.randn(1, L, 1, d, generator=g)
    panels = [
        ("no mask", {}),
        ("causal", {"causal": True}),
        ("window (4, 0)", {"window": (4, 0)}),
        ("window (2, 2)", {"window": (2, 2)}),
        ("ALiBi, slope 0.5", {"alibi_slopes": torch.tensor([0.5])}),
        ("softcap 0.5", {"softcap": 0.5}),
        ("sink 2.0, causal", {"sinks": torch.tensor([2.0]), "causal": True}),
        ("packed 5+1+6+4, causal", {"cu_seqlens": torch.tensor([0, 5, 6, 12, 16], dtype=torch.int32),
                                          "max_seqlen": 6, "causal": True}),
    ]
    mats, titles = [], []
    for title, options in panels:
        qq, kk = (q.reshape(L, 1, d), k.reshape(L, 1, d)) if "cu_seqlens" in options else (q, k)
        w = weights(qq, kk, **options)
        masked = w == 0.0  # masked keys drop out exactly (-inf); no kept weight underflows here
        mats.append(np.where(masked, np.nan, w))
        titles.append(title)
    m = np.stack(mats).reshape(2, 4, L, L)
    mha.show_heatmaps(m, xlabel="Keys", ylabel="Queries", titles=titles, cmap="viridis", path=out, panel_size=150,
                      title="One head's attention weights under each variant (mha.torch.attention)",
                      note="Grey: masked. Window (left, right) and causal are aligned to the bottom right; "
                           "a sink takes weight without a value, so its rows sum to less than 1.")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
