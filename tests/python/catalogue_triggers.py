"""Triggers of docs/errors.md's rows for training, the PyTorch drop-in,
pictures, head_offsets and `mha viz` / `mha train`, used by
test_error_catalogue.py (which holds the older rows' triggers and walks the
catalogue). PY maps a row id to a function of a temporary folder that must
raise the row's ValueError; CLI maps a row id to a function of a temporary
folder returning the `mha` tool's arguments, which must fail with the row's
message."""
import atexit
import functools
import math
import os
import pathlib
import shutil
import subprocess
import tempfile

import numpy as np

import mha

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
BUILD = pathlib.Path(os.environ.get("MHA_BUILD", ROOT / "build"))


def ones(*shape):
    return np.ones(shape, np.float32)


def _pruned_after_call():
    m = mha.MultiHeadAttention(8, 2)
    m(ones(1, 2, 4), ones(1, 2, 4), ones(1, 2, 4))
    m.prune_heads([0])
    return m


def _torch_module(embed_dim, num_heads):
    import mha.torch
    return mha.torch.MultiheadAttention(embed_dim, num_heads)


def _torch_chapter_module_with_rotary(rotary):
    import mha.torch
    return mha.torch.MultiHeadAttention(16, 2, 0.0, rotary=rotary)


def _torch_alibi_grad():
    import torch
    x = torch.ones(1, 3, 8)
    _torch_module(8, 2)(x, x, x, alibi_slopes=torch.ones(2, requires_grad=True))


def _torch_module_with_precision(precision):
    import mha.torch
    return mha.torch.MultiheadAttention(16, 2, precision=precision)


# ---- checkpoints ------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def base_checkpoint():
    """A real checkpoint of `mha train` (untrained: 0 steps), made once."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="mha_catalogue_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "base.safetensors"
    r = subprocess.run([str(BUILD / "mha"), "train", "--steps", "0", "--eval-size", "4", "--hiddens", "8",
                        "--heads", "2", "--out", str(path), "--curves", "", "--plot", ""],
                       capture_output=True, text=True, cwd=folder, timeout=120)
    assert r.returncode == 0, r.stderr
    return path


def checkpoint_with(tmp, key, value):
    """base_checkpoint() with metadata `key` set to `value` (removed if None)."""
    meta = mha.safetensors_metadata(str(base_checkpoint()))
    if value is None:
        del meta[key]
    else:
        meta[key] = value
    path = tmp / f"ck_{key}.safetensors"
    mha.save_safetensors(str(path), mha.load_safetensors(str(base_checkpoint())), meta)
    return str(path)


CHECKPOINT_CHANGES = {  # row id -> (metadata key, value)
    "ck.format": ("format", "mha-checkpoint-0"),
    "ck.task": ("task.name", "copy"),
    "ck.missing": ("model.num_heads", None),
    "ck.integer": ("model.num_heads", "four"),
    "ck.unsigned": ("train.seed", "-1"),
    "ck.number": ("optim.lr", "fast"),
    "ck.boolean": ("model.bias", "yes"),
    "ck.positions": ("model.positions", "rotary"),
    "ck.optimizer": ("optim.name", "lion"),
    "ck.step": ("train.step", "-1"),
}


# ---- Python -----------------------------------------------------------------

def small_model(**kw):
    args = dict(vocab_size=9, num_classes=4, max_len=8, num_hiddens=8, num_heads=2)
    args.update(kw)
    return mha.AttentionModel(**args)


TOKENS = np.array([[1, 2, 3], [4, 5, 6]], np.int32)


def model_backward_shape(t):
    m = small_model()
    m(TOKENS)
    m.backward(ones(2, 3, 5))


def model_state(t, change):
    m = small_model(positions=mha.Positions.SINUSOIDAL) if "positions.weight" in change else small_model()
    s = m.state_dict()
    for k, v in change.items():
        if v is None:
            del s[k]
        else:
            s[k] = v
    m.load_state_dict(s)


def initialized(D=8, H=2, width=4):
    m = mha.MultiHeadAttention(D, H)
    m.initialize(width, width, width)
    return m


def mha_reinit(t):
    m = initialized()
    m.initialize(4, 5, 4)


def mha_backward_after_eval(t):
    m = mha.MultiHeadAttention(8, 2).eval()
    m(ones(2, 3, 4), ones(2, 5, 4), ones(2, 5, 4))
    m.backward(ones(2, 3, 8))


def context_owner(t):
    X = ones(2, 3, 8)
    _, ctx = mha.MultiHeadAttention(8, 2).forward_with_context(X, X, X)
    mha.MultiHeadAttention(8, 2).backward(ctx, X)


def context_eval(t):
    X = ones(2, 3, 8)
    m = mha.MultiHeadAttention(8, 2).eval()
    _, ctx = m.forward_with_context(X, X, X)
    m.backward(ctx, X)


def context_heads(t):
    X = ones(2, 3, 8)
    m = mha.MultiHeadAttention(8, 2)
    _, ctx = m.forward_with_context(X, X, X)
    m.prune_heads([0])
    m.backward(ctx, X)


def mha_backward_shape(t):
    m = mha.MultiHeadAttention(8, 2)
    m(ones(2, 3, 4), ones(2, 5, 4), ones(2, 5, 4))
    m.backward(ones(2, 5, 8))


def torch_state(**change):
    """nn.MultiheadAttention(4, 2, bias=True)'s state dict; None removes an entry."""
    s = {"in_proj_weight": ones(12, 4), "in_proj_bias": ones(12), "out_proj.weight": ones(4, 4),
         "out_proj.bias": ones(4)}
    for k, v in change.items():
        k = k.replace("__", ".")
        if v is None:
            s.pop(k, None)
        else:
            s[k] = v
    return s


def separate_state(**change):
    """The same with q/k/v_proj_weight (kdim 5, vdim 3) instead of in_proj_weight."""
    separate = dict(in_proj_weight=None, q_proj_weight=ones(4, 4), k_proj_weight=ones(4, 5),
                    v_proj_weight=ones(4, 3))
    return torch_state(**{**separate, **change})


def tmha(state=None, heads=2, **options):
    options.setdefault("batch_first", True)  # the rows' inputs are (B, L, E)
    return mha.TorchMultiheadAttention.from_state_dict(state if state is not None else torch_state(), heads, **options)


Q, KV = ones(2, 3, 4), ones(2, 6, 4)


def tmha_call(q=Q, k=KV, v=KV, **kw):
    tmha()(q, k, v, **kw)


def tmha_dropout_mask(t):
    m = tmha().eval()
    m(Q, KV, KV)
    m.last_dropout_mask


def tmha_backward_shape(t):
    m = tmha()
    m(Q, KV, KV)
    m.backward(ones(3, 2, 4))


def infinite_weights():
    w = ones(1, 2, 2, 2)
    w[0, 1, 0, 1] = -np.inf
    return w


def nan_weights():
    w = np.full((1, 1, 3, 3), 1 / 3, np.float32)
    w[0, 0, 1, 0] = np.nan
    return w


def thirds(*shape):
    return np.full(shape, 1 / shape[-1], np.float32)


def set_lr(t):
    opt = mha.optim.SGD(initialized(), lr=0.1)
    opt.lr = -0.5


def not_a_png(t):
    (t / "picture.gif").write_bytes(b"GIF8")
    mha.read_png(str(t / "picture.gif"))



def _cached_call_with_lens():
    m = mha.MultiHeadAttention(16, 2).eval()
    x = ones(2, 1, 16)
    m(x, x, x, np.ones((2, 1, 1)), cache=m.kv_cache(2, 4))


def _cached_call_with_short_mask():
    m = mha.TorchMultiheadAttention.from_state_dict(
        {"in_proj_weight": ones(12, 4), "out_proj.weight": ones(4, 4)}, num_heads=2, batch_first=True)
    m.eval()
    c = m.kv_cache(1, 4)
    x = ones(1, 2, 4)
    m(x, x, x, cache=c)
    m(x[:, :1], x[:, :1], x[:, :1], np.zeros((1, 2), bool), cache=c)


PY = {
    # MultiHeadAttention: backward and gradients
    "mha.initialize": lambda t: mha.MultiHeadAttention(8, 2).initialize(4, 0, 4),
    "mha.initialize_width": mha_reinit,
    "mha.set_grads_name": lambda t: initialized().set_grads({"W_x.weight": ones(8, 4)}),
    "mha.set_grads_shape": lambda t: initialized().set_grads({"W_q.weight": ones(4, 8)}),
    "mha.dropout_mask": lambda t: mha.MultiHeadAttention(8, 2).last_dropout_mask,
    "mha.backward_no_forward": mha_backward_after_eval,
    "context.owner": context_owner,
    "context.eval": context_eval,
    "context.heads": context_heads,
    "mha.backward_shape": mha_backward_shape,
    # masks
    "mask.additive": lambda t: mha.Mask.additive(np.array([0, np.nan], np.float32)),
    "mask.to_torch": lambda t: mha.mask_to_torch_mha(mha.Mask.additive(ones(2, 6))),
    # TorchMultiheadAttention
    "tmha.unexpected": lambda t: tmha(torch_state(**{"in_proj.weight": ones(12, 4)})),
    "tmha.missing_out": lambda t: tmha(torch_state(out_proj__weight=None)),
    "tmha.out_shape": lambda t: tmha(torch_state(out_proj__weight=ones(4, 3))),
    "tmha.num_heads": lambda t: tmha(heads=0),
    "tmha.divide": lambda t: tmha(heads=3),
    "tmha.kv_heads": lambda t: tmha(num_kv_heads=3),
    "tmha.dropout": lambda t: tmha(dropout=1.5),
    "tmha.both": lambda t: tmha(torch_state(q_proj_weight=ones(4, 4))),
    "tmha.no_in_proj": lambda t: tmha(torch_state(in_proj_weight=None)),
    "tmha.missing_proj": lambda t: tmha(separate_state(v_proj_weight=None)),
    "tmha.in_proj_shape": lambda t: tmha(torch_state(in_proj_weight=ones(12, 5))),
    "tmha.in_proj_shape_kv": lambda t: tmha(num_kv_heads=1),
    "tmha.q_proj_shape": lambda t: tmha(separate_state(q_proj_weight=ones(4, 5))),
    "tmha.k_proj_shape": lambda t: tmha(separate_state(k_proj_weight=ones(3, 5))),
    "tmha.v_proj_shape": lambda t: tmha(separate_state(v_proj_weight=ones(4))),
    "tmha.kdim": lambda t: tmha(separate_state(), kdim=4),
    "tmha.vdim": lambda t: tmha(separate_state(), vdim=4),
    "tmha.bias_pair": lambda t: tmha(torch_state(out_proj__bias=None)),
    "tmha.bias_shape": lambda t: tmha(torch_state(out_proj__bias=ones(3))),
    "tmha.bias_kv_pair": lambda t: tmha(torch_state(bias_k=ones(1, 1, 4))),
    "tmha.query_rank": lambda t: tmha_call(ones(4), ones(4), ones(4)),
    "tmha.rank": lambda t: tmha_call(k=ones(6, 4)),
    "tmha.query_width": lambda t: tmha_call(q=ones(2, 3, 5)),
    "tmha.key_width": lambda t: tmha_call(k=ones(2, 6, 5)),
    "tmha.value_width": lambda t: tmha_call(v=ones(2, 6, 3)),
    "tmha.batch": lambda t: tmha_call(k=ones(1, 6, 4), v=ones(1, 6, 4)),
    "tmha.positions": lambda t: tmha_call(v=ones(2, 5, 4)),
    "tmha.no_keys": lambda t: tmha_call(k=ones(2, 0, 4), v=ones(2, 0, 4)),
    "tmha.attn_mask_rank": lambda t: tmha_call(attn_mask=np.zeros(6, np.float32)),
    "tmha.mask_shape": lambda t: tmha_call(key_padding_mask=np.zeros((2, 5), bool)),
    "tmha.dropout_mask": tmha_dropout_mask,
    "tmha.backward_no_forward": lambda t: tmha().backward(Q),
    "tmha.backward_shape": tmha_backward_shape,
    "py.torch_array": lambda t: tmha_call(q=[[1, 2], [3]]),
    "py.mask_array": lambda t: tmha_call(key_padding_mask=[[True], [True, False]]),
    "py.mask_dtype": lambda t: tmha_call(key_padding_mask=np.zeros((2, 6), np.int32)),
    "py.is_causal": lambda t: tmha_call(is_causal="yes"),
    "py.window": lambda t: tmha_call(window="wide"),
    "tmha.window": lambda t: tmha_call(window=(-2, 0)),
    "scores.softcap": lambda t: tmha_call(softcap=-1.0),
    "scores.alibi_count": lambda t: tmha_call(alibi_slopes=[0.5]),
    "scores.alibi_finite": lambda t: tmha_call(alibi_slopes=[0.5, float("inf")]),
    "scores.sinks_count": lambda t: tmha_call(sinks=[0.5]),
    "scores.sinks_finite": lambda t: tmha_call(sinks=[0.5, float("inf")]),
    "scores.alibi_appended": lambda t: tmha(torch_state(bias_k=ones(1, 1, 4), bias_v=ones(1, 1, 4)))(
        Q, KV, KV, alibi_slopes=[0.1, 0.2]),
    "py.softcap": lambda t: tmha_call(softcap="2"),
    "py.alibi_rank": lambda t: tmha_call(alibi_slopes=[[0.5, 0.5]]),
    "py.sinks_rank": lambda t: tmha_call(sinks=[[0.5, 0.5]]),
    # AttentionModel, cross_entropy, OffsetPairTask
    "model.vocab_size": lambda t: small_model(vocab_size=0),
    "model.num_classes": lambda t: small_model(num_classes=-1),
    "model.max_len": lambda t: small_model(max_len=0),
    "model.num_layers": lambda t: small_model(num_layers=0),
    "model.empty": lambda t: small_model()(np.zeros((0, 3), np.int32)),
    "model.too_long": lambda t: small_model()(np.ones((2, 9), np.int32)),
    "model.token_id": lambda t: small_model()(np.array([[1, 2, 9], [4, 5, 6]], np.int32)),
    "model.lens": lambda t: small_model()(TOKENS, np.array([3])),
    "model.backward_no_forward": lambda t: small_model().backward(ones(2, 3, 4)),
    "model.backward_shape": model_backward_shape,
    "model.unexpected": lambda t: model_state(t, {"positions.weight": ones(8, 8)}),
    "model.missing": lambda t: model_state(t, {"readout.bias": None}),
    "model.state_shape": lambda t: model_state(t, {"embedding.weight": ones(8, 8)}),
    "py.tokens_rank": lambda t: small_model()(np.array([1, 2, 3], np.int32)),
    "loss.classes": lambda t: mha.cross_entropy(ones(2, 0), np.zeros(0, np.int32)),
    "loss.count": lambda t: mha.cross_entropy(ones(2, 3, 5), np.array([1, 2, 3], np.int32)),
    "loss.target": lambda t: mha.cross_entropy(ones(2, 5), np.array([1, 7], np.int32)),
    "task.vocab": lambda t: mha.OffsetPairTask(vocab=1),
    "task.near": lambda t: mha.OffsetPairTask(near=0),
    "task.far": lambda t: mha.OffsetPairTask(near=3, far=3),
    "task.min_len": lambda t: mha.OffsetPairTask(far=10, min_len=10),
    "task.max_len": lambda t: mha.OffsetPairTask(min_len=12, max_len=11),
    "task.batch": lambda t: mha.OffsetPairTask().sample(0, 0),
    # optimisers
    "optim.empty": lambda t: mha.optim.SGD(mha.MultiHeadAttention(8, 2), lr=0.1),
    "optim.negative": lambda t: mha.optim.Adam(initialized(), eps=-1),
    "optim.set_lr": set_lr,
    "optim.dampening": lambda t: mha.optim.SGD(initialized(), lr=0.1, dampening=math.nan),
    "optim.nesterov": lambda t: mha.optim.SGD(initialized(), lr=0.1, momentum=0.9, dampening=0.1, nesterov=True),
    "optim.beta1": lambda t: mha.optim.AdamW(initialized(), betas=(1.0, 0.999)),
    "optim.beta2": lambda t: mha.optim.Adam(initialized(), betas=(0.9, -0.1)),
    "optim.norm_type": lambda t: mha.optim.clip_grad_norm(initialized(), 1.0, norm_type=1.0),
    "optim.max_norm": lambda t: mha.optim.clip_grad_norm(initialized(), -1.0),
    "py.optim_module": lambda t: mha.optim.SGD(object(), lr=0.1),
    # pictures
    "heatmap.empty": lambda t: mha.show_heatmaps(ones(1, 2, 0, 4)),
    "heatmap.infinite": lambda t: mha.show_heatmaps(infinite_weights()),
    "heatmap.row_labels": lambda t: mha.show_heatmaps(ones(2, 2, 3, 3), row_labels=["a"]),
    "heatmap.max_cells": lambda t: mha.show_heatmaps(ones(1, 1, 3, 3), max_cells=0),
    "heatmap.panel_size": lambda t: mha.show_heatmaps(ones(1, 1, 3, 3), panel_size=-1),
    "heatmap.panel_size_max": lambda t: mha.show_heatmaps(ones(1, 1, 3, 3), panel_size=10**6),
    "heatmap.limits": lambda t: mha.show_heatmaps(ones(1, 1, 3, 3), vmin=-np.inf),
    "heatmap.order": lambda t: mha.show_heatmaps(ones(1, 1, 3, 3), vmin=1, vmax=0.5),
    "heatmap.size": lambda t: mha.show_heatmaps(ones(1, 500, 1, 1)),
    "png.image": lambda t: mha.write_png(str(t / "o.png"), np.zeros((0, 4, 4), np.uint8)),
    "png.read": not_a_png,
    "py.image_shape": lambda t: mha.write_png(str(t / "o.png"), np.zeros((2, 2), np.uint8)),
    "py.heatmap_rank": lambda t: mha.show_heatmaps(ones(2, 3)),
    "py.heatmap_mask_dtype": lambda t: mha.show_heatmaps(ones(1, 1, 2, 2), mask=np.zeros(2, np.int64)),
    "py.heatmap_mask_shape": lambda t: mha.show_heatmaps(ones(1, 1, 2, 2), mask=np.zeros(3, bool)),
    "py.heatmap_titles": lambda t: mha.show_heatmaps(ones(2, 2, 3, 3), titles=["a", "b", "c"]),
    # head_offsets
    "offsets.rank": lambda t: mha.head_offsets(thirds(2, 3, 3)),
    "offsets.empty": lambda t: mha.head_offsets(thirds(1, 0, 3, 3)),
    "offsets.lens": lambda t: mha.head_offsets(thirds(2, 1, 3, 3), np.array([3, 3, 3])),
    "offsets.first_query": lambda t: mha.head_offsets(thirds(1, 1, 4, 4), first_query=4),
    "offsets.nonfinite": lambda t: mha.head_offsets(nan_weights()),
    "offsets.no_pair": lambda t: mha.head_offsets(thirds(1, 1, 3, 3), np.array([0])),
    "py.heatmap_cmap": lambda t: mha.show_heatmaps(ones(1, 1, 2, 2), cmap="Redz"),
    "py.heatmap_figsize": lambda t: mha.show_heatmaps(ones(1, 1, 2, 2), figsize=("big",)),
    "py.heatmap_figsize_sign": lambda t: mha.show_heatmaps(ones(1, 1, 2, 2), figsize=(0, 1)),
    "torch.device": lambda t: _torch_call("device"),
    "torch.device_arg": lambda t: _torch_call("device_arg"),
    "torch.rank": lambda t: _torch_call("rank"),
    "torch.alibi_grad": lambda t: _torch_alibi_grad(),
    "torch.cache_grad": lambda t: _torch_call("cache_grad"),
    "torch.cache_attn_mask": lambda t: _torch_call("cache_attn_mask"),
    "torch_mha.set_dropout": lambda t: _torch_call("dropout"),
    "torch.call_heads": lambda t: _torch_call("replaced_w_q"),
    "torch.mha_forward_embed": lambda t: _torch_call("mha_forward_embed"),
    "torch.mha_forward_separate": lambda t: _torch_call("mha_forward_separate"),
    "torch.mha_forward_in_proj": lambda t: _torch_call("mha_forward_in_proj"),
    "torch.mha_forward_bias_kv": lambda t: _torch_call("mha_forward_bias_kv"),
    "torch.replace_self": lambda t: _torch_call("replace_self"),
    "torch.head_mask": lambda t: _torch_call("head_mask"),
    "torch.head_gates": lambda t: _torch_call("head_gates"),
    "torch.importance_method": lambda t: _torch_call("importance_method"),
    "sdpa.dropout": lambda t: _sdpa_call("dropout"),
    "sdpa.rank": lambda t: _sdpa_call("rank"),
    "sdpa.widths": lambda t: _sdpa_call("widths"),
    "sdpa.value_lead": lambda t: _sdpa_call("value_lead"),
    "sdpa.lead": lambda t: _sdpa_call("lead"),
    "sdpa.mask_causal": lambda t: _sdpa_call("mask_causal"),
    "sdpa.mask_shape": lambda t: _sdpa_call("mask_shape"),
    "sdpa.sinks": lambda t: _sdpa_call("sinks"),
    "attention.dropout": lambda t: _attention_call("dropout"),
    "attention.rank": lambda t: _attention_call("rank"),
    "attention.max_seqlen_alone": lambda t: _attention_call("max_seqlen_alone"),
    "attention.widths": lambda t: _attention_call("widths"),
    "attention.heads": lambda t: _attention_call("heads"),
    "attention.window": lambda t: _attention_call("window"),
    "attention.scale": lambda t: _attention_call("scale"),
    "attention.softcap": lambda t: _attention_call("softcap"),
    "attention.per_head": lambda t: _attention_call("per_head"),
    "attention.not_finite": lambda t: _attention_call("not_finite"),
    "attention.cu_seqlens_shape": lambda t: _attention_call("cu_seqlens_shape"),
    "attention.cu_seqlens": lambda t: _attention_call("cu_seqlens"),
    "attention.max_seqlen": lambda t: _attention_call("max_seqlen"),
    "attention.max_seqlen_huge": lambda t: _attention_call("max_seqlen_huge"),
    "attention.max_seqlen_negative": lambda t: _attention_call("max_seqlen_negative"),
    "torch.mask_dtype": lambda t: _numerics_call("mask_dtype"),
    "torch.kpm_lengths": lambda t: _kpm_lengths(),
    "torch.pruned_slopes": lambda t: _pruned_slopes(),
    "numerics.overflow": lambda t: _numerics_call("overflow"),
    "numerics.mask": lambda t: _numerics_call("mask"),
    "numerics.float32": lambda t: _numerics_call("float32"),
    "numerics.sdpa_scale": lambda t: _numerics_call("sdpa_scale"),
    "tensor_cache.sizes": lambda t: _tensor_cache("sizes"),
    "tensor_cache.dtype": lambda t: _tensor_cache("dtype"),
    "tensor_cache.memory": lambda t: _tensor_cache("memory"),
    "tensor_cache.module": lambda t: _tensor_cache("module"),
    "kv_cache_call.seqlens": lambda t: _kv_cache_call("seqlens"),
    "kv_cache_call.causal_short": lambda t: _kv_cache_call("causal_short"),
    "kv_cache_call.cache": lambda t: _kv_cache_call("cache"),
    "kv_cache_call.new_keys": lambda t: _kv_cache_call("new_keys"),
    "kv_cache_call.shapes": lambda t: _kv_cache_call("shapes"),
    "kv_cache_call.rank": lambda t: _kv_cache_call("rank"),
    "kv_cache_call.seqlens_shape": lambda t: _kv_cache_call("seqlens_shape"),
    "kv_cache_call.new_shapes": lambda t: _kv_cache_call("new_shapes"),
    # key/value caches
    "kv_cache.dtype": lambda t: mha.MultiHeadAttention(16, 2).kv_cache(2, 4, dtype="float16"),
    "precision.name": lambda t: mha.MultiHeadAttention(16, 2, precision="fp16"),
    "rotary.dims": lambda t: setattr(mha.MultiHeadAttention(16, 2), "rotary", mha.Rotary(10)),
    "rotary.even": lambda t: mha.Rotary(-1),
    "rotary.kind": lambda t: setattr(mha.MultiHeadAttention(16, 2), "rotary", "yes"),
    "rotary.key": lambda t: _torch_chapter_module_with_rotary({"dim": 4}),
    "rotary.base": lambda t: mha.Rotary(8, base=1.0),
    "py.precision": lambda t: _torch_module_with_precision("fp16"),
    "kv_cache.valid_lens": lambda t: _cached_call_with_lens(),
    "kv_cache.key_padding_mask": lambda t: _cached_call_with_short_mask(),
    # integers out of range, indices, sizes (hardening round three)
    "prune.discarded_call": lambda t: _pruned_after_call().attention_weights,
    "peak.threads": lambda t: mha._core._fma_peak(0),
    "peak.seconds": lambda t: mha._core._fma_peak(1, 0.0),
    "py.int64_range": lambda t: mha.MultiHeadAttention(8, 2).eval().kv_cache(1, 4).truncate(0, 2**64),
    "py.uint64_range": lambda t: mha.set_memory_limit(-1),
    "py.int_sized": lambda t: mha._core._render_line_chart(
        [{"title": "t", "series": [("a", [0.0, 1.0], [1.0, 2.0])]}], "", 2**31, 80),
    "model.layer": lambda t: small_model().layer(3),
    "attention_file.negative_heads": lambda t: mha.load_attention(str(t / "any.safetensors"), num_heads=-1),
    "py.heatmap_dpi": lambda t: mha.show_heatmaps(ones(1, 1, 2, 2), dpi=-1),
    "plot.cell_index": lambda t: mha.plot.cell_center(mha.plot.render_heatmaps(ones(1, 1, 2, 2))[1], 5, 0, 0, 0),
    "torch.mha_positive": lambda t: _torch_module(4, -1),
    "torch.mha_divisible": lambda t: _torch_module(4, 3),
    "torch.mha_memory": lambda t: _torch_module(100000, 1),
    "torch.mha_forward_heads": lambda t: _torch_call("mha_forward_heads"),
}
for _id, (_key, _value) in CHECKPOINT_CHANGES.items():
    PY[_id] = lambda t, k=_key, v=_value: mha.load_checkpoint(checkpoint_with(t, k, v))


# ---- the command-line tool --------------------------------------------------

def train_args(t, *args):
    return ["train", "--out", str(t / "o.safetensors"), "--curves", str(t / "o.csv"),
            "--plot", str(t / "o.png"), *args]


def viz_files(t, *args):
    """`mha viz` on `mha run`'s files: 5 heads, batch 2."""
    w, i = t / "w.safetensors", t / "i.safetensors"
    s = {}
    for n in ("W_q", "W_k", "W_v", "W_o"):
        s[f"{n}.weight"] = ones(10, 10)
    mha.save_safetensors(str(w), s)
    mha.save_safetensors(str(i), {"queries": ones(2, 3, 10), "keys": ones(2, 4, 10), "values": ones(2, 4, 10)})
    return ["viz", "--weights", str(w), "--inputs", str(i), "--heads", "5", "--out", str(t / "o.png"), *args]


def viz_checkpoint(t, *args, checkpoint=None):
    return ["viz", "--checkpoint", checkpoint or str(base_checkpoint()), "--out", str(t / "o.png"), *args]


CLI = {
    "task.far": lambda t: train_args(t, "--near", "3", "--far", "3"),
    "task.min_len": lambda t: train_args(t, "--far", "10", "--min-len", "10"),
    "task.max_len": lambda t: train_args(t, "--min-len", "12", "--max-len", "11"),
    "trainer.clip": lambda t: train_args(t, "--clip", "-1"),
    "train.target": lambda t: train_args(t, "--target", "1.5"),
    "train.resume_config": lambda t: train_args(t, "--resume", str(base_checkpoint()), "--seed", "3"),
    "viz.show_heads": lambda t: viz_files(t, "--show-heads", "7"),
    "viz.rows_inputs": lambda t: viz_files(t, "--rows", "0,2"),
    "viz.layer": lambda t: viz_checkpoint(t, "--layer", "1"),
    "viz.rows_sampled": lambda t: viz_checkpoint(t, "--rows", "40"),
    "viz.panels": lambda t: viz_files(t, "--rows", ",".join(["0", "1"] * 7)),
    "viz.no_rows": lambda t: viz_files(t, "--rows", ""),
    "viz.both": lambda t: viz_checkpoint(t, "--heads", "5"),
    "viz.checkpoint_masks": lambda t: viz_checkpoint(t, "--causal", "top-left"),
    "viz.required": lambda t: [a for a in viz_files(t) if not a.endswith("i.safetensors") and a != "--inputs"],
}
for _id, (_key, _value) in CHECKPOINT_CHANGES.items():
    CLI[_id] = lambda t, k=_key, v=_value: viz_checkpoint(t, checkpoint=checkpoint_with(t, k, v))


def _sdpa_call(what):
    """The calls of the catalogue's sdpa.* rows."""
    import torch
    from mha.torch import scaled_dot_product_attention as sdpa
    q, k = torch.ones(2, 3, 4), torch.ones(2, 5, 4)
    if what == "dropout":
        sdpa(q, k, k, dropout_p=1.5)
    elif what == "rank":
        sdpa(q, k, torch.ones(5, 4))
    elif what == "widths":
        sdpa(q, torch.ones(2, 5, 3), k)
    elif what == "value_lead":
        sdpa(q, k, torch.ones(3, 5, 4))
    elif what == "lead":
        sdpa(q, torch.ones(1, 5, 4), torch.ones(1, 5, 4))
    elif what == "mask_causal":
        sdpa(q, k, k, attn_mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True)
    elif what == "mask_shape":
        sdpa(q, k, k, attn_mask=torch.ones(2, 2, dtype=torch.bool))
    elif what == "sinks":  # the Hugging Face backend's sinks (s_aux), through the same checks
        from mha.torch_sdpa import attend
        attend(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 5, 4), torch.ones(1, 2, 5, 4), sinks=torch.zeros(3))


def _attention_call(what):
    """The calls of the catalogue's attention.* rows (mha.torch.attention)."""
    import torch
    from mha.torch import attention
    q = torch.ones(1, 3, 2, 4)
    packed = torch.ones(5, 2, 4)
    cu = lambda *o: torch.tensor(o, dtype=torch.int32)  # noqa: E731
    calls = {
        "dropout": lambda: attention(q, q, q, dropout_p=1.5),
        "rank": lambda: attention(torch.ones(3, 2, 4), torch.ones(3, 2, 4), torch.ones(3, 2, 4)),
        "max_seqlen_alone": lambda: attention(q, q, q, max_seqlen=3),
        "widths": lambda: attention(q, torch.ones(1, 3, 2, 5), q),
        "heads": lambda: attention(torch.ones(1, 3, 3, 4), q, q),
        "window": lambda: attention(q, q, q, window=(-2, 0)),
        "scale": lambda: attention(q, q, q, scale=0.0),
        "softcap": lambda: attention(q, q, q, softcap=-1.0),
        "per_head": lambda: attention(q, q, q, alibi_slopes=torch.ones(3)),
        "not_finite": lambda: attention(q, q, q, sinks=torch.tensor([0.0, float("nan")])),
        "cu_seqlens_shape": lambda: attention(packed, packed, packed, cu_seqlens=cu(5)),
        "cu_seqlens": lambda: attention(packed, packed, packed, cu_seqlens=cu(0, 2, 4)),
        "max_seqlen": lambda: attention(packed, packed, packed, cu_seqlens=cu(0, 3, 5), max_seqlen=2),
        "max_seqlen_huge": lambda: attention(packed, packed, packed, cu_seqlens=cu(0, 3, 5), max_seqlen=2**31),
        "max_seqlen_negative": lambda: attention(packed, packed, packed, cu_seqlens=cu(0, 3, 5), max_seqlen=-1),
    }
    calls[what]()


def _numerics_call(what):
    """The calls of the catalogue's numerics.* rows (the mha.torch functions at float32's edges)."""
    import torch
    from mha.torch import MultiheadAttention, attention, scaled_dot_product_attention as sdpa
    q = torch.ones(1, 3, 2, 4)
    mask = torch.zeros(3, 3)
    mask[0, 1] = float("nan")
    calls = {
        "overflow": lambda: attention(q * 1e20, q * 1e20, q),
        "mask": lambda: sdpa(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), attn_mask=mask),
        "float32": lambda: attention(q, q, q, softcap=1e-46),
        "sdpa_scale": lambda: sdpa(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), scale=float("nan")),
        "mask_dtype": lambda: MultiheadAttention(4, 2, batch_first=True)(
            q[0], q[0], q[0], key_padding_mask=torch.zeros(3, 3, dtype=torch.int32)),
    }
    calls[what]()


def _tensor_cache(what):
    """The calls of the catalogue's tensor_cache.* rows (mha.torch.TensorKVCache)."""
    import torch
    import mha.torch as mt
    m = mt.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.ones(2, 1, 16)
    calls = {
        "sizes": lambda: mt.TensorKVCache(0, 4, 2, 4),
        "memory": lambda: mt.TensorKVCache(2**40, 4, 2, 4),
        "dtype": lambda: mt.TensorKVCache(1, 4, 2, 4, dtype=torch.float16),
        "module": lambda: m(x, x, x, cache=mt.TensorKVCache(2, 4, 2, 4)),
    }
    with torch.no_grad():
        calls[what]()


def _kv_cache_call(what):
    """The calls of the catalogue's kv_cache_call.* rows (mha.torch.attention_with_kv_cache)."""
    import torch
    from mha.torch import attention_with_kv_cache as call
    q, cache, new = torch.ones(2, 1, 4, 8), torch.zeros(2, 6, 2, 8), torch.ones(2, 1, 2, 8)
    calls = {
        "seqlens": lambda: call(q, cache, cache.clone(), new, new, cache_seqlens=torch.tensor([2, 6])),
        "causal_short": lambda: call(torch.ones(2, 3, 4, 8), cache, cache.clone(), new, new, causal=True,
                                     cache_seqlens=torch.tensor([0, 1])),
        "cache": lambda: call(q, torch.zeros(2, 2, 6, 8).transpose(1, 2), cache, cache_seqlens=1),
        "new_keys": lambda: call(q, cache, cache.clone(), new, None, cache_seqlens=1),
        "shapes": lambda: call(q, torch.zeros(2, 6, 2, 4), cache, cache_seqlens=1),
        "rank": lambda: call(q, torch.zeros(2, 6, 16), cache, cache_seqlens=1),
        "seqlens_shape": lambda: call(q, cache, cache.clone(), cache_seqlens=torch.tensor([1])),
        "new_shapes": lambda: call(q, cache, cache.clone(), torch.ones(2, 1, 1, 8), new, cache_seqlens=1),
    }
    with torch.no_grad():
        calls[what]()


def _torch_call(what):
    """The mha.torch calls of the catalogue's torch.* rows."""
    import torch
    import mha.torch as mt
    x = torch.ones(2, 3, 4)
    if what == "device":
        mt.MultiHeadAttention(8, 2, 0.0)(x, torch.empty(2, 3, 4, device="meta"), x)
    elif what.startswith("mha_forward_"):
        q = torch.ones(3, 2, 8)
        args = dict(embed_dim_to_check=8, num_heads=2, in_proj_weight=torch.ones(24, 8), in_proj_bias=None,
                    bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
                    out_proj_weight=torch.ones(8, 8), out_proj_bias=None)
        if what == "mha_forward_embed":
            args["embed_dim_to_check"] = 16
        elif what == "mha_forward_separate":
            args["use_separate_proj_weight"] = True
        elif what == "mha_forward_in_proj":
            args["in_proj_weight"] = None
        elif what == "mha_forward_heads":
            args["num_heads"] = 16
        else:
            args["bias_k"] = torch.ones(1, 1, 8)
        mt.multi_head_attention_forward(q, q, q, **args)
    elif what == "head_mask":
        x8 = torch.ones(3, 2, 8)
        mt.MultiheadAttention(8, 2)(x8, x8, x8, head_mask=torch.ones(3))
    elif what == "head_gates":
        mt.MultiheadAttention(8, 2).head_gates = torch.ones(3)
    elif what == "importance_method":
        m = mt.MultiheadAttention(8, 2)
        mt.head_importance(m, lambda: m(x, x, x)[0].sum(), method="grad")
    elif what == "replace_self":
        mt.replace_attention(torch.nn.MultiheadAttention(8, 2))
    elif what == "replaced_w_q":
        m = mt.MultiHeadAttention(8, 2, 0.0)
        m(x, x, x)
        m.W_q = torch.nn.Linear(4, 9, bias=False)
        m(x, x, x)
    elif what == "device_arg":
        mt.MultiheadAttention(8, 2, device="cuda")
    elif what == "rank":
        mt.MultiHeadAttention(8, 2, 0.0)(x, x, x[0])
    elif what == "cache_grad":
        m = mt.MultiHeadAttention(8, 2, 0.0).eval()
        m(x, x, x, cache=m.kv_cache(2, 4))
    elif what == "cache_attn_mask":
        m = mt.MultiheadAttention(4, 2, batch_first=True).eval()
        with torch.no_grad():
            m(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.bool), cache=m.kv_cache(2, 4))
    else:
        mt.MultiheadAttention(4, 2, dropout=2.0, batch_first=True)(x, x, x)


# ---- round two of hardening: conversions, sizes, overflow, outputs ----------

def called_mha():
    m = mha.MultiHeadAttention(8, 2)
    m(ones(2, 3, 4), ones(2, 3, 4), ones(2, 3, 4))
    return m


def with_limit(f):
    """f() under a 1 GiB memory limit (the tests' fixture restores the default)."""
    mha.set_memory_limit(1 << 30)
    return f()


def symlink_out(t):
    (t / "target.safetensors").write_bytes(b"")
    os.symlink(t / "target.safetensors", t / "link.safetensors")
    return str(t / "link.safetensors")


def tmha_module():
    s = {"in_proj_weight": ones(12, 4), "out_proj.weight": ones(4, 4)}
    return mha.TorchMultiheadAttention.from_state_dict(s, num_heads=2, batch_first=True)


TMHA_STATE = {"in_proj_weight": ones(12, 4), "out_proj.weight": ones(4, 4)}
HUGE = np.full((2, 4, 2), 1e20, np.float32)

PY.update({
    "mha.memory_limit": lambda t: with_limit(lambda: mha.MultiHeadAttention(2**31, 2**31)),
    "forward.overflow_values": lambda t: mha.MultiHeadAttention(100, 5)(*[np.full((2, 4, 100), 1e20, np.float32)] * 3),
    "dpa.no_call": lambda t: mha.DotProductAttention().attention_weights,
    "py.dtype": lambda t: mha.MultiHeadAttention(100, 5)(np.ones((2, 4, 100), complex), ones(2, 6, 100), ones(2, 6, 100)),
    "py.int_range": lambda t: small_model()(np.array([[0, 2**32 + 1]])),
    "py.int_fraction": lambda t: small_model()(np.array([[1.5, 2.0]])),
    "py.int_list": lambda t: mha.MultiHeadAttention(12, 4).prune_heads("ab"),
    "prune.grouped": lambda t: mha.TorchMultiheadAttention.from_state_dict(
        {"in_proj_weight": ones(16, 8), "out_proj.weight": ones(8, 8)}, 4, num_kv_heads=2).prune_heads([0]),
    "py.int_list_shape": lambda t: called_mha().attention_weights_of(None, [[0, 1]]),
    "py.state_dict_type": lambda t: mha.MultiHeadAttention(8, 2).load_state_dict([1]),
    "py.state_dict_key": lambda t: mha.MultiHeadAttention(8, 2).load_state_dict({1: ones(1)}),
    "tmha.optional_integer": lambda t: mha.TorchMultiheadAttention.from_state_dict(TMHA_STATE, 2, kdim="a"),
    "tmha.optional_positive": lambda t: mha.TorchMultiheadAttention.from_state_dict(TMHA_STATE, 2, num_kv_heads=0),
    "tmha.optional_range": lambda t: mha.TorchMultiheadAttention.from_state_dict(TMHA_STATE, 2, kdim=2**70),
    "tmha.mask_sum": lambda t: tmha_module()(ones(2, 3, 4), ones(2, 6, 4), ones(2, 6, 4),
                                             key_padding_mask=np.full((2, 6), 3e38, np.float32),
                                             attn_mask=np.full((3, 6), 3e38, np.float32)),
    "tmha.overflow": lambda t: tmha_module()(np.full((2, 3, 4), 1e20, np.float32), np.full((2, 6, 4), 1e20, np.float32),
                                             ones(2, 6, 4)),
    "dpa.no_features": lambda t: mha.DotProductAttention()(ones(2, 4, 0), ones(2, 6, 0), ones(2, 6, 3)),
    "dpa.overflow": lambda t: mha.DotProductAttention()(HUGE, np.full((2, 6, 2), 1e20, np.float32), ones(2, 6, 3)),
    "read.nul": lambda t: mha.load_safetensors("a\0b"),
    "write.nul": lambda t: mha.save_safetensors("a\0b", {}),
    "write.not_regular": lambda t: mha.save_safetensors(symlink_out(t), {}),
    "model.memory_limit": lambda t: with_limit(lambda: small_model(num_layers=10**7)),
    "optim.lr_finite": lambda t: mha.optim.Adam(called_mha(), lr=math.inf),
    "task.memory_limit": lambda t: with_limit(lambda: mha.OffsetPairTask().sample(10**12, 0)),
    "task.held_out_memory": lambda t: with_limit(lambda: mha.held_out_set(mha.OffsetPairTask(), 10**12, 0)),
    "py.image_dtype": lambda t: mha.write_png(str(t / "o.png"), np.zeros((2, 2, 3))),
    "py.real_number": lambda t: mha._core._render_heatmaps(ones(1, 1, 2, 2), "", "", [], [], "", "", "", "a", None,
                                                          10, 0),
    # Arguments of the wrong kind (tests/python/test_bad_types.py walks them all).
    "py.not_array": lambda t: called_mha().set_grads({"W_q.weight": "abc"}),
    "py.argument_kind": lambda t: mha.MultiHeadAttention(8, "2"),
    "py.betas": lambda t: mha.optim.Adam(called_mha(), betas=b"12"),
    "py.line_panel": lambda t: mha._core._render_line_chart(["abc"]),
    "py.line_text": lambda t: mha._core._render_line_chart([{"title": 3}]),
    "py.line_log_y": lambda t: mha._core._render_line_chart([{"log_y": "yes"}]),
    "py.line_series": lambda t: mha._core._render_line_chart([{"series": "abc"}]),
    "py.line_item": lambda t: mha._core._render_line_chart([{"series": [("a", [1.0])]}]),
    "py.line_numbers": lambda t: mha._core._render_line_chart([{"series": [("a", [[1.0, 2.0]], [1.0, 2.0])]}]),
    "py.importance_batches": lambda t: mha.gradient_importance(small_model(), 3),
    "py.importance_entry": lambda t: mha.gradient_importance(small_model(), ["abc"]),
})


def existing_out(t):
    (t / "ck.safetensors").write_bytes(b"trained")
    return ["train", "--steps", "0", "--plot", "", "--curves", "", "--out", str(t / "ck.safetensors")]


def small_train(t, *args):
    return train_args(t, "--hiddens", "8", "--heads", "2", "--eval-size", "4", *args)


CLI.update({
    "write.not_regular": lambda t: ["run", "--weights", str(base_checkpoint()), "--inputs", str(base_checkpoint()),
                                    "--out", symlink_out(t)],
    "model.memory_limit": lambda t: ["--memory-limit", "1073741824"] + small_train(t, "--layers", "10000000"),
    "trainer.memory_limit": lambda t: ["--memory-limit", "1073741824"] + train_args(t, "--batch", "1000000000"),
    "optim.lr_finite": lambda t: train_args(t, "--lr", "inf"),
    "train.steps_plot": lambda t: train_args(t, "--steps", "0"),
    "train.steps_overwrite": existing_out,
    "train.diverged": lambda t: small_train(t, "--lr", "1e30", "--steps", "3", "--clip", "0"),
    "cli.same_output": lambda t: ["train", "--out", str(t / "o.x"), "--curves", "", "--plot", str(t / "o.x")],
    "cli.output_is_input": lambda t: ["run", "--weights", str(base_checkpoint()), "--inputs", str(base_checkpoint()),
                                      "--out", str(base_checkpoint())],
    "cli.extension": lambda t: ["train", "--out", str(t / "o.png"), "--curves", "", "--plot", ""],
})


# ---- the command line's one rule (tests/python/test_cli_rules.py) ----------
# Rows marked `CLI usage` (exit status 2) are triggered from CLI_USAGE by
# test_cli_rules.py; the options whose ranges moved to the command line
# (--layers 0, --batch 0, --threads 0, ...) reach their library rows from
# C++ and Python only.

def torch_mha_weights(t, **extra):
    """nn.MultiheadAttention's state dict (E 10) with `extra` tensors, and inputs for `mha run`."""
    w, i = t / "w.safetensors", t / "i.safetensors"
    mha.save_safetensors(str(w), {"in_proj_weight": ones(30, 10), "out_proj.weight": ones(10, 10), **extra})
    mha.save_safetensors(str(i), {"queries": ones(2, 3, 10), "keys": ones(2, 4, 10), "values": ones(2, 4, 10)})
    return ["run", "--weights", str(w), "--inputs", str(i), "--heads", "2", "--out", str(t / "o.safetensors")]


def zip_file(t):
    path = t / "model.pt"
    path.write_bytes(b"PK\x03\x04\x14\x00\x00\x00" + bytes(56))
    return str(path)


PY.update({
    "st.other_kind": lambda t: mha.load_safetensors(zip_file(t)),
})
CLI.update({
    "st.other_kind": lambda t: ["run", "--weights", zip_file(t), "--inputs", zip_file(t), "--out",
                                str(t / "o.safetensors")],
    "run.torch_layout": lambda t: torch_mha_weights(t, bias_k=ones(1, 1, 10), bias_v=ones(1, 1, 10)),
})
CLI_USAGE = {
    "cli.int_range": lambda t: ["train", "--steps", "99999999999999999999"],
    "cli.threads": lambda t: ["train", "--threads", "100000"],
    "cli.seed": lambda t: ["demo", "--seed", str(2**64)],
    "cli.size": lambda t: ["--memory-limit", "GB", "demo"],
    "cli.needs": lambda t: ["viz", "--layer", "1", "--out", str(t / "o.png")],
    "cli.excludes": lambda t: ["demo", "--no-heatmap", "--heatmap", str(t / "o.png")],
    "cli.momentum": lambda t: ["train", "--optimizer", "adam", "--momentum", "0.5"],
    "cli.choice": lambda t: ["run", "--parallel", "grid2"],
    "cli.random_seed": lambda t: ["prune", "--random-orders", "0", "--random-seed", "3"],
    "cli.command": lambda t: ["bogus"],
    "cli.parser": lambda t: ["run"],
}


def _pruned_slopes():
    import torch
    import mha.torch as mt
    m = mt.MultiheadAttention(8, 4, batch_first=True)
    m.prune_heads([1])
    x = torch.ones(2, 3, 8)
    m(x, x, x, alibi_slopes=torch.ones(3))


def _kpm_lengths():
    import torch
    import mha.torch as mt
    x = torch.ones(2, 3, 8)
    mt.MultiheadAttention(8, 2, batch_first=True)(x, x, x, torch.tensor([2.0, 3.0]))


def _torch_dist_call(what):
    """The mha.torch.distributed calls of the catalogue's torch_dist.* rows, in a one-rank Gloo group
    (an in-process store, no port) made on first use."""
    import torch
    import torch.distributed as dist
    import mha.torch as mt
    import mha.torch.distributed as mtd
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.ones(1, 4, 8)
    chapter = mt.MultiHeadAttention(8, 2, 0.0)
    drop_in = mt.MultiheadAttention(8, 2, batch_first=True)
    if what == "zigzag_length":
        mtd.shard(torch.ones(1, 10), 1, 0, 2, zigzag=True)
    elif what == "dropout":
        mtd.SequenceParallel(mt.MultiHeadAttention(8, 2, 0.1), method="all_gather")(x, x, x)
    elif what == "method":
        mtd.SequenceParallel(chapter, method="p2p")
    elif what == "padding_dtype":
        mtd.SequenceParallel(drop_in)(x, x, x, key_padding_mask=torch.zeros(1, 4))
    elif what == "ring_gates":
        chapter.head_gates = torch.ones(2)
        mtd.SequenceParallel(chapter)(x, x, x)
    elif what == "ring_drop_in":
        mtd.SequenceParallel(mt.MultiheadAttention(8, 2, batch_first=True, add_zero_attn=True))(x, x, x)
    elif what == "ring_rotary":
        mtd.SequenceParallel(mt.MultiHeadAttention(8, 2, 0.0, rotary=True))(x, x, x)
    elif what == "ring_sizes":
        import mha
        mha._core._ring_calls.RingCall(1, 1, 2, 4, 4, [(0, 4)], lens=torch.ones(2).numpy())
    elif what == "shard_world":
        mtd.shard(torch.ones(1, 8), 1, 0, 0)
    elif what == "shard_rank":
        mtd.shard(torch.ones(1, 8), 1, -1, 2)
    elif what == "shard_dim":
        mtd.shard(torch.ones(1, 8), 2, 0, 2)
    elif what == "width":
        chapter(x, x, x)  # built
        mtd.SequenceParallel(chapter)(x, torch.ones(1, 4, 6), torch.ones(1, 4, 6))
    elif what == "ring_option":
        import mha
        mha._core._ring_calls.RingCall(1, 1, 2, 4, 4, [(0, 4)], bogus=1)
    elif what == "ring_window":
        mtd.SequenceParallel(chapter)(x, x, x, window=(-2, 0))
    elif what == "ring_alibi":
        mtd.SequenceParallel(chapter)(x, x, x, alibi_slopes=[1.0])
    elif what == "gather_positions":
        mtd.SequenceParallel(chapter, method="all_gather")(x, x, x, window=(1, 0))
    elif what == "rank":
        mtd.SequenceParallel(chapter)(torch.ones(4, 8), x, x)
    elif what == "blocks":
        mtd.SequenceParallel(chapter)(x, torch.ones(1, 3, 8), torch.ones(1, 3, 8))
    elif what == "valid_lens":
        mtd.SequenceParallel(chapter)(x, x, x, torch.ones(1, 4))
    elif what == "zigzag_blocks":
        mtd.SequenceParallel(chapter, zigzag=True)(torch.ones(1, 3, 8), torch.ones(1, 3, 8), torch.ones(1, 3, 8))
    elif what == "attn_mask":
        mtd.SequenceParallel(drop_in)(x, x, x, attn_mask=torch.zeros(4, 4, dtype=torch.bool))
    elif what == "need_weights":
        mtd.SequenceParallel(drop_in)(x, x, x, need_weights=True)
    elif what == "drop_in_rank":
        mtd.SequenceParallel(drop_in)(x, x, torch.ones(4, 8))
    elif what == "drop_in_blocks":
        mtd.SequenceParallel(drop_in)(x, torch.ones(1, 3, 8), torch.ones(1, 3, 8))
    elif what == "head_mask":
        mtd.HeadParallel(chapter)(x, x, x, head_mask=torch.ones(2))
    elif what == "head_weights":
        mtd.HeadParallel(drop_in)(x, x, x)


PY.update({f"torch_dist.{w}": (lambda t, w=w: _torch_dist_call(w)) for w in (
    "zigzag_length", "dropout", "rank", "blocks", "valid_lens", "zigzag_blocks", "attn_mask", "need_weights",
    "drop_in_rank", "drop_in_blocks", "head_mask", "head_weights", "method", "padding_dtype", "ring_gates",
    "ring_drop_in", "ring_rotary", "ring_sizes", "ring_option", "ring_window", "ring_alibi", "gather_positions", "shard_world", "shard_rank", "shard_dim",
    "width")})
