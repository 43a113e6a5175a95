"""mha inside PyTorch models: torch.nn.Modules computed and differentiated by mha.

    import torch, mha.torch
    attention = mha.torch.MultiHeadAttention(num_hiddens=100, num_heads=5, dropout=0.5)
    X, Y = torch.ones(2, 4, 100), torch.ones(2, 6, 100)
    out = attention(X, Y, Y, torch.tensor([3, 2]))      # (2, 4, 100), a torch tensor
    out.sum().backward()                                # mha's backward, into .grad
    attention.attention.attention_weights.shape         # (10, 4, 6): the d2l chapter's (B*h, Q, K)
    attention.attention_weights.shape                   # (2, 5, 4, 6): mha's (B, h, Q, K)

    layer = torch.nn.TransformerEncoderLayer(64, 4, batch_first=True)
    layer.self_attn = mha.torch.MultiheadAttention(64, 4, dropout=0.1, batch_first=True)

Two modules:
- MultiHeadAttention: the d2l chapter's module (constructor, lazy W_q, W_k, W_v,
  W_o, state-dict names, forward(queries, keys, values, valid_lens)).
- MultiheadAttention: torch.nn.MultiheadAttention's constructor, parameters,
  state-dict names, forward signature and (output, weights) return values.

How they relate to torch:
- The torch.nn.Parameters are the only copy of the weights. Every call reads
  the Parameters the module holds at that moment, in place (numpy views of
  their storage; slices of in_proj_weight are views too), so assigning a new
  Parameter, tying two, replacing a layer, `.data = t` and in-place writes
  are all seen by the next call, with nothing to sync. Module attributes
  (batch_first, training, dropout) are read per call too.
- mha packs each weight for its matrix products once per version: a version
  changes with the Parameter's storage, shape or torch version counter
  (optimisers, in-place ops under no_grad, nn.init). A write the counter
  does not see (in place on `.data`, or through a numpy view of the storage;
  autograd does not see it either) needs `module.parameters_written()`
  before the next call, or the call multiplies by the old packing.
- Each call is its own: its autograd node keeps the call's context
  (projections, softmax statistics, masks, dropout key), so any number of
  calls, from any threads, forward and backward in any order, each get
  their own gradients; the module keeps only the last call's context, for
  attention_weights. Parameters' gradients accumulate into .grad as torch's
  do. Double backward (create_graph=True) raises a RuntimeError.
- Dropout masks are drawn by mha from a key taken from torch's generator,
  so torch.manual_seed makes them repeatable; they are not torch's masks.
- Inputs: CPU float32 tensors, contiguous or not (a non-contiguous one costs
  one more copy). bfloat16 and float16 inputs, and float32 inputs under
  torch.autocast('cpu', bfloat16 or float16), run mha's bfloat16 mode
  (precision='bfloat16') and return that dtype. float64 inputs raise
  TypeError (convert with .float()); so do parameters of another dtype than
  float32 (`.half()`, `.to(torch.bfloat16)`): mha keeps float32 parameters.
  CUDA tensors raise ValueError.
- Threads: torch's and mha's pools are separate (torch.set_num_threads,
  mha.set_num_threads); with more than one thread, run with
  OMP_WAIT_POLICY=PASSIVE so that neither spins while the other computes.
- Cached calls (cache=, eval mode, no gradients) run on an mha module owned
  by the torch module (a KVCache belongs to it), whose buffers get a copy of
  each Parameter that changed since the last cached call.

Where each part lives (this file only gathers them):
- python/mha/torch_chapter.py: MultiHeadAttention (the d2l chapter's module);
- python/mha/torch_drop_in.py: MultiheadAttention, multi_head_attention_forward,
  replace_attention;
- python/mha/torch_importance.py: head_importance;
- python/mha/_torch_call.py: what both modules share for a call (checks,
  weights, the autograd Function); python/mha/_torch_cache.py: cached calls;
  python/mha/_torch_traced.py: the modules under torch.compile / torch.export;
- python/mha/torch_sdpa.py, torch_attention.py, torch_kv_cache.py: the
  functions, on the operators of python/mha/_torch_ops.py;
- python/mha/torch_distributed.py (mha.torch.distributed).
"""

import sys as _sys

from ._torch_cache import TensorKVCache
from .torch_attention import attention  # FlashAttention's function
from .torch_chapter import DotProductAttention, MultiHeadAttention  # noqa: F401 (DotProductAttention: the chapter's)
from .torch_drop_in import MultiheadAttention, multi_head_attention_forward, replace_attention
from .torch_importance import head_importance
from .torch_kv_cache import attention_with_kv_cache  # FlashAttention's flash_attn_with_kvcache
from .torch_sdpa import scaled_dot_product_attention  # PyTorch 2.x's function

__all__ = ["MultiHeadAttention", "MultiheadAttention", "multi_head_attention_forward", "replace_attention",
           "head_importance", "scaled_dot_product_attention", "attention", "attention_with_kv_cache",
           "TensorKVCache"]

# Saved models and reprs name the public classes by the module users import.
for _public in (DotProductAttention, MultiHeadAttention, MultiheadAttention, multi_head_attention_forward,
                replace_attention, head_importance, TensorKVCache):
    _public.__module__ = __name__
del _public

# mha.torch.distributed (python/mha/torch_distributed.py): importable as `import mha.torch.distributed`
# and as the attribute mha.torch.distributed, while mha.torch stays one file.
from . import torch_distributed as distributed  # noqa: E402
_sys.modules[__name__ + ".distributed"] = distributed
