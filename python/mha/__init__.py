"""mha: the seed's multi-head attention (Dive into Deep Learning, 11.5) in C++.

    import numpy as np, mha
    attention = mha.MultiHeadAttention(num_hiddens=100, num_heads=5, dropout=0.5)
    X, Y = np.ones((2, 4, 100), np.float32), np.ones((2, 6, 100), np.float32)
    out = attention(X, Y, Y, valid_lens=np.array([3, 2]))   # (2, 4, 100)
    attention.attention_weights                              # (2, 5, 4, 6)
    attention.attention_weights_of([1], [0, 4])              # (1, 2, 4, 6)
"""
from ._core import (  # noqa: F401
    __version__,
    DotProductAttention,
    Kernel,
    get_num_threads,
    MultiHeadAttention,
    load_safetensors,
    masked_softmax,
    safetensors_metadata,
    save_safetensors,
    set_num_threads,
)
