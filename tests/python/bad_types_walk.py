"""The walk of tests/python/test_bad_types.py, run as a child process.

    python bad_types_walk.py FIRST
    python bad_types_walk.py --ints FIRST

enumerates every entry point of the mha package by introspection (the
functions and classes of mha, mha._core, mha.optim, mha.plot and mha.torch;
each class's constructor, methods, static methods and property setters,
private ones of mha._core included), calls each with valid arguments except
one, which is replaced by a value that is not a number, and prints one line
per call:

    START <index> <label>        before the call (flushed)
    RESULT <json>                after it: the outcome

from call number FIRST on. A crash ends the process after a START without its
RESULT; the test starts the walk again after that call. With --ints, each
integer argument is given integers out of most or all ranges instead
(INT_POISONS; tests/python/test_int_ranges.py). `--list` prints the
entry points and the arguments poisoned in each, and nothing is called.
"""
import faulthandler
import inspect
import json
import os
import re
import sys
import tempfile

import numpy as np

import mha
import mha._core as core
import mha.optim
import mha.plot

try:
    import torch
    import mha.torch as mtorch
except ImportError:  # the walk then leaves mha.torch out
    torch = None
    mtorch = None

faulthandler.enable()
TMP = tempfile.mkdtemp(prefix="mha_bad_types_")


def ones(*shape):
    return np.ones(shape, np.float32)


# Values that are not numbers. None is poisoned only where None is not a
# default of the argument (where it is, None is a valid value).
BAD = {
    "str": "abc",
    "numeric_str": "1",  # must not be read as the number 1
    "bytes": b"12",
    "dict": {"a": "one"},
    "object": object(),
    "None": None,
    "ragged": [[1, 2], [3]],
    "str_list": ["1", "2"],
    "object_array": np.array([1.0, None], dtype=object),
    "str_array": np.array(["1.5", "2.5"]),
}

# Integers no parameter can hold or most cannot (the --ints walk): past 32
# bits, past 63, past 64, negative.
INT_POISONS = {
    "2**31": 2**31,
    "2**63": 2**63,
    "2**64": 2**64,
    "10**30": 10**30,
    "-1": -1,
    "-2**63-1": -2**63 - 1,
}

# ---- valid calls -------------------------------------------------------------


def called_mha():
    m = mha.MultiHeadAttention(8, 2)
    m(ones(2, 3, 4), ones(2, 3, 4), ones(2, 3, 4))
    return m


def small_model():
    return mha.AttentionModel(5, 3, 8, num_hiddens=4, num_heads=2)


def torch_state():
    return {"in_proj_weight": ones(12, 4), "in_proj_bias": ones(12), "out_proj.weight": ones(4, 4),
            "out_proj.bias": ones(4)}


def tmha():
    m = mha.TorchMultiheadAttention.from_state_dict(torch_state(), num_heads=2, batch_first=True)
    m.train()
    m(ones(2, 3, 4), ones(2, 5, 4), ones(2, 5, 4))
    return m


TASK = mha.OffsetPairTask(vocab=4, near=1, far=2, min_len=3, max_len=6)
BATCH = TASK.sample(2, 0)
SAVED = os.path.join(TMP, "saved.safetensors")
mha.save_attention(SAVED, called_mha())
WEIGHTS = called_mha().attention_weights
Q3 = ones(2, 3, 4)

# Instances whose methods are walked, by class label.
INSTANCES = {
    "MultiHeadAttention": called_mha,
    "DotProductAttention": lambda: mha.DotProductAttention(),
    "AttentionModel": lambda: (lambda m: (m(BATCH["tokens"]), m)[1])(small_model()),
    "OffsetPairTask": lambda: TASK,
    "TorchMultiheadAttention": tmha,
    "Mask": lambda: mha.Mask.keep(np.ones((2, 2), bool)),
    "ForwardContext": lambda: called_mha().forward_with_context(Q3, Q3, Q3)[1],
    "KVCache": lambda: called_mha().eval().kv_cache(2, 4),
    "optim.SGD": lambda: mha.optim.SGD(called_mha(), 0.1),
    "optim.Adam": lambda: mha.optim.Adam(called_mha()),
    "optim.AdamW": lambda: mha.optim.AdamW(called_mha()),
}
if torch is not None:
    INSTANCES["torch.MultiHeadAttention"] = lambda: mtorch.MultiHeadAttention(8, 2, 0.0)
    INSTANCES["torch.MultiheadAttention"] = lambda: mtorch.MultiheadAttention(4, 2, batch_first=True)

# Valid keyword arguments of every entry point that takes arguments. A new
# entry point without a row here fails the test (test_bad_types.py) until it
# has one.
GOOD = {
    "masked_softmax": dict(X=ones(2, 3, 4), valid_lens=np.array([1, 2])),
    "DotProductAttention": dict(dropout=0.0, seed=0),
    "DotProductAttention.__call__": dict(queries=Q3, keys=Q3, values=Q3, valid_lens=np.array([1, 2])),
    "DotProductAttention.train": dict(mode=True),
    "MultiHeadAttention": dict(num_hiddens=8, num_heads=2, dropout=0.0, bias=False, seed=0),
    "MultiHeadAttention.__call__": dict(queries=Q3, keys=Q3, values=Q3, valid_lens=np.array([1, 2])),
    "MultiHeadAttention.forward_with_context": dict(queries=Q3, keys=Q3, values=Q3, valid_lens=np.array([1, 2]),
                                                    key_padding_mask=np.zeros((2, 3), bool),
                                                    attn_mask=np.zeros((3, 3), bool), is_causal=False),
    "MultiHeadAttention.train": dict(mode=True),
    "MultiHeadAttention.attention_weights_of": dict(batch_rows=[0], heads=[0]),
    "MultiHeadAttention.load_state_dict": dict(state_dict=lambda: called_mha().state_dict()),
    "MultiHeadAttention.backward": dict(grad_output=ones(2, 3, 8)),
    "MultiHeadAttention.set_grads": dict(grads=lambda: called_mha().state_dict()),
    "MultiHeadAttention.initialize": dict(dq=4, dk=4, dv=4),
    "MultiHeadAttention.prune_heads": dict(heads=[0]),
    "MultiHeadAttention._reseed": dict(seed=1),
    "MultiHeadAttention._set_dropout": dict(p=0.1),
    "MultiHeadAttention.head_gates =": dict(gates=ones(2)),
    "MultiHeadAttention.kernel =": dict(kernel=mha.Kernel.BLAS),
    "MultiHeadAttention.rotary =": dict(rotary=lambda: mha.Rotary(2)),
    # internal: head_dim comes from a module's checked sizes (a callable: not in the --ints walk)
    "_to_rotary": dict(rotary=lambda: {"base": 100.0, "dims": 2}, op="_to_rotary", head_dim=lambda: 4),
    "Rotary": dict(dims=2, base=10000.0, interleaved=False),
    "AttentionModel": dict(vocab_size=5, num_classes=3, max_len=8, num_hiddens=4, num_heads=2, num_layers=1,
                           dropout=0.0, bias=False, positions=mha.Positions.LEARNED, seed=0),
    "AttentionModel.__call__": dict(tokens=np.zeros((2, 3), np.int64), valid_lens=np.array([1, 2])),
    "AttentionModel.backward": dict(grad_logits=lambda: ones(*BATCH["tokens"].shape, 3)),
    "AttentionModel.load_state_dict": dict(state_dict=lambda: small_model().state_dict()),
    "AttentionModel.train": dict(mode=True),
    "AttentionModel.layer": dict(index=0),
    "OffsetPairTask": dict(vocab=4, near=1, far=2, min_len=3, max_len=6),
    "OffsetPairTask.sample": dict(batch_size=2, seed=0),
    "cross_entropy": dict(logits=ones(2, 3), targets=np.zeros(2, np.int64)),
    "save_safetensors": dict(path=os.path.join(TMP, "a.safetensors"), tensors={"x": ones(1)}, metadata={}),
    "load_safetensors": dict(path=SAVED),
    "safetensors_metadata": dict(path=SAVED),
    "save_attention": dict(path=os.path.join(TMP, "b.safetensors"), module=called_mha),
    "load_attention": dict(path=SAVED, num_heads=2),
    "load_checkpoint": dict(path=SAVED),
    "set_num_threads": dict(n=1),
    "_fma_peak": dict(threads=1, seconds=0.01),
    "set_memory_limit": dict(bytes=0),
    "Mask.keep": dict(keep=np.ones((2, 2), bool)),
    "Mask.additive": dict(bias=ones(2, 2)),
    "mask_from_torch_mha": dict(mask=np.zeros((2, 2), bool)),
    "mask_from_sdpa": dict(mask=np.ones((2, 2), bool)),
    "mask_to_torch_mha": dict(mask=lambda: mha.Mask.keep(np.ones((2, 2), bool))),
    "mask_to_sdpa": dict(mask=lambda: mha.Mask.keep(np.ones((2, 2), bool))),
    "TorchMultiheadAttention.from_state_dict": dict(
        state_dict=torch_state, num_heads=2, batch_first=True, kdim=None, vdim=None, add_zero_attn=False,
        num_kv_heads=None, dropout=0.0, fully_masked_rows=mha.FullyMaskedRows.ZEROS, seed=0),
    "TorchMultiheadAttention.from_safetensors": dict(
        path=lambda: (mha.save_safetensors(os.path.join(TMP, "t.safetensors"), torch_state()),
                      os.path.join(TMP, "t.safetensors"))[1],
        num_heads=2, batch_first=True, kdim=None, vdim=None, add_zero_attn=False, num_kv_heads=None,
        dropout=0.0, fully_masked_rows=mha.FullyMaskedRows.ZEROS, seed=0),
    "TorchMultiheadAttention.__call__": dict(
        query=ones(2, 3, 4), key=ones(2, 5, 4), value=ones(2, 5, 4), key_padding_mask=np.zeros((2, 5), bool),
        need_weights=True, attn_mask=np.zeros((3, 5), bool), average_attn_weights=True, is_causal=False),
    "TorchMultiheadAttention.forward_with_context": dict(
        query=ones(2, 3, 4), key=ones(2, 5, 4), value=ones(2, 5, 4), key_padding_mask=np.zeros((2, 5), bool),
        need_weights=True, attn_mask=np.zeros((3, 5), bool), average_attn_weights=True, is_causal=False),
    "TorchMultiheadAttention.backward": dict(grad_output=ones(2, 3, 4)),
    "TorchMultiheadAttention.head_gates =": dict(gates=ones(2)),
    "TorchMultiheadAttention.prune_heads": dict(heads=[0]),
    "ForwardContext.attention_weights": dict(batch_rows=[0], heads=[0]),
    "TorchMultiheadAttention.train": dict(mode=True),
    "TorchMultiheadAttention._reseed": dict(seed=1),
    "TorchMultiheadAttention._set_dropout": dict(p=0.1),
    "TorchMultiheadAttention.kernel =": dict(kernel=mha.Kernel.BLAS),
    "TorchMultiheadAttention.rotary =": dict(rotary=lambda: mha.Rotary(2)),
    "TorchMultiheadAttention.fully_masked_rows =": dict(fully_masked_rows=mha.FullyMaskedRows.UNIFORM),
    "head_offsets": dict(weights=WEIGHTS, valid_lens=np.array([3, 2]), first_query=0),
    "held_out_set": dict(task=TASK, size=4, seed=1),
    "gradient_importance": dict(model=small_model, batches=lambda: [dict(BATCH)]),
    "ablation_importance": dict(model=small_model, batches=lambda: [dict(BATCH)]),
    "attention_statistics": dict(model=small_model, batches=lambda: [dict(BATCH)]),
    "prune_model_heads": dict(model=small_model, heads=[(0, 1)]),
    "read_png": dict(path=lambda: (core.write_png(os.path.join(TMP, "r.png"), np.zeros((2, 2, 4), np.uint8)),
                                   os.path.join(TMP, "r.png"))[1]),
    "write_png": dict(path=os.path.join(TMP, "a.png"), image=np.zeros((2, 2, 4), np.uint8)),
    "_render_heatmaps": dict(weights=ones(1, 1, 2, 2), xlabel="", ylabel="", titles=[], row_labels=[], title="",
                             colorbar_label="", note="", vmin=None, vmax=None, max_cells=10, panel_size=0),
    "_render_line_chart": dict(panels=lambda: [{"title": "t", "series": [("a", [0.0, 1.0], [1.0, 2.0])]}],
                               title="", plot_width=100, plot_height=80),
    "MultiHeadAttention.kv_cache": dict(batch_size=2, max_len=4, dtype="float32"),
    "TorchMultiheadAttention.kv_cache": dict(batch_size=2, max_len=4, dtype="float32"),
    "KVCache.truncate": dict(row=0, length=0),
    "KVCache.reorder": dict(rows=[0, 1]),
    "KVCache.append": dict(keys=ones(2, 1, 8), values=ones(2, 1, 8)),
    "KVCache.keys": dict(row=0),
    "KVCache.values": dict(row=0),
    "_decode_attention": dict(q=ones(1, 2, 1, 4), k_cache=ones(1, 2, 3, 4), v_cache=ones(1, 2, 3, 4),
                              lengths=np.array([3]), causal=True),
    "optim.SGD": dict(module=called_mha, lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    "optim.Adam": dict(module=called_mha, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                       amsgrad=False),
    "optim.AdamW": dict(module=called_mha, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                        amsgrad=False),
    "optim.Optimizer.lr =": dict(lr=0.1),
    "optim.clip_grad_norm": dict(module=called_mha, max_norm=1.0, norm_type=2.0),
    "show_heatmaps": dict(matrices=ones(1, 2, 2, 2), xlabel="k", ylabel="q", titles=["a", "b"],
                               figsize=(2.5, 2.5), cmap="Reds", path=None, dpi=100, display=False,
                               mask=np.zeros((1, 2, 2, 2), bool), title="t", row_labels=["r"],
                               colorbar_label="c", note="n", vmin=0.0, vmax=1.0, max_cells=96, panel_size=None),
    "plot.render_heatmaps": dict(matrices=ones(1, 2, 2, 2), xlabel="k", ylabel="q", titles=["a", "b"],
                                 mask=np.zeros((1, 2, 2, 2), bool), title="t", row_labels=["r"],
                                 colorbar_label="c", note="n", vmin=0.0, vmax=1.0, max_cells=96, panel_size=0),
    "plot.colormap": dict(name="Reds"),
    "plot.cell_center": dict(layout=lambda: mha.plot.render_heatmaps(ones(1, 1, 2, 2))[1], row=0, col=0, q=1,
                             k=1),
    "plot.colormap_inverse": dict(rgb=(10, 20, 30)),
}
if torch is not None:
    t3 = torch.ones(2, 3, 4)
    GOOD.update({
        "torch.MultiHeadAttention": dict(num_hiddens=8, num_heads=2, dropout=0.0, bias=False),
        "torch.MultiHeadAttention.forward": dict(queries=t3, keys=t3, values=t3, valid_lens=torch.tensor([1, 2])),
        "torch.MultiHeadAttention.kernel =": dict(kernel=mha.Kernel.BLAS),
        "torch.MultiHeadAttention.precision =": dict(precision="bf16"),
        "torch.MultiHeadAttention.rotary =": dict(rotary=lambda: {"interleaved": True, "dims": 2}),
        "torch.MultiheadAttention.rotary =": dict(rotary=lambda: {"base": 100.0, "dims": 2}),
        "torch.MultiheadAttention": dict(embed_dim=4, num_heads=2, dropout=0.0, bias=True, add_bias_kv=False,
                                         add_zero_attn=False, kdim=None, vdim=None, batch_first=True,
                                         device=None, dtype=None, fully_masked_rows=None, kernel=None,
                                         precision="float32"),
        "torch.MultiheadAttention.forward": dict(
            query=t3, key=torch.ones(2, 5, 4), value=torch.ones(2, 5, 4),
            key_padding_mask=torch.zeros(2, 5, dtype=torch.bool), need_weights=True,
            attn_mask=torch.zeros(3, 5, dtype=torch.bool), average_attn_weights=True, is_causal=False),
        "torch.MultiheadAttention.kernel =": dict(kernel=mha.Kernel.BLAS),
        "torch.MultiheadAttention.precision =": dict(precision="bf16"),
        "torch.MultiHeadAttention.kv_cache": dict(batch_size=2, max_len=4, dtype="float32"),
        "torch.MultiHeadAttention.tensor_kv_cache": dict(batch_size=2, max_len=4, dtype=torch.float32),
        "torch.MultiheadAttention.tensor_kv_cache": dict(batch_size=2, max_len=4, dtype=torch.bfloat16),
        "torch.TensorKVCache": dict(batch_size=1, max_len=4, num_kv_heads=2, head_dim=4, dtype="float32"),
        "torch.MultiheadAttention.kv_cache": dict(batch_size=2, max_len=4, dtype="float32"),
        "torch.scaled_dot_product_attention": dict(
            query=torch.ones(2, 3, 4), key=torch.ones(2, 5, 4), value=torch.ones(2, 5, 4),
            attn_mask=torch.ones(3, 5, dtype=torch.bool), dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False),
        "torch.attention": dict(
            q=torch.ones(5, 2, 4), k=torch.ones(5, 2, 4), v=torch.ones(5, 2, 4), causal=False, window=(1, 0),
            alibi_slopes=torch.ones(2), softcap=1.0, sinks=torch.zeros(2),
            cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32), max_seqlen=3, scale=0.5, dropout_p=0.0),
        "torch.attention_with_kv_cache": dict(
            q=torch.ones(2, 1, 2, 4), k_cache=torch.zeros(2, 6, 1, 4), v_cache=torch.zeros(2, 6, 1, 4),
            k=torch.ones(2, 1, 1, 4), v=torch.ones(2, 1, 1, 4), cache_seqlens=torch.tensor([1, 3]), causal=True,
            window=(2, 0), alibi_slopes=torch.ones(2), softcap=1.0, sinks=torch.zeros(2), scale=0.5),
        "torch.MultiHeadAttention.head_gates =": dict(head_gates=torch.ones(2)),
        "torch.MultiHeadAttention.prune_heads": dict(heads=[0]),
        "torch.MultiheadAttention.prune_heads": dict(heads=[0]),
        "torch.MultiheadAttention.head_gates =": dict(head_gates=torch.ones(2)),
        "torch.multi_head_attention_forward": dict(
            query=torch.ones(3, 2, 4), key=torch.ones(5, 2, 4), value=torch.ones(5, 2, 4), embed_dim_to_check=4,
            num_heads=2, in_proj_weight=torch.ones(12, 4), in_proj_bias=torch.zeros(12), bias_k=None, bias_v=None,
            add_zero_attn=False, dropout_p=0.0, out_proj_weight=torch.ones(4, 4), out_proj_bias=torch.zeros(4),
            training=True, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool), need_weights=True,
            attn_mask=torch.zeros(3, 5, dtype=torch.bool), use_separate_proj_weight=False, q_proj_weight=None,
            k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
            is_causal=False),
    })

# Arguments that are not numbers (paths, labels, names, enum choices, flags
# that only pybind11 reads): not poisoned. pybind11's signatures give the
# types of the compiled entry points (str, enums and classes are left out);
# the pure-Python ones are listed here.
NOT_NUMERIC = {
    "show_heatmaps": {"xlabel", "ylabel", "titles", "cmap", "path", "display", "title", "row_labels",
                           "colorbar_label", "note"},
    "plot.render_heatmaps": {"xlabel", "ylabel", "titles", "title", "row_labels", "colorbar_label", "note"},
    "plot.colormap": {"name"},
    "plot.cell_center": {"layout"},
    "torch.MultiHeadAttention.kernel =": {"kernel"},
    "torch.MultiheadAttention.kernel =": {"kernel"},
    "torch.MultiHeadAttention.precision =": {"precision"},
    "torch.MultiheadAttention.precision =": {"precision"},
    "torch.MultiheadAttention": {"device", "dtype", "fully_masked_rows", "kernel", "precision"},
    "torch.MultiHeadAttention.kv_cache": {"dtype"},
    "torch.MultiheadAttention.kv_cache": {"dtype"},
    "torch.MultiHeadAttention.tensor_kv_cache": {"dtype"},
    "torch.MultiheadAttention.tensor_kv_cache": {"dtype"},
    "torch.TensorKVCache": {"dtype"},
}
# Entry points that take no numbers at all.
NO_NUMBERS = {"read_png", "load_safetensors", "safetensors_metadata", "load_checkpoint", "plot.colormap",
              "mask_to_torch_mha", "mask_to_sdpa", "MultiHeadAttention.kernel =", "TorchMultiheadAttention.kernel =",
              "torch.MultiHeadAttention.precision =", "torch.MultiheadAttention.precision =",
              "TorchMultiheadAttention.fully_masked_rows =", "AttentionModel.layer", "torch.replace_attention",
              "torch.head_importance"}
# (entry point, argument) where None is a valid value though not the default.
NONE_OK = {
    ("Mask.keep", "keep"), ("mask_from_sdpa", "mask"), ("mask_from_torch_mha", "mask"),  # None: no mask
    ("_render_heatmaps", "vmin"), ("_render_heatmaps", "vmax"),  # None: the automatic scale
    ("show_heatmaps", "figsize"),  # None: the automatic size
    ("torch.MultiHeadAttention.head_gates =", "head_gates"),  # None: all heads at 1
    ("torch.scaled_dot_product_attention", "attn_mask"),  # None: no mask
    # mha.torch.attention: None is each option's off (FlashAttention's defaults)
    ("torch.attention", "window"), ("torch.attention", "alibi_slopes"), ("torch.attention", "softcap"),
    ("torch.attention", "sinks"), ("torch.attention", "cu_seqlens"), ("torch.attention", "max_seqlen"),
    ("torch.attention", "scale"),
    # mha.torch.attention_with_kv_cache: no new keys (k and v None together), the options off
    ("torch.attention_with_kv_cache", "window"), ("torch.attention_with_kv_cache", "alibi_slopes"),
    ("torch.attention_with_kv_cache", "softcap"), ("torch.attention_with_kv_cache", "sinks"),
    ("torch.attention_with_kv_cache", "scale"),
    ("torch.MultiheadAttention.head_gates =", "head_gates"),
    # rotary=None: off
    ("MultiHeadAttention.rotary =", "rotary"), ("TorchMultiheadAttention.rotary =", "rotary"),
    ("torch.MultiHeadAttention.rotary =", "rotary"), ("torch.MultiheadAttention.rotary =", "rotary"),
    ("_to_rotary", "rotary"),
    # PyTorch's functional form takes None for absent tensors though its signature has no defaults
    ("torch.multi_head_attention_forward", "in_proj_weight"), ("torch.multi_head_attention_forward", "in_proj_bias"),
    ("torch.multi_head_attention_forward", "bias_k"), ("torch.multi_head_attention_forward", "bias_v"),
    ("torch.multi_head_attention_forward", "out_proj_bias"),
}
# Poisons that mean something else in one argument: show_heatmaps' figsize
# given as a string is mha 0.1's positional path.
NOT_POISONS = {("show_heatmaps", "figsize"): {"str", "numeric_str", "bytes"}}
# The key of list-of-dict arguments to poison (the others are names).
ENTRY_KEYS = {"_render_line_chart": "series"}
# The operations an entry point's messages may name, where they are not its
# label (a label's own checks and the ones of the functions it calls).
OPS = {
    "DotProductAttention.__call__": "DotProductAttention.forward",
    "MultiHeadAttention.__call__": "MultiHeadAttention.forward",
    "MultiHeadAttention.attention_weights_of": "MultiHeadAttention.attention_weights",
    "MultiHeadAttention.head_gates =": "MultiHeadAttention.set_head_gates",
    "MultiHeadAttention.forward_with_context": ("MultiHeadAttention.forward", "MultiHeadAttention.forward_with_context"),
    "TorchMultiheadAttention.forward_with_context": ("TorchMultiheadAttention.forward",
                                                     "TorchMultiheadAttention.forward_with_context"),
    "TorchMultiheadAttention.head_gates =": "TorchMultiheadAttention.set_head_gates",
    "AttentionModel.__call__": "AttentionModel.forward",
    "TorchMultiheadAttention.__call__": "TorchMultiheadAttention.forward",
    "gradient_importance": "importance",
    "ablation_importance": "importance",
    "attention_statistics": "importance",
    "_render_heatmaps": ("_render_heatmaps", "plot.render_heatmaps"),
    "_render_line_chart": ("_render_line_chart", "plot.render_line_chart"),
    "optim.SGD": ("mha.optim.SGD", "mha.optim"),
    "optim.Adam": ("mha.optim.Adam", "mha.optim"),
    "optim.AdamW": ("mha.optim.AdamW", "mha.optim"),
    "optim.clip_grad_norm": ("mha.optim.clip_grad_norm", "mha.optim"),
    "TorchMultiheadAttention.from_safetensors": ("TorchMultiheadAttention.from_safetensors",
                                                 "TorchMultiheadAttention.from_state_dict"),
    "show_heatmaps": ("show_heatmaps", "plot.render_heatmaps"),
    "optim.Optimizer.lr =": "mha.optim.Optimizer.lr",
    "plot.render_heatmaps": ("show_heatmaps", "plot.render_heatmaps"),
    "plot.cell_center": "plot.cell_center",
    "plot.colormap_inverse": "plot.colormap_inverse",
    "torch.MultiHeadAttention": "mha.torch.MultiHeadAttention",
    "torch.MultiHeadAttention.forward": "mha.torch.MultiHeadAttention",
    "torch.MultiheadAttention": "mha.torch.MultiheadAttention",
    "torch.MultiheadAttention.forward": ("mha.torch.MultiheadAttention", "TorchMultiheadAttention.forward"),
    "torch.MultiHeadAttention.kv_cache": ("mha.torch.MultiHeadAttention.kv_cache", "MultiHeadAttention.kv_cache"),
    "torch.MultiheadAttention.kv_cache": ("mha.torch.MultiheadAttention.kv_cache", "TorchMultiheadAttention.kv_cache"),
    "torch.multi_head_attention_forward": ("mha.torch.multi_head_attention_forward", "mha.torch.MultiheadAttention"),
    "torch.MultiHeadAttention.head_gates =": "mha.torch.MultiHeadAttention.head_gates",
    "torch.scaled_dot_product_attention": "mha.torch.scaled_dot_product_attention",
    "torch.attention": "mha.torch.attention",
    "torch.attention_with_kv_cache": "mha.torch.attention_with_kv_cache",
    "torch.TensorKVCache": "mha.torch.TensorKVCache",
    "torch.MultiHeadAttention.tensor_kv_cache": "mha.torch.TensorKVCache",
    "torch.MultiheadAttention.tensor_kv_cache": "mha.torch.TensorKVCache",
    "torch.MultiHeadAttention.prune_heads": ("mha.torch.MultiHeadAttention.prune_heads", "MultiHeadAttention.prune_heads"),
    "torch.MultiheadAttention.prune_heads": ("mha.torch.MultiheadAttention.prune_heads",
                                             "TorchMultiheadAttention.prune_heads"),
    "torch.MultiheadAttention.head_gates =": "mha.torch.MultiheadAttention.head_gates",
    "MultiHeadAttention.rotary =": "MultiHeadAttention.set_rotary",
    "TorchMultiheadAttention.rotary =": "TorchMultiheadAttention.set_rotary",
    "torch.MultiHeadAttention.rotary =": "mha.torch.MultiHeadAttention.rotary",
    "torch.MultiheadAttention.rotary =": "mha.torch.MultiheadAttention.rotary",
}

# ---- enumeration -----------------------------------------------------------------

SIGNATURE = re.compile(r"^(?:\d+\. )?[\w.]*\((.*)\)(?: -> .*)?$")


def split_top(text):
    """Splits at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for c in text:
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        parts.append(cur.strip())
    return parts


def pybind2_type(typ):
    """A type as pybind11 2 spells it (python/bindings/convert.h pybind11_2_type: pybind11 3 writes "T | None",
    "collections.abc.Sequence[T]", "typing.SupportsInt | typing.SupportsIndex", ...)."""
    parts = [p for p in typ.split(" | ")]
    optional = "None" in parts
    kinds = [p for p in parts if p != "None" and not (p == "typing.SupportsIndex" and len(parts) > 1)]
    t = kinds[0] if len(kinds) == 1 else "object"
    t = {"typing.SupportsInt": "int", "typing.SupportsFloat": "float"}.get(t, t)
    for new, olds in (("List[", ("collections.abc.Sequence[", "list[")), ("Tuple[", ("tuple[",)),
                      ("Dict[", ("collections.abc.Mapping[", "dict["))):
        for old in olds:
            if t.startswith(old):
                t = new + t[len(old):]
    return f"Optional[{t}]" if optional else t


def pybind_params(f):
    """[(name, type, has_default, default_is_none)] of a pybind11 function's first overload."""
    doc = f.__doc__ or ""
    for line in doc.splitlines():
        m = SIGNATURE.match(line.strip())
        if m and "*args" not in line:
            out = []
            for p in split_top(m.group(1)):
                if p.strip() == "*":  # keyword-only marker, not an argument
                    continue
                name, _, rest = p.partition(":")
                typ, _, default = rest.partition("=")
                out.append((name.strip(), pybind2_type(typ.strip()), bool(default), default.strip() == "None"))
            return out
    return None


# The name a property setter's messages give its value, where it is not the property's.
SETTER_ARGS = {"MultiHeadAttention.head_gates =": "gates", "TorchMultiheadAttention.head_gates =": "gates"}


def params_of(label, f, bound):
    """(name, type or None, has_default, default_is_none) of the arguments after self."""
    if label.endswith(" ="):
        name = SETTER_ARGS.get(label, label[:-2].rsplit(".", 1)[1])
        if isinstance(f, property) and f.fset is not None and not inspect.isfunction(f.fset):
            p = pybind_params(f.fset)
            return [(name, p[1][1] if p and len(p) > 1 else None, False, False)]
        return [(name, None, False, False)]
    if inspect.isclass(f) and hasattr(f, "__init__") and not issubclass(f, torch.nn.Module if torch else ()):
        p = pybind_params(f.__init__)
        return p[1:] if p else []
    p = pybind_params(f) if not (inspect.isfunction(f) or inspect.isclass(f)) else None
    if p is not None:
        return p[1:] if bound and p and p[0][0] == "self" else p
    sig = inspect.signature(f.__init__ if inspect.isclass(f) else f)
    ps = list(sig.parameters.values())
    if ps and ps[0].name == "self":
        ps = ps[1:]
    return [(q.name, None, q.default is not inspect.Parameter.empty, q.default is None) for q in ps
            if q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]


def entry_points():
    """(label, kind, object) for every entry point: kind is 'function', 'class',
    'method', 'static' or 'setter'."""
    out, seen = [], set()
    modules = [("", mha, False), ("", core, True), ("optim.", mha.optim, False), ("plot.", mha.plot, False)]
    if torch is not None:
        modules.append(("torch.", mtorch, False))
    for prefix, module, private in modules:
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("__")]
        for name in sorted(names):
            if name.startswith("_") and not private:
                continue
            obj = getattr(module, name)
            if inspect.ismodule(obj) or not callable(obj) or id(obj) in seen:
                continue
            if getattr(obj, "__module__", "").split(".")[0] not in ("mha", "") and not prefix:
                continue
            if module is mha.plot and getattr(obj, "__module__", "") != "mha.plot":
                continue  # numpy and the like
            seen.add(id(obj))
            if inspect.isclass(obj):
                if hasattr(obj, "__members__"):
                    continue  # enums
                cls_label = prefix + obj.__name__ if prefix in ("torch.", "optim.") else obj.__name__
                if obj.__name__ == "Optimizer":
                    cls_label = "optim.Optimizer"
                if "No constructor defined" not in (obj.__init__.__doc__ or "") and obj.__name__ != "Optimizer":
                    out.append((cls_label, "class", obj))
                for klass in obj.__mro__:
                    if not getattr(klass, "__module__", "").startswith("mha"):
                        continue
                    # A private base (mha.torch's _SharedModule) is walked as part of each public class
                    # that has it: their messages name the public class.
                    private_base = klass.__name__.startswith("_")
                    owner = cls_label if klass is obj or private_base else \
                        cls_label.rsplit(".", 1)[0] + "." + klass.__name__ if "." in cls_label else klass.__name__
                    for attr, member in sorted(vars(klass).items()):
                        if attr.startswith("__") and attr != "__call__":
                            continue
                        if attr.startswith("_pybind11_"):
                            continue  # pybind11's own (its ABI conduit), not mha's
                        if id(member) in seen and not private_base:
                            continue  # inherited: walked with the class that defines it
                        seen.add(id(member))
                        if inspect.isclass(member):
                            continue  # nested enums (Mask.Kind)
                        if isinstance(member, property):
                            if member.fset is not None:
                                out.append((f"{owner}.{attr} =", "setter", member))
                        elif isinstance(member, staticmethod):
                            out.append((f"{owner}.{attr}", "static", getattr(obj, attr)))
                        elif callable(member):
                            if torch is not None and isinstance(obj, type) and issubclass(obj, torch.nn.Module) \
                                    and attr.startswith("_"):
                                continue  # torch.nn.Module plumbing
                            out.append((f"{owner}.{attr}", "method", member))
            else:
                out.append((prefix + name if prefix in ("optim.", "plot.", "torch.") else name, "function", obj))
    return out


def poisoned_args(label, kind, obj):
    """[(argument, type)] that the walk poisons in this entry point."""
    if label in NO_NUMBERS:
        return []
    params = params_of(label, obj, kind == "method")
    skip = NOT_NUMERIC.get(label, set())
    out = []
    for name, typ, has_default, none_default in params:
        if name in skip:
            continue
        if typ is not None and (typ in ("str", "os.PathLike") or typ.startswith(("mha._core.", "Optional[mha._core.", "Dict[str, str]",
                                                                               "List[str]"))):
            continue  # names, paths, enums, modules: not numbers
        out.append((name, typ, none_default))
    return out


# ---- calls --------------------------------------------------------------------

def value(v):
    return v() if callable(v) and not isinstance(v, type) else v


def instance_for(label):
    cls_label = label.rsplit(".", 1)[0] if not label.endswith(" =") else label[:-2].rsplit(".", 1)[0]
    make = INSTANCES.get(cls_label)
    if make is None and cls_label == "optim.Optimizer":
        make = INSTANCES["optim.SGD"]
    return make() if make else None


def call(label, kind, obj, kwargs):
    if kind == "setter":
        (v,) = kwargs.values()
        setattr(instance_for(label), label[:-2].rsplit(".", 1)[1], v)
        return
    if kind == "method":
        target = getattr(instance_for(label), label.rsplit(".", 1)[1])
        return target(**kwargs)
    return obj(**kwargs)


def poisons(label, arg, good, none_default):
    """(description, value) pairs for one argument."""
    skip = NOT_POISONS.get((label, arg), set())
    if none_default or (label, arg) in NONE_OK:
        skip = skip | {"None"}
    out = [(name, bad) for name, bad in BAD.items() if name not in skip]
    good = value(good)
    if isinstance(good, dict) and good:
        key = next(iter(good))
        for name in ("str", "object", "None", "str_array", "object_array"):
            out.append((f"{arg}[{key!r}] {name}", {**good, key: BAD[name]}))
    if isinstance(good, list) and good and isinstance(good[0], dict):
        key = ENTRY_KEYS.get(label, next(iter(good[0])))
        for name in ("str", "object", "None", "str_array"):
            out.append((f"{arg}[0][{key!r}] {name}", [{**good[0], key: BAD[name]}]))
    return out


def cases():
    """Every (label, kind, obj, argument, poison name, poison value, kwargs builder)."""
    out = []
    for label, kind, obj in entry_points():
        for arg, typ, none_default in poisoned_args(label, kind, obj):
            good = GOOD.get(label, {})
            for pname, bad in poisons(label, arg, good.get(arg), none_default):
                out.append((label, kind, obj, arg, pname, bad))
    return out


def int_cases():
    """Every (label, kind, obj, argument, poison name, poison value) of the --ints
    walk: each argument whose valid value is an int (not a bool) given each
    INT_POISONS value."""
    out = []
    for label, kind, obj in entry_points():
        for arg, good in GOOD.get(label, {}).items():
            if isinstance(good, int) and not isinstance(good, bool):
                for pname, bad in INT_POISONS.items():
                    out.append((label, kind, obj, arg, pname, bad))
    return out


def run(first, all_cases=None):
    all_cases = cases() if all_cases is None else all_cases
    limit, threads = mha.memory_limit(), mha.get_num_threads()
    for i, (label, kind, obj, arg, pname, bad) in enumerate(all_cases):
        if i < first:
            continue
        mha.set_memory_limit(limit)  # what an earlier call of set_memory_limit / set_num_threads set
        mha.set_num_threads(threads)
        print(f"START {i} {label} {arg} {pname}", flush=True)
        good = {k: value(v) for k, v in GOOD.get(label, {}).items()}
        good[arg] = bad
        result = {"index": i, "label": label, "arg": arg, "poison": pname, "op": OPS.get(label, label)}
        try:
            call(label, kind, obj, good)
            result["outcome"] = "accepted"
        except BaseException as e:  # noqa: BLE001 - the outcome is what is tested
            result["outcome"] = "raised"
            result["type"] = type(e).__name__
            result["mro"] = [c.__name__ for c in type(e).__mro__]
            result["message"] = str(e)[:2000]
        print("RESULT " + json.dumps(result), flush=True)
    print(f"DONE {len(all_cases)}", flush=True)


def listing():
    for label, kind, obj in entry_points():
        print(json.dumps({"label": label, "kind": kind, "has_good": label in GOOD,
                          "poisoned": [a for a, _, _ in poisoned_args(label, kind, obj)],
                          "no_numbers": label in NO_NUMBERS}))


if __name__ == "__main__":
    if sys.argv[1] == "--list":
        listing()
    elif sys.argv[1] == "--ints":
        run(int(sys.argv[2]), int_cases())
    else:
        run(int(sys.argv[1]))
