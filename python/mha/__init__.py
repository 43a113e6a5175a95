"""mha: multi-head attention from Dive into Deep Learning (d2l, chapter 11.5) in C++.

    import numpy as np, mha
    attention = mha.MultiHeadAttention(num_hiddens=100, num_heads=5, dropout=0.5)
    X, Y = np.ones((2, 4, 100), np.float32), np.ones((2, 6, 100), np.float32)
    out = attention(X, Y, Y, valid_lens=np.array([3, 2]))   # (2, 4, 100)
    attention.attention_weights                              # (2, 5, 4, 6)
    attention.attention_weights_of([1], [0, 4])              # (1, 2, 4, 6)
"""
from ._core import (  # noqa: F401
    __version__,
    ArgumentTypeError,
    Causal,
    FullyMaskedRows,
    Mask,
    TorchMultiheadAttention,
    mask_from_sdpa,
    mask_from_torch_mha,
    mask_to_sdpa,
    mask_to_torch_mha,
    DotProductAttention,
    Kernel,
    KVCache,
    get_num_threads,
    max_num_threads,
    MultiHeadAttention,
    Rotary,
    load_safetensors,
    masked_softmax,
    memory_limit,
    safetensors_metadata,
    save_safetensors,
    set_num_threads,
    set_memory_limit,
)
from ._core import MASK_COLOR, colormap_table, read_png, write_png  # noqa: F401
from .plot import show_heatmaps  # noqa: F401
# Training: the model, its task and loss, checkpoints, optimisers.
from ._core import (  # noqa: F401,E402
    AttentionModel,
    OffsetPairTask,
    Positions,
    cross_entropy,
    load_checkpoint,
)
from . import optim  # noqa: F401,E402  (SGD, Adam, AdamW, clip_grad_norm)
# Head gates, pruning and importance: MultiHeadAttention.head_gates,
# .head_gate_grad, .prune_heads() and .kept_heads, plus these.
from ._core import (  # noqa: F401,E402
    ablation_importance,
    attention_statistics,
    gradient_importance,
    held_out_set,
    load_attention,
    prune_model_heads,
    save_attention,
)
# Reading the heads: each head's dominant offset t - k.
from ._core import HeadOffsets, head_offsets  # noqa: F401,E402


def __getattr__(name):
    # mha.torch (torch.nn.Modules) imports torch, so it loads on first use only.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'mha' has no attribute {name!r}")
