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
"""

import math
import threading

import numpy as np
import torch
from torch import nn

from . import _checks, _core
from . import _torch_traced as _traced

from .torch_sdpa import scaled_dot_product_attention  # noqa: E402 (PyTorch 2.x's function)
from .torch_attention import attention  # noqa: E402 (FlashAttention's function)
from .torch_kv_cache import attention_with_kv_cache  # noqa: E402 (FlashAttention's flash_attn_with_kvcache)

_calls = _core._torch_calls

__all__ = ["MultiHeadAttention", "MultiheadAttention", "multi_head_attention_forward", "replace_attention",
           "head_importance", "scaled_dot_product_attention", "attention", "attention_with_kv_cache"]


def _not_on_cpu(op, name, device):
    """The error for a tensor on another device (docs/errors.md, torch.device)."""
    return ValueError(f"[{op}] {name}: a tensor on {device}; mha.torch computes on the CPU "
                      "only (the CUDA path does not exist yet): pass x.cpu()")


def _refuse_tracing(op):
    """torch.jit.trace (and torch.onnx.export, which traces) would record mha's output as a constant."""
    if torch.jit.is_tracing():
        raise RuntimeError(f"[{op}] torch.jit.trace / torch.onnx.export: mha computes outside torch's "
                           "operators, so a trace would replay this call's output for every input; run the "
                           "model eagerly, or trace it with torch.nn.MultiheadAttention (same state dict)")


def _refuse_scripting(self):
    raise RuntimeError(f"[mha.torch.{type(self).__name__}] torch.jit.script: mha computes outside "
                       "TorchScript; run the model eagerly, or script it with torch.nn.MultiheadAttention "
                       "(same state dict)")


def _check_input(x, op, name, ndims):
    """A CPU float32 tensor of one of the ranks in ndims, or an error that says why not."""
    if isinstance(x, torch.fx.Proxy):
        raise RuntimeError(f"[{op}] torch.fx.symbolic_trace: mha's modules cannot be traced through; keep "
                           "them as leaves (a torch.fx.Tracer whose is_leaf_module returns True for them)")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"[{op}] {name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise _not_on_cpu(op, name, x.device)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"[{op}] {name}: dtype {x.dtype}; mha computes in float32 (and in bfloat16 for "
                        "bfloat16 and float16 inputs): pass x.float() (float64 is not narrowed silently)")
    if x.dim() not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"[{op}] {name}: shape {tuple(x.shape)} has {x.dim()} dimensions, wanted {want}")


def _numpy_of(x):
    """A numpy view of a CPU tensor (no copy, strides kept)."""
    return x.detach().numpy()


def _inputs_numpy(q, k, v):
    """numpy views of q, k, v; one tensor passed twice is one array (projected once by mha)."""
    nq = _numpy_of(q)
    nk = nq if k is q else _numpy_of(k)
    nv = nq if v is q else nk if v is k else _numpy_of(v)
    return nq, nk, nv


def _mask_numpy(m, name):
    """A mask for mha: None, an mha.Mask, or a numpy array of a tensor's values."""
    if m is None or isinstance(m, _core.Mask):
        return m
    if isinstance(m, torch.Tensor):
        if m.device.type != "cpu":
            raise _not_on_cpu("mha.torch.MultiheadAttention", name, m.device)
        return m.detach().numpy()
    return m


def _float_array(t):
    """A float32 numpy view of a CPU tensor's values (no copy)."""
    return t.detach().numpy()


class _Weights:
    """The weights a module passes with each call, and the versions under which
    mha keeps their packings (one packing per weight and version, made by the
    first call that reads it).

    A slot's version changes whenever its tensor may hold other values: another
    storage (a replaced or tied Parameter, `.data = ...`), another torch version
    (an in-place write through torch: optimisers, nn.init, ops under no_grad),
    another shape or dtype. The tensor's storage is held while its version is
    in use, so that no other tensor can take its address meanwhile.
    """

    def __init__(self):
        self.state = _calls._CallState()
        self._seen = {}
        self._layers = None  # (key, layer tuple) of the last call
        self._lock = threading.Lock()

    def version(self, slot, t):
        key = (t.data_ptr(), t._version, tuple(t.shape), t.dtype)
        with self._lock:
            seen = self._seen.get(slot)
            if seen is not None and seen[0] == key:
                return seen[2]
            v = _calls._next_param_version()
            self._seen[slot] = (key, t.detach(), v)
            return v

    def forget(self):
        with self._lock:
            self._seen = {}
            self._layers = None
        self.state.clear()

    def layers(self, params, build):
        """The layer tuple of a call on `params`: the last call's when every parameter has the same
        storage, torch version and shape (its numpy views hold the storages, so an address seen
        again is the same storage), else build(params), kept for the next call."""
        key = tuple((t.data_ptr(), t._version, t.shape) for t in params)
        last = self._layers
        if last is not None and last[0] == key:
            return last[1]
        layers = build(params)
        self._layers = (key, layers)
        return layers


def _check_param(op, name, p):
    if p.device.type != "cpu":
        raise _not_on_cpu(op, name, p.device)
    if p.dtype != torch.float32:
        raise TypeError(f"[{op}] parameter {name}: dtype {p.dtype}; mha.torch keeps float32 parameters "
                        "(bfloat16 and float16 inputs run its bfloat16 mode on them): call .float() on the module")


def _call_dtype(op, tensors):
    """(the output dtype, the products' precision override or None) of a call: float32 inputs
    compute in float32 unless torch.autocast('cpu') asks for bfloat16/float16, which (like bfloat16
    and float16 inputs) run mha's bfloat16 mode and return that dtype."""
    dtypes = {t.dtype for t in tensors}
    low = dtypes & {torch.bfloat16, torch.float16}
    if low:
        if len(low) > 1 or len(dtypes - low - {torch.float32}) > 0:
            raise TypeError(f"[{op}] inputs of dtypes {sorted(str(d) for d in dtypes)}: pass one of float32, "
                            "bfloat16 or float16")
        return next(iter(low)), "bfloat16"
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4 (the _cpu_ forms are deprecated there)
        on, dtype = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    else:
        on, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    if on and dtype in (torch.bfloat16, torch.float16):
        return dtype, "bfloat16"
    return torch.float32, None


class _Call:
    """One forward call: its module's layer builder and settings, nothing shared with other calls."""

    def __init__(self, state, forward, layers, grads, gates=None, sinks=None):
        self.state = state      # the module's _calls._CallState
        # (q, k, v, params, for_backward, gates) -> (out ndarray, weights or None, context)
        self.forward = forward
        self.layers = layers    # (params, weights or None) -> the layer tuple _core reads, without gates
        self.grads = grads      # (params, engine grads) -> one gradient (or None) per parameter
        self.gates = gates      # (h,) float32 tensor multiplying each head's output, or None
        self.sinks = sinks      # (h,) float32 tensor of attention sinks (forward reads them itself), or None


_NO_GATES = torch.empty(0)


def _with_gates(layers, gates):
    """The layer tuple with the call's head gates (a (h,) tensor or None) as its last entry."""
    return layers[:7] + (None if gates is None else gates.detach().contiguous().numpy(),)


class _AttentionFunction(torch.autograd.Function):
    """forward(call, q, k, v, gates, sinks, *params) -> (output, weights or empty); backward by mha
    from the call's own context (kept by this autograd node, not by the module). gates, sinks: (h,)
    or empty."""

    @staticmethod
    def forward(ctx, call, q, k, v, gates, sinks, *params):
        out, weights, context = call.forward(q, k, v, params, True, call.gates)
        ctx.call, ctx.context = call, context
        # torch refuses the backward if one was written in place since
        ctx.save_for_backward(gates, sinks, *params)
        weights = torch.empty(0) if weights is None else torch.from_numpy(weights)
        ctx.mark_non_differentiable(weights)
        return torch.from_numpy(out), weights

    @staticmethod
    def backward(ctx, grad_out, _grad_weights):
        if torch.is_grad_enabled():  # create_graph=True: the gradients would be constants
            raise RuntimeError("[mha.torch] backward with create_graph=True: mha's attention has no double "
                               "backward (gradient penalties, Hessian-vector products); its first-order "
                               "gradients are exact, so use torch.nn.MultiheadAttention for such losses")
        gates, _sinks, *params = ctx.saved_tensors
        call, context = ctx.call, ctx.context
        g = grad_out.detach()
        if g.dtype != torch.float32:
            g = g.float()
        layers = _with_gates(call.layers(params, None), call.gates)
        (gq, gk, gv), *rest = _calls._engine_backward(call.state, context, layers, g.contiguous().numpy())
        g_gates = torch.from_numpy(rest[3]) if ctx.needs_input_grad[4] else None
        g_sinks = torch.from_numpy(rest[4]) if ctx.needs_input_grad[5] and rest[4] is not None else None
        return (None, torch.from_numpy(gq), torch.from_numpy(gk), torch.from_numpy(gv), g_gates, g_sinks,
                *call.grads(params, rest))


def _run(call, q, k, v, params, want_weights):
    """Output, weights (or None) and the call's context, through autograd when a gradient is wanted."""
    gates, sinks = call.gates, call.sinks
    need_grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or any(p.requires_grad for p in params)
        or (gates is not None and gates.requires_grad) or (sinks is not None and sinks.requires_grad))
    if need_grad:
        with torch.inference_mode(False):
            out, weights = _AttentionFunction.apply(call, q, k, v, _NO_GATES if gates is None else gates,
                                                    _NO_GATES if sinks is None else sinks, *params)
        return out, (weights if want_weights else None)
    out, weights, context = call.forward(q, k, v, params, False, gates)
    return torch.from_numpy(out), (None if weights is None else torch.from_numpy(weights))


def _dropout_p(op, name, p):
    """The module's dropout probability as this call reads it (attributes are read per call)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"[{op}] {name}: {p:g} is not a probability in [0, 1]")
    return p


def _dropout_key(p):
    """A key for mha's dropout masks, drawn from torch's generator (0 without dropout)."""
    if p <= 0.0:
        return 0
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())


def _check_cached(op, cache, tensors):
    """cache is an mha.KVCache, and the call needs no gradient (cached calls have no backward)."""
    if not isinstance(cache, _core.KVCache):
        raise _checks.wrong_kind(op, "cache", cache, "an mha.KVCache (made by this module's kv_cache())")
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise ValueError(f"[{op}] cache: cached calls have no backward; run them under torch.no_grad() "
                         "or torch.inference_mode() (a parameter or input requires grad)")


class _CacheImpl:
    """The mha module behind cached calls (a KVCache belongs to one): its buffers get a copy of each
    parameter whose value may have changed since the last cached call (same rule as _Weights)."""

    def __init__(self, impl):
        self.impl = impl
        self.views = None
        self.initialized = False
        self._seen = {}
        self._lock = threading.Lock()

    def sync(self, pairs):
        """pairs: (mha buffer name, tensor with its values)."""
        written = False
        if self.views is None:
            self.views = self.impl._parameter_views()
        with self._lock, torch.no_grad():
            for name, t in pairs:
                key = (t.data_ptr(), t._version, tuple(t.shape))
                seen = self._seen.get(name)
                if seen is not None and seen[0] == key:
                    continue
                torch.from_numpy(self.views[name]).copy_(t.detach())
                self._seen[name] = (key, t.detach())
                written = True
            if written:
                self.impl._parameters_written()

    def forget(self):
        with self._lock:
            self._seen = {}


class DotProductAttention(nn.Module):
    """The d2l chapter's DotProductAttention as a view of the mha module's state:
    dropout (nn.Dropout, its p read at every call) and attention_weights
    (B*h, Q, K) of the last call. It has no parameters."""

    def __init__(self, dropout, owner):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self._owner = [owner]  # a list: not a submodule

    @property
    def attention_weights(self):
        """(B*num_heads, Q, K): the last call's softmax weights before dropout, as the d2l chapter has them."""
        w = self._owner[0].attention_weights
        return None if w is None else w.reshape(-1, w.shape[2], w.shape[3])


def _rotary_state(r):
    """An mha.Rotary as plain values for pickle / deepcopy (None stays None)."""
    return None if r is None else {"dims": r.dims, "base": r.base, "interleaved": r.interleaved}


def _rotary_of_state(r):
    return r if r is None or isinstance(r, _core.Rotary) else _core.Rotary(r["dims"], r["base"], r["interleaved"])


def _rope(x, dims, base, interleaved):
    """x (B, h, L, d) rotated at positions 0..L-1 by torch's ops, as mha/rotary.h defines it
    (Hugging Face's float32 angles): for the differentiable weights."""
    theta = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
    angle = torch.arange(x.shape[2]).float()[:, None] * theta[None, :]
    cos, sin = angle.cos(), angle.sin()
    rot, rest = x[..., :dims], x[..., dims:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)
    else:
        x1, x2 = rot[..., :dims // 2], rot[..., dims // 2:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return torch.cat([out, rest], -1)


class MultiHeadAttention(nn.Module):
    """The d2l chapter's multi-head attention, computed and differentiated by mha.

    MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False, **kwargs)

    forward(queries (B, Q, Dq), keys (B, K, Dk), values (B, K, Dv), valid_lens)
        -> (B, Q, num_hiddens)
    valid_lens: None, (B,) or (B, Q) (the chapter's masking: keys k >= length get
    -1e6 before the softmax). W_q, W_k, W_v, W_o are nn.LazyLinear layers: their
    weights (num_hiddens, in) are drawn by torch at the first call (the same
    numbers as the chapter's module after the same torch.manual_seed) and the
    state dict has the chapter's keys W_q.weight, ... (and .bias when bias=True).

    attention_weights: (B, num_heads, Q, K), the last call's weights before dropout;
    attention.attention_weights: the same as the chapter's (B*num_heads, Q, K).
    train()/eval() switch dropout (attention.dropout.p) on and off.
    kwargs: kernel=mha.Kernel.* chooses mha's attention implementation;
    precision='bfloat16' ('bf16') runs the projections' products in bfloat16
    with float32 sums and rounds q, k, v to bfloat16 (attention, parameters,
    gradients and optimiser steps stay float32; default 'float32');
    rotary= rotary position embeddings on each head's q and k after the
    projections (see mha.torch.MultiheadAttention; also the rotary property).
    forward also takes window=, softcap=, alibi_slopes= and sinks= (attention
    sinks through autograd: pass your nn.Parameter per call), as
    mha.torch.MultiheadAttention.forward does.

    Incremental decoding: cache = m.kv_cache(batch_size, max_len, dtype) (an
    mha.KVCache), then m(x, x, x, valid_lens, cache=cache) in eval mode and
    under torch.no_grad(): only the new positions are projected, and each new
    query attends over its row's cached positions and, causally, the new ones
    (mha.MultiHeadAttention's cached call; no backward, no attention_weights).
    """

    def __init__(self, num_hiddens, num_heads, dropout, bias=False, **kwargs):
        super().__init__()
        op = "mha.torch.MultiHeadAttention"
        num_hiddens = _checks.integer(num_hiddens, op, "num_hiddens")
        num_heads = _checks.integer(num_heads, op, "num_heads")
        dropout = _checks.real(dropout, op, "dropout")
        bias = _checks.flag(bias, op, "bias")
        kernel = kwargs.pop("kernel", None)
        precision = _checks.precision(kwargs.pop("precision", "float32"), op)
        rotary = kwargs.pop("rotary", None)
        if kwargs:
            raise TypeError(f"[{op}] unexpected keyword arguments: {', '.join(sorted(kwargs))}")
        # mha's own module checks the sizes (positive, divisible) with its messages.
        _core.MultiHeadAttention(num_hiddens, num_heads, 0.0, bias)
        self._rotary = _core._to_rotary(rotary, op, num_hiddens // num_heads)
        self.num_heads = num_heads
        self.num_hiddens = num_hiddens
        self.attention = DotProductAttention(dropout, self)
        self.W_q = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_k = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_v = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_o = nn.LazyLinear(num_hiddens, bias=bias)
        self._bias = bias
        self._kernel = _core.Kernel.FUSED if kernel is None else kernel
        self._precision = precision
        self.original_num_heads = num_heads
        self.kept_heads = list(range(num_heads))  # numbered as built
        self._make_state()

    def _make_state(self):
        self._weights = _Weights()
        self._cache_impl = None
        self._last_context = None

    __prepare_scriptable__ = _refuse_scripting  # torch.jit.script calls it first

    @property
    def rotary(self):
        """The rotary position embeddings on q and k (an mha.Rotary), or None (off)."""
        return self._rotary

    @rotary.setter
    def rotary(self, r):
        self._rotary = _core._to_rotary(r, "mha.torch.MultiHeadAttention.rotary",
                                        self.num_hiddens // self.original_num_heads)

    def __getstate__(self):  # copy.deepcopy / pickle: mha's per-module state is made anew
        state = dict(self.__dict__)
        for k in ("_weights", "_cache_impl", "_last_context"):
            state.pop(k, None)
        state["_rotary"] = _rotary_state(state.get("_rotary"))
        return state

    def __setstate__(self, state):
        state = dict(state)
        state["_rotary"] = _rotary_of_state(state.get("_rotary"))
        super().__setstate__(state)
        self._make_state()

    @property
    def kernel(self):
        """mha's attention implementation (mha.Kernel; FUSED by default)."""
        return self._kernel

    @kernel.setter
    def kernel(self, k):
        if not isinstance(k, _core.Kernel):
            raise _checks.wrong_kind("mha.torch.MultiHeadAttention.kernel", "kernel", k, "an mha.Kernel")
        self._kernel = k

    @property
    def precision(self):
        """The matrix products' format: 'float32' or 'bfloat16'."""
        return self._precision

    @precision.setter
    def precision(self, p):
        self._precision = _checks.precision(p, "mha.torch.MultiHeadAttention.precision")

    def parameters_written(self):
        """Tell mha that parameters were written where torch's version counter does not see it
        (in place on ``.data``, or through a numpy view of their storage): the next call repacks
        them. Writes through torch (optimisers, in-place ops, nn.init) and replaced or tied
        Parameters need nothing: every call reads the Parameters the module has then."""
        self._weights.forget()
        if self._cache_impl is not None:
            self._cache_impl.forget()

    def _layers(self):
        return (("W_q", self.W_q), ("W_k", self.W_k), ("W_v", self.W_v), ("W_o", self.W_o))

    def prune_heads(self, heads):
        """Removes heads for good, numbered as built (0 .. original_num_heads - 1), as the d2l module's
        exercise asks: their rows of W_q, W_k, W_v (and biases) and their columns of W_o go, so the
        projections get smaller, new Parameters (rebuild optimisers made before); num_heads becomes
        the kept count, head_dim stays, the output stays num_hiddens wide; the kept heads' gates stay.
        A lazy module is built narrower at its first call. At least one head must remain."""
        op = "mha.torch.MultiHeadAttention.prune_heads"
        # mha's own module checks the numbers with its messages (range, repeats, all removed).
        check = _core.MultiHeadAttention(self.num_hiddens, self.original_num_heads, 0.0, self._bias)
        gone = [h for h in range(self.original_num_heads) if h not in self.kept_heads]
        if gone:
            check.prune_heads(gone)
        if isinstance(heads, torch.Tensor):
            heads = heads.tolist()
        if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
            raise _checks.wrong_kind(op, "heads", heads, "a list of head numbers")
        heads = [_checks.integer(h, op, "heads") for h in heads]
        check.prune_heads(heads)
        stay = [i for i, h in enumerate(self.kept_heads) if h not in heads]  # positions among the kept
        d = self.num_hiddens // self.original_num_heads
        rows = torch.tensor([i * d + c for i in stay for c in range(d)], dtype=torch.long)
        with torch.no_grad(), torch.inference_mode(False):
            for layer in (self.W_q, self.W_k, self.W_v):
                if isinstance(layer, nn.modules.lazy.LazyModuleMixin) and layer.has_uninitialized_params():
                    layer.out_features = len(rows)
                    continue
                layer.weight = nn.Parameter(layer.weight[rows].clone())
                if layer.bias is not None:
                    layer.bias = nn.Parameter(layer.bias[rows].clone())
                layer.out_features = len(rows)
            if not (isinstance(self.W_o, nn.modules.lazy.LazyModuleMixin) and self.W_o.has_uninitialized_params()):
                self.W_o.weight = nn.Parameter(self.W_o.weight[:, rows].clone())
                self.W_o.in_features = len(rows)
        gates = self.head_gates
        if gates is not None:
            self.head_gates = gates.detach()[stay].clone()
        self.kept_heads = [self.kept_heads[i] for i in stay]
        self.num_heads = len(stay)
        self._make_state()  # packings, the cache's module and the last context are of the old shapes

    def _materialise(self, queries, keys, values):
        """torch's lazy initialisation, as the chapter's first call does it (same draws, same order)."""
        mods = self._modules  # the registry itself: nn.Module.__getattr__ costs ~1 us a name per call
        if all(type(layer) is nn.Linear and layer.in_features == layer._parameters["weight"].shape[1]
               for layer in (mods["W_q"], mods["W_k"], mods["W_v"], mods["W_o"])):
            return  # built (a LazyLinear becomes an nn.Linear) and consistent: nothing to do
        for layer, x in ((self.W_q, queries), (self.W_k, keys), (self.W_v, values), (self.W_o, None)):
            if isinstance(layer, nn.modules.lazy.LazyModuleMixin) and layer.has_uninitialized_params():
                if x is None:  # W_o reads the heads' concatenation (narrower once heads are pruned)
                    x = queries.new_empty((0, self.W_q.out_features))
                with torch.inference_mode(False), torch.no_grad():  # parameters stay normal tensors
                    layer._infer_parameters(layer, (x.float(),))  # what torch's pre-forward hook does
            width = layer.weight.shape[1]
            if getattr(layer, "in_features", None) != width:
                layer.in_features = width  # also after a load_state_dict

    def _params_names(self):
        return [(n + s, None) for n, _ in self._layers() for s in ((".weight", ".bias") if self._bias else (".weight",))]

    def _params(self):
        """The call's parameters, read from the layers now: (name, tensor) in the chapter's order."""
        mods = self._modules
        out = []
        for name in ("W_q", "W_k", "W_v", "W_o"):
            layer = mods[name]
            ps = layer._parameters
            out.append((name + ".weight", ps["weight"] if "weight" in ps else layer.weight))
            if self._bias:
                out.append((name + ".bias", ps["bias"] if "bias" in ps else layer.bias))
        return out

    def _call_layers(self, params, weights):
        """The layer tuple of one call (weights: the _Weights that versions them, or None)."""
        for (name, _), t in zip(self._params_names(), params):
            _check_param("mha.torch.MultiHeadAttention", name, t)
        per = 2 if self._bias else 1
        layers = []
        for i in range(4):
            w = params[i * per]
            b = params[i * per + 1] if self._bias else None
            version = weights.version(i, w) if weights is not None else 0
            layers.append((_float_array(w), None if b is None else _float_array(b), version))
        return (*layers, None, None, False, None)

    def kv_cache(self, batch_size, max_len, dtype="float32", window=None):
        """An mha.KVCache of batch_size rows of max_len positions for this module's cached calls,
        forward(x, x, x, cache=cache); dtype 'float32' or 'bfloat16' (or torch.float32 /
        torch.bfloat16). window=w (>= 0): a ring buffer of w + max_len slots for calls with
        window=(left, right), 0 <= left <= w, of at most max_len new positions each."""
        return self._cache_module().impl.kv_cache(batch_size, max_len, _cache_dtype(dtype), window)

    def _cache_module(self):
        if self._cache_impl is None:
            impl = _core.MultiHeadAttention(self.num_hiddens, self.original_num_heads, 0.0, self._bias)
            gone = [h for h in range(self.original_num_heads) if h not in self.kept_heads]
            if gone:
                impl.prune_heads(gone)
            self._cache_impl = _CacheImpl(impl)
        return self._cache_impl

    def forward(self, queries, keys, values, valid_lens=None, *, cache=None, head_mask=None, window=None,
                softcap=None, alibi_slopes=None, sinks=None):
        """(B, Q, Dq), (B, K, Dk), (B, K, Dv), valid_lens None|(B,)|(B, Q) -> (B, Q, num_hiddens);
        with cache= (an mha.KVCache of kv_cache()): the cached call of the n new positions,
        queries, keys, values (B, n, D*), in eval mode without gradients (class docstring).
        window, softcap, alibi_slopes, sinks: as mha.torch.MultiheadAttention's (a window makes
        masked scores -inf, as any mask does; the others keep the chapter's -1e6 fill); sinks is a
        (num_heads,) tensor whose gradient flows (a learned sink is your nn.Parameter, passed per
        call), the others get none. In cached calls: window over each row's keys, ALiBi from each
        new query's position."""
        op = "mha.torch.MultiHeadAttention"
        _refuse_tracing(op)
        for x, n in ((queries, "queries"), (keys, "keys"), (values, "values")):
            _check_input(x, op, n, (3,))
        lens = None
        if valid_lens is not None and not _traced.tracing(queries, keys, values):
            if isinstance(valid_lens, torch.Tensor):
                if valid_lens.device.type != "cpu":
                    raise _not_on_cpu(op, "valid_lens", valid_lens.device)
                lens = valid_lens.detach().numpy()
            else:
                lens = _checks.real_array(valid_lens, op, "valid_lens")
        self._materialise(queries, keys, values)
        if _traced.tracing(queries, keys, values):  # torch.compile / torch.export: torch's ops around mha's
            if cache is not None:
                _traced._refuse(op, "cache")
            if window is not None or sinks is not None:
                _traced._refuse(op, "window / sinks")
            _, mode = _call_dtype(op, (queries, keys, values))
            return _traced.chapter(self, queries, keys, values, valid_lens, window, softcap, sinks, head_mask,
                                   mode or self._precision, alibi_slopes)
        named = self._params()
        params = [t for _, t in named]
        out_dtype, mode = _call_dtype(op, (queries, keys, values))
        precision = mode or self._precision
        queries, keys, values = _as_float32(queries, keys, values)
        alibi_slopes = _alibi_numpy(op, alibi_slopes)
        sinks = _call_sinks(op, sinks, self.num_heads)
        sinks_np = _sinks_numpy(sinks)
        if cache is not None:
            if not isinstance(cache, _core.KVCache):
                raise _checks.wrong_kind(op, "cache", cache, "an mha.KVCache (made by this module's kv_cache())")
            _check_cached(op, cache, [queries, keys, values, *params, *([] if sinks is None else [sinks])])
            if self.training:
                raise ValueError(f"[{op}] cache: cached calls run in evaluation mode only (this module is "
                                 "in training mode); call eval() first")
            cm = self._cache_module()
            impl = cm.impl
            if not cm.initialized:
                impl.initialize(queries.shape[2], keys.shape[2], values.shape[2])
                cm.initialized = True
            cm.sync(named)
            impl.eval()
            impl.precision = precision
            impl.rotary = self._rotary
            _cache_gates(impl, _call_gates(op, self.head_gates, head_mask, self.num_heads), self.num_heads)
            nq, nk, nv = _inputs_numpy(queries, keys, values)
            return torch.from_numpy(impl(nq, nk, nv, lens, cache=cache, window=window, softcap=softcap,
                                         alibi_slopes=alibi_slopes, sinks=sinks_np)).to(out_dtype)
        p = _dropout_p(op, "attention.dropout.p", self.attention.dropout.p) if self.training else 0.0
        key = _dropout_key(p)
        kernel, num_heads, rotary = self._kernel, self.num_heads, self._rotary
        weights = self._weights
        module = self

        def forward(q, k, v, ps, for_backward, gates):
            nq, nk, nv = _inputs_numpy(q, k, v)
            layers = _with_gates(weights.layers(ps, lambda ps: module._call_layers(ps, weights)), gates)
            out, context = _calls._chapter_forward(weights.state, layers, nq, nk, nv,
                                                 lens, num_heads, kernel, precision, for_backward, p, key, True,
                                                 rotary, window=window, softcap=softcap,
                                                 alibi_slopes=alibi_slopes, sinks=sinks_np)
            object.__setattr__(module, "_last_context", context)  # a plain attribute: skip nn.Module's
            return out, None, context

        def grads(ps, rest):
            pg = rest[0]
            per = 2 if module._bias else 1
            out = []
            for i in range(4):
                out.append(torch.from_numpy(pg[2 * i]) if ps[i * per].requires_grad else None)
                if module._bias:
                    out.append(torch.from_numpy(pg[2 * i + 1]) if ps[i * per + 1].requires_grad else None)
            return out

        call = _Call(weights.state, forward, self._call_layers, grads,
                     _call_gates(op, self.head_gates, head_mask, self.num_heads), sinks)
        out, _ = _run(call, queries, keys, values, params, False)
        return out if out_dtype == torch.float32 else out.to(out_dtype)

    @property
    def attention_weights(self):
        """(B, num_heads, Q, K): the last call's softmax weights before dropout (None before a call)."""
        c = self._last_context
        return None if c is None else torch.from_numpy(c.attention_weights())


def _as_float32(*xs):
    """The inputs as float32 (a differentiable conversion for bfloat16 and float16)."""
    if all(x.dtype == torch.float32 for x in xs):
        return xs
    out = []
    for x in xs:
        done = next((o for y, o in zip(xs, out) if y is x), None)  # one tensor passed twice stays one
        out.append(done if done is not None else (x if x.dtype == torch.float32 else x.float()))
    return out


def _cache_dtype(dtype):
    if dtype is torch.bfloat16:
        return "bfloat16"
    if dtype is torch.float32:
        return "float32"
    return dtype


class MultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention, computed and differentiated by mha.

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                       add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
                       device=None, dtype=None, *, fully_masked_rows=mha.FullyMaskedRows.ZEROS,
                       kernel=mha.Kernel.FUSED, precision='float32', rotary=None)

    The same parameters, names, initialisation (torch's, from torch's generator)
    and state dict as nn.MultiheadAttention, so either's state dict loads into
    the other and it can replace TransformerEncoderLayer(...).self_attn.

    forward(query, key, value, key_padding_mask=None, need_weights=True,
            attn_mask=None, average_attn_weights=True, is_causal=False, *,
            cache=None, head_mask=None, window=None)
        -> (attn_output, attn_weights or None)
    query (B, L, E) if batch_first else (L, B, E), or unbatched (L, E); key
    (.., S, kdim), value (.., S, vdim); key_padding_mask (B, S) or (S,);
    attn_mask (L, S) or (B*num_heads, L, S); a boolean mask means True = masked
    out, a floating one is added to the scores. attn_output is shaped like query;
    attn_weights (B, L, S) averaged over heads or (B, num_heads, L, S) (S + 1 with
    bias_k/bias_v, + 1 with add_zero_attn). Differences from PyTorch 1.13: a row
    whose every key is masked gets fully_masked_rows (zeros by default), not NaN;
    is_causal=True always applies the causal mask; masks get no gradient.
    The returned weights are differentiable when a gradient is wanted (they
    are then recomputed by torch's ops from the call's query, key and
    parameters, with its masks and dropout mask: mha's values to float32
    rounding); with mha.Mask objects as masks they are not. precision='bfloat16' ('bf16')
    runs the projections' products in bfloat16 with float32 sums and rounds
    q, k, v to bfloat16; attention, parameters, gradients and optimiser steps
    stay float32.

    head_gates ((num_heads,) tensor or None) and head_mask= multiply each head's
    output before out_proj (see mha.torch.head_importance).

    rotary: rotary position embeddings (RoFormer; LLaMA, GPT-NeoX, GPT-J) on
    each head's projected q and k (after in_proj and its bias), forward and
    backward: None or False (default, off); True (every entry of each head,
    base 10000, Hugging Face's rotate_half pairs (x[m], x[m + d/2])); a dict
    {"dims": n, "base": b, "interleaved": bool} (dims: the first n entries of
    each head, even, default the head width, as GPT-NeoX's rotary_pct;
    interleaved=True pairs (x[2m], x[2m+1]) as GPT-J); or an mha.Rotary.
    Query i and key j sit at positions i and j; in cached calls the new
    positions follow each row's cached length, so decoding token by token
    equals the uncached causal call. bias_k and add_zero_attn's keys are not
    rotated. Also a property (module.rotary = ...).
    torch's TransformerEncoder(Layer) calls this module in eval mode under
    no_grad too (its own fused path is never taken for it).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, fully_masked_rows=None, kernel=None, precision="float32", rotary=None):
        super().__init__()
        op = "mha.torch.MultiheadAttention"
        embed_dim = _checks.integer(embed_dim, op, "embed_dim")
        num_heads = _checks.integer(num_heads, op, "num_heads")
        dropout = _checks.real(dropout, op, "dropout")
        bias, add_bias_kv, add_zero_attn, batch_first = (
            _checks.flag(v, op, n) for v, n in ((bias, "bias"), (add_bias_kv, "add_bias_kv"),
                                                (add_zero_attn, "add_zero_attn"), (batch_first, "batch_first")))
        kdim = None if kdim is None else _checks.integer(kdim, op, "kdim")
        vdim = None if vdim is None else _checks.integer(vdim, op, "vdim")
        # Checked here, before torch's module allocates (its own checks are
        # asserts, and a huge width fails inside torch's allocator).
        for n, v in (("embed_dim", embed_dim), ("num_heads", num_heads), ("kdim", kdim), ("vdim", vdim)):
            if v is not None and v < 1:
                raise ValueError(f"[{op}] {n}: {v}; wanted a positive integer")
        if embed_dim % num_heads:
            raise ValueError(f"[{op}] embed_dim: {embed_dim} is not divisible by num_heads {num_heads}")
        widths = embed_dim + (kdim or embed_dim) + (vdim or embed_dim)
        param_bytes = 4 * (embed_dim * widths + embed_dim * embed_dim + 6 * embed_dim)
        if param_bytes > _core.memory_limit():
            raise ValueError(f"[{op}] embed_dim: {embed_dim}: the parameters need {param_bytes} bytes, above the "
                             f"memory limit of {_core.memory_limit()} bytes; raise the limit with "
                             "mha.set_memory_limit")
        if dtype is not None and dtype != torch.float32:
            raise TypeError(f"[mha.torch.MultiheadAttention] dtype {dtype}: mha keeps float32 parameters "
                            "(bfloat16 and float16 inputs run its bfloat16 mode on them)")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"[mha.torch.MultiheadAttention] device: {device}; mha.torch computes "
                             "on the CPU only (the CUDA path does not exist yet)")
        # torch's own module draws the initial parameters (same order, same
        # numbers after the same torch.manual_seed); this module takes them.
        ref = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, bias=bias,
                                    add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                                    kdim=kdim, vdim=vdim, batch_first=batch_first)
        self.embed_dim = ref.embed_dim
        self.kdim, self.vdim = ref.kdim, ref.vdim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = ref.head_dim
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                     "in_proj_bias"):
            self.register_parameter(name, getattr(ref, name))
        self.out_proj = ref.out_proj
        self.bias_k, self.bias_v = ref.bias_k, ref.bias_v
        self.add_zero_attn = add_zero_attn
        self._fully_masked_rows = (_core.FullyMaskedRows.ZEROS if fully_masked_rows is None
                                   else fully_masked_rows)
        self._kernel = _core.Kernel.FUSED if kernel is None else kernel
        self._precision = _checks.precision(precision, op)
        self._rotary = _core._to_rotary(rotary, op, self.head_dim)
        self._make_state()

    @property
    def rotary(self):
        """The rotary position embeddings on q and k (an mha.Rotary), or None (off)."""
        return self._rotary

    @rotary.setter
    def rotary(self, r):
        self._rotary = _core._to_rotary(r, "mha.torch.MultiheadAttention.rotary", self.head_dim)

    def _make_state(self):
        self._weights = _Weights()
        self._cache_impl = None
        self._last_context = None

    __prepare_scriptable__ = _refuse_scripting  # torch.jit.script calls it first

    @property
    def _qkv_same_embed_dim(self):
        """False, so that torch's TransformerEncoder and TransformerEncoderLayer never take their own
        fused path in eval mode (it reads these parameters without calling forward): every call of
        theirs comes to mha. (Which projection parameters exist says whether q, k, v share in_proj.)"""
        return False

    def __getstate__(self):
        state = dict(self.__dict__)
        for k in ("_weights", "_cache_impl", "_last_context"):
            state.pop(k, None)
        state["_rotary"] = _rotary_state(state.get("_rotary"))
        return state

    def __setstate__(self, state):
        state = dict(state)
        state["_rotary"] = _rotary_of_state(state.get("_rotary"))
        super().__setstate__(state)
        self._make_state()

    def _named_params(self):
        """(torch state-dict name, Parameter) in nn.MultiheadAttention's order, read now."""
        # The registries themselves (what assignment and load_state_dict change), not getattr:
        # nn.Module.__getattr__ costs about a microsecond a name on every call.
        ps = self._parameters
        out = [(name, ps[name]) for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                             "in_proj_bias") if ps.get(name) is not None]
        out_proj = self._modules["out_proj"]
        ops = out_proj._parameters
        weight = ops["weight"] if "weight" in ops else out_proj.weight
        out.append(("out_proj.weight", weight))
        bias = ops["bias"] if "bias" in ops else getattr(out_proj, "bias", None)
        if bias is not None:
            out.append(("out_proj.bias", bias))
        out += [(name, ps[name]) for name in ("bias_k", "bias_v") if ps.get(name) is not None]
        return out

    @property
    def kernel(self):
        """mha's attention implementation (mha.Kernel; FUSED by default)."""
        return self._kernel

    @kernel.setter
    def kernel(self, k):
        if not isinstance(k, _core.Kernel):
            raise _checks.wrong_kind("mha.torch.MultiheadAttention.kernel", "kernel", k, "an mha.Kernel")
        self._kernel = k

    def _kept(self):
        kept = self.__dict__.get("kept_heads")
        return None if kept is None or len(kept) == self.num_heads else kept

    def prune_heads(self, heads):
        """Removes heads for good, numbered as built (0 .. num_heads - 1), as
        mha.TorchMultiheadAttention.prune_heads: calls compute only the kept heads (their rows of the
        projections and columns of out_proj, gathered once per version of the parameters); the
        Parameters keep PyTorch's shapes with the removed heads' rows and columns set to zero, so
        that nn.MultiheadAttention loads the state dict and computes what this module computes, and
        their gradients are zero there. num_heads stays as built (PyTorch's attribute); kept_heads
        lists the heads that remain; head_gates and head_mask keep one entry per head as built.
        At least one head must remain."""
        op = "mha.torch.MultiheadAttention.prune_heads"
        if isinstance(heads, torch.Tensor):
            heads = heads.tolist()
        if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
            raise _checks.wrong_kind(op, "heads", heads, "a list of head numbers")
        heads = [_checks.integer(h, op, "heads") for h in heads]
        kept = self.__dict__.get("kept_heads") or list(range(self.num_heads))
        # mha's own drop-in checks the numbers with its messages (range, repeats, all removed).
        E, H = self.embed_dim, self.num_heads
        check = _core.TorchMultiheadAttention.from_state_dict(
            {"in_proj_weight": np.zeros((3 * E, E), np.float32), "out_proj.weight": np.zeros((E, E), np.float32)},
            H)
        gone = [h for h in range(H) if h not in kept]
        if gone:
            check.prune_heads(gone)
        check.prune_heads(heads)
        d = E // H
        removed = _kept_rows(sorted(set(gone) | set(heads)), d)
        with torch.no_grad():
            for name, p in self._named_params():
                if name in ("in_proj_weight", "in_proj_bias"):
                    for part in range(3):
                        p[part * E:(part + 1) * E][removed] = 0
                elif name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                    p[removed] = 0
                elif name == "out_proj.weight":
                    p[:, removed] = 0
                elif name in ("bias_k", "bias_v"):
                    p.view(-1)[removed] = 0
        self.kept_heads = [h for h in kept if h not in heads]
        self._make_state()  # packings, the cache's module and the last context are of the old heads

    def parameters_written(self):
        """Tell mha that parameters were written where torch's version counter does not see it
        (in place on ``.data``, or through a numpy view of their storage): the next call repacks
        them. Writes through torch (optimisers, in-place ops, nn.init) and replaced or tied
        Parameters need nothing: every call reads the Parameters the module has then."""
        self._weights.forget()
        if self._cache_impl is not None:
            self._cache_impl.forget()

    @property
    def precision(self):
        """The matrix products' format: 'float32' or 'bfloat16'."""
        return self._precision

    @precision.setter
    def precision(self, p):
        self._precision = _checks.precision(p, "mha.torch.MultiheadAttention.precision")

    def _cache_module(self):
        """The mha module behind cached calls (batch-first; its buffers copied from the Parameters)."""
        if self._cache_impl is None:
            named = self._named_params()
            for name, p in named:
                _check_param("mha.torch.MultiheadAttention", name, p)
            state = {n: p.detach().numpy() for n, p in named}
            impl = _core.TorchMultiheadAttention.from_state_dict(
                state, self.num_heads, batch_first=True, kdim=self.kdim, vdim=self.vdim,
                add_zero_attn=self.add_zero_attn, dropout=0.0, fully_masked_rows=self._fully_masked_rows)
            kept = self._kept()
            if kept is not None:
                impl.prune_heads([h for h in range(self.num_heads) if h not in kept])
            self._cache_impl = _CacheImpl(impl)
        return self._cache_impl

    def _cache_pairs(self, named):
        """(mha buffer name, tensor) for _CacheImpl.sync."""
        proj, bias_k, bias_v = _drop_in_split(named, self.embed_dim)
        kept = self._kept()
        if kept is not None:  # the cache's module was pruned alike: its buffers hold the kept rows
            rows = _kept_rows(kept, self.embed_dim // self.num_heads)
            proj = [(w[rows], None if b is None else b[rows]) for w, b in proj[:3]] + \
                   [(proj[3][0][:, rows], proj[3][1])]
            bias_k = None if bias_k is None else bias_k.reshape(-1)[rows]
            bias_v = None if bias_v is None else bias_v.reshape(-1)[rows]
        out = []
        for (w, b), n in zip(proj, ("q_proj", "k_proj", "v_proj", "out_proj")):
            out.append((f"{n}_weight" if n != "out_proj" else "out_proj.weight", w))
            if b is not None:
                out.append((f"{n}_bias" if n != "out_proj" else "out_proj.bias", b))
        for n, t in (("bias_k", bias_k), ("bias_v", bias_v)):
            if t is not None:
                out.append((n, t))
        return out

    def kv_cache(self, batch_size, max_len, dtype="float32", window=None):
        """An mha.KVCache of batch_size rows of max_len positions for this module's cached calls,
        forward(x, x, x, cache=cache); dtype 'float32' or 'bfloat16' (or torch.float32 /
        torch.bfloat16). window=w (>= 0): a ring buffer of w + max_len slots for calls with
        window=(left, right), 0 <= left <= w, of at most max_len new positions each."""
        return self._cache_module().impl.kv_cache(batch_size, max_len, _cache_dtype(dtype), window)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, *, cache=None, head_mask=None, window=None,
                softcap=None, alibi_slopes=None, sinks=None):
        """(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
        average_attn_weights=True, is_causal=False, *, cache=None, window=None, softcap=None,
        alibi_slopes=None, sinks=None) -> (attn_output, attn_weights or None); shapes in the class
        docstring.
        window: None or (left, right), a sliding window as FlashAttention's window_size (query i
        of L sees key j of S iff i + S - L - left <= j <= i + S - L + right, -1 unbounded),
        intersected with the other masks. softcap: None or c > 0, each scaled score s becomes
        c * tanh(s / c) (Gemma 2); alibi_slopes: None or one slope per head (a tensor or array,
        no gradient), subtracting slope_h * |i + S - L - j| (ALiBi); both before the masks, as
        FlashAttention's softcap and alibi_slopes. sinks: None or a (num_heads,) tensor of attention
        sinks (gpt-oss): one more logit per head in each row's softmax denominator, with no value (a
        row's weights then sum to less than 1; a row with no live key gives 0), through autograd: a
        learned sink is your own nn.Parameter, passed on every call:

            self.sinks = nn.Parameter(torch.zeros(num_heads))       # in your layer's __init__
            out, w = self.attn(x, x, x, is_causal=True, sinks=self.sinks)
            loss.backward()                                         # self.sinks.grad is filled

        With cache= (an mha.KVCache of kv_cache()): the cached call of the n new
        positions (eval mode, no gradients, causal over the new positions, no attn_mask;
        key_padding_mask over the cached and new keys; window over each row's keys),
        -> (attn_output, None)."""
        op = "mha.torch.MultiheadAttention"
        _refuse_tracing(op)
        for x, n in ((query, "query"), (key, "key"), (value, "value")):
            _check_input(x, op, n, (2, 3))
        if _traced.tracing(query, key, value):  # torch.compile / torch.export: torch's ops around mha's
            if cache is not None:
                _traced._refuse(op, "cache")
            _, mode = _call_dtype(op, (query, key, value))
            return _traced.drop_in(self, query, key, value, key_padding_mask,
                                   _checks.flag(need_weights, op, "need_weights"), attn_mask,
                                   _checks.flag(average_attn_weights, op, "average_attn_weights"), is_causal,
                                   window, softcap, sinks, head_mask, mode or self._precision, alibi_slopes)
        named = self._named_params()
        params = [p for _, p in named]
        out_dtype, mode = _call_dtype(op, (query, key, value))
        precision = mode or self._precision
        query, key, value = _as_float32(query, key, value)
        batch_first = bool(self.batch_first)
        alibi_slopes = _alibi_numpy(op, alibi_slopes)
        sinks = _call_sinks(op, sinks, self.num_heads)
        if cache is not None:
            _check_cached(op, cache, [query, key, value, *params, *([] if sinks is None else [sinks])])
            if attn_mask is not None:
                raise ValueError(f"[{op}] attn_mask: a cached call takes none (its new positions are "
                                 "causal already); pass key_padding_mask over the cached and new keys")
            if self.training:
                raise ValueError(f"[{op}] cache: cached calls run in evaluation mode only (this module is "
                                 "in training mode); call eval() first")
            cm = self._cache_module()
            cm.sync(self._cache_pairs(named))
            impl = cm.impl
            impl.eval()
            impl.precision = precision
            impl.kernel = self._kernel
            impl.rotary = self._rotary
            gates = _call_gates(op, self.head_gates, head_mask, self.num_heads)
            kept = self._kept()
            if kept is not None and gates is not None:
                gates = gates[torch.tensor(kept, dtype=torch.long)]
            _cache_gates(impl, gates, self.num_heads if kept is None else len(kept))
            if kept is not None and sinks is not None:
                sinks = sinks[torch.tensor(kept, dtype=torch.long)]
            seq_first = query.dim() == 3 and not batch_first
            if seq_first:  # the cache's module is batch-first
                query, key, value = (t.transpose(0, 1) for t in (query, key, value))
            nq, nk, nv = _inputs_numpy(query, key, value)
            mask = _mask_numpy(key_padding_mask, "key_padding_mask")
            out = torch.from_numpy(impl(nq, nk, nv, mask, cache=cache, window=window, softcap=softcap,
                                        alibi_slopes=alibi_slopes, sinks=_sinks_numpy(sinks)))
            if seq_first:
                out = out.transpose(0, 1)
            return out.to(out_dtype), None
        kpm = _mask_numpy(key_padding_mask, "key_padding_mask")
        am = _mask_numpy(attn_mask, "attn_mask")
        need_weights = _checks.flag(need_weights, op, "need_weights")
        average = _checks.flag(average_attn_weights, op, "average_attn_weights")
        p = _dropout_p(op, "dropout", self.dropout) if self.training else 0.0
        return _drop_in_run(op, named, query, key, value, embed_dim=self.embed_dim, num_heads=self.num_heads,
                            batch_first=batch_first, add_zero_attn=bool(self.add_zero_attn), kpm=kpm, am=am,
                            need_weights=need_weights, average=average, is_causal=is_causal,
                            kernel=self._kernel, precision=precision, fully_masked=self._fully_masked_rows,
                            p=p, weights=self._weights, out_dtype=out_dtype, module=self,
                            gates=_call_gates(op, self.head_gates, head_mask, self.num_heads),
                            kept=self._kept(), masks=(key_padding_mask, attn_mask), window=window,
                            rotary=self._rotary, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks)

    def extra_repr(self):
        # nn.MultiheadAttention prints only its submodules; so does this one.
        return ""


def _drop_in_split(named, E):
    """nn.MultiheadAttention's projections from its parameters: [(weight, bias or None) for q, k, v,
    o], bias_k, bias_v; slices of in_proj_weight / in_proj_bias are views (no copy)."""
    d = dict(named)
    if "in_proj_weight" in d:
        w = d["in_proj_weight"]
        ws = [w[0:E], w[E:2 * E], w[2 * E:3 * E]]
    else:
        ws = [d["q_proj_weight"], d["k_proj_weight"], d["v_proj_weight"]]
    b = d.get("in_proj_bias")
    bs = [b[0:E], b[E:2 * E], b[2 * E:3 * E]] if b is not None else [None] * 3
    proj = list(zip(ws, bs)) + [(d["out_proj.weight"], d.get("out_proj.bias"))]
    return proj, d.get("bias_k"), d.get("bias_v")


def _kept_rows(kept, d):
    """The rows (of W_q, W_k, W_v; columns of W_o) of the kept heads, d wide each."""
    return torch.tensor([h * d + c for h in kept for c in range(d)], dtype=torch.long)


def _drop_in_layers(named, weights, E, add_zero_attn, op="mha.torch.MultiheadAttention", kept=None, d=0):
    """The layer tuple of one drop-in call (weights: the _Weights that versions the projections,
    or None: packed for this call alone). kept: the heads a pruned module keeps (their rows and
    columns are gathered, once per version of the parameters), or None."""
    for name, t in named:
        _check_param(op, name, t)
    proj, bias_k, bias_v = _drop_in_split(named, E)
    if kept is not None:
        rows = _kept_rows(kept, d)
        with torch.no_grad():
            proj = [(w[rows], None if b is None else b[rows]) for w, b in proj[:3]] + \
                   [(proj[3][0][:, rows].contiguous(), proj[3][1])]
            bias_k = None if bias_k is None else bias_k.reshape(-1)[rows]
            bias_v = None if bias_v is None else bias_v.reshape(-1)[rows]
    layers = []
    for i, (w, b) in enumerate(proj):
        version = weights.version(i, w) if weights is not None else 0
        layers.append((_float_array(w), None if b is None else _float_array(b), version))
    return (*layers, None if bias_k is None else _float_array(bias_k),
            None if bias_v is None else _float_array(bias_v), add_zero_attn, None)


def _scatter_rows(g, rows, n, columns=False):
    """g's rows (or columns) placed at `rows` of a zero array n rows (columns) long."""
    shape = list(g.shape)
    shape[1 if columns else 0] = n
    out = np.zeros(shape, np.float32)
    if columns:
        out[:, rows.numpy()] = g
    else:
        out[rows.numpy()] = g
    return out


def _drop_in_grads(names, ps, rest, kept=None, d=0, E=0):
    """The engine's gradients of a drop-in call, one per parameter (None where none is wanted); a
    pruned module's gradients are zero on the removed heads' rows and columns."""
    pg, gbk, gbv = rest[:3]
    if kept is not None:
        rows = _kept_rows(kept, d)
        pg = [None if x is None else _scatter_rows(x, rows, E) for x in pg[:6]] + \
             [_scatter_rows(pg[6], rows, E, columns=True), pg[7]]
        gbk = None if gbk is None else _scatter_rows(gbk, rows, E)
        gbv = None if gbv is None else _scatter_rows(gbv, rows, E)
    by_name = dict(zip(names, ps))
    g = {}
    if "in_proj_weight" in by_name:
        g["in_proj_weight"] = torch.from_numpy(np.concatenate([pg[0], pg[2], pg[4]]))
    else:
        g["q_proj_weight"], g["k_proj_weight"], g["v_proj_weight"] = (
            torch.from_numpy(pg[0]), torch.from_numpy(pg[2]), torch.from_numpy(pg[4]))
    if "in_proj_bias" in by_name:
        g["in_proj_bias"] = torch.from_numpy(np.concatenate([pg[1], pg[3], pg[5]]))
    g["out_proj.weight"] = torch.from_numpy(pg[6])
    if pg[7] is not None:
        g["out_proj.bias"] = torch.from_numpy(pg[7])
    if gbk is not None:
        g["bias_k"] = torch.from_numpy(gbk).reshape(by_name["bias_k"].shape)
        g["bias_v"] = torch.from_numpy(gbv).reshape(by_name["bias_v"].shape)
    return [g[n] if t.requires_grad else None for n, t in zip(names, ps)]


_FUNCTIONAL_STATE = _calls._CallState()  # spare buffers of the functional calls (their weights: per call)


def _kept_mask_slices(op, am, kept, num_heads):
    """A per-head attn_mask ((B*h, L, S), or (h, L, S) unbatched, h as built) cut to the kept heads."""
    if am is None or isinstance(am, _core.Mask) or np.ndim(am) != 3:
        if isinstance(am, _core.Mask) and len(am.shape) == 3:
            raise NotImplementedError(f"[{op}] attn_mask: a per-head mha.Mask on a module with pruned heads; "
                                      "pass the mask as a tensor")
        return am
    a = np.asarray(am)
    L, S = a.shape[1:]
    return np.ascontiguousarray(a.reshape(-1, num_heads, L, S)[:, kept].reshape(-1, L, S))


def _drop_in_run(op, named, query, key, value, *, embed_dim, num_heads, batch_first, add_zero_attn, kpm, am,
                 need_weights, average, is_causal, kernel, precision, fully_masked, p, weights, out_dtype,
                 module=None, gates=None, kept=None, masks=None, window=None, rotary=None, softcap=None,
                 alibi_slopes=None, sinks=None):
    """nn.MultiheadAttention's call on the parameters `named` ((name, tensor) in its order), through
    autograd when a gradient is wanted. weights: the module's _Weights, or None (a functional call)."""
    names = [n for n, _ in named]
    params = [t for _, t in named]
    state = weights.state if weights is not None else _FUNCTIONAL_STATE
    drop_key = _dropout_key(p)

    d = embed_dim // num_heads
    last = [None]  # the call's context (its dropout mask for differentiable weights)
    if kept is not None:
        if gates is not None:
            gates = gates[torch.tensor(kept, dtype=torch.long)]
        am = _kept_mask_slices(op, am, kept, num_heads)
        if sinks is not None:  # the kept heads' sinks (the others get a zero gradient through the gather)
            sinks = sinks[torch.tensor(kept, dtype=torch.long)]
    sinks_np = _sinks_numpy(sinks)

    def build(ps):
        return _drop_in_layers(list(zip(names, ps)), weights, embed_dim, add_zero_attn, op, kept, d)

    def forward(q, k, v, ps, for_backward, gates):
        nq, nk, nv = _inputs_numpy(q, k, v)
        layers = _with_gates(build(ps) if weights is None else weights.layers(ps, build), gates)
        out, w, context = _calls._torch_mha_forward(
            state, layers, nq, nk, nv,
            embed_dim, num_heads, batch_first, kpm, need_weights, am, average, is_causal, kernel, precision,
            fully_masked, for_backward, p, drop_key, p > 0.0, window, rotary, softcap=softcap,
            alibi_slopes=alibi_slopes, sinks=sinks_np)
        if context is not None and module is not None:
            object.__setattr__(module, "_last_context", context)  # a plain attribute: skip nn.Module's
        last[0] = context
        return out, w, context

    def layers(ps, w):
        return _drop_in_layers(list(zip(names, ps)), w, embed_dim, add_zero_attn, op, kept, d)

    call = _Call(state, forward, layers, lambda ps, rest: _drop_in_grads(names, ps, rest, kept, d, embed_dim), gates,
                 sinks)
    out, w = _run(call, query, key, value, params, need_weights)
    if w is not None and masks is not None and torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or any(t.requires_grad for t in params)
            or (sinks is not None and sinks.requires_grad)) \
            and not any(isinstance(m, _core.Mask) for m in masks):
        # The weights as a function of query, key and the projections, by torch's ops (their
        # values equal mha's to float32 rounding), so that a loss on them has gradients.
        w = _differentiable_weights(named, query, key, embed_dim, num_heads, batch_first, add_zero_attn,
                                    masks, is_causal, fully_masked, p, last[0], average, kept, window, rotary,
                                    softcap, alibi_slopes, sinks)
    if out_dtype != torch.float32:
        out = out.to(out_dtype)
        w = None if w is None else w.to(out_dtype)
    return out, w


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                                 in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight,
                                 out_proj_bias, training=True, key_padding_mask=None, need_weights=True,
                                 attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                                 average_attn_weights=True, is_causal=False):
    """torch.nn.functional.multi_head_attention_forward, computed and differentiated by mha.

    The same arguments and results as PyTorch's: query (L, N, E) or unbatched (L, E), key (S, N, kdim),
    value (S, N, vdim) (sequence-first, as the functional form always is); the projections given as
    in_proj_weight (3E, E) / in_proj_bias (3E,), or as q/k/v_proj_weight with
    use_separate_proj_weight=True; bias_k, bias_v (1, 1, E) or None; dropout on the weights when
    training. -> (attn_output shaped like query, attn_weights or None). Gradients reach every tensor
    argument that requires grad. The weights are packed for each call (a module's weights are packed
    once per version: prefer mha.torch.MultiheadAttention in a model). Differences from PyTorch 1.13 as
    mha.torch.MultiheadAttention's (a fully masked row gets zeros); static_k / static_v are not
    supported (NotImplementedError).
    """
    op = "mha.torch.multi_head_attention_forward"
    _refuse_tracing(op)
    embed_dim_to_check = _checks.integer(embed_dim_to_check, op, "embed_dim_to_check")
    num_heads = _checks.integer(num_heads, op, "num_heads")
    if num_heads < 1:
        raise ValueError(f"[{op}] num_heads: {num_heads}; wanted a positive integer")
    if num_heads > embed_dim_to_check > 0:
        raise ValueError(f"[{op}] num_heads: {num_heads} is more heads than embed_dim_to_check {embed_dim_to_check}")
    dropout_p = _checks.real(dropout_p, op, "dropout_p")
    add_zero_attn, training, need_weights, use_separate_proj_weight, average_attn_weights = (
        _checks.flag(v, op, n) for v, n in ((add_zero_attn, "add_zero_attn"), (training, "training"),
                                            (need_weights, "need_weights"),
                                            (use_separate_proj_weight, "use_separate_proj_weight"),
                                            (average_attn_weights, "average_attn_weights")))
    for n, t in (("in_proj_weight", in_proj_weight), ("in_proj_bias", in_proj_bias), ("bias_k", bias_k),
                 ("bias_v", bias_v), ("out_proj_weight", out_proj_weight), ("out_proj_bias", out_proj_bias),
                 ("q_proj_weight", q_proj_weight), ("k_proj_weight", k_proj_weight),
                 ("v_proj_weight", v_proj_weight), ("static_k", static_k), ("static_v", static_v)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise _checks.wrong_kind(op, n, t, "a torch.Tensor or None")
    if not isinstance(out_proj_weight, torch.Tensor):
        raise _checks.wrong_kind(op, "out_proj_weight", out_proj_weight, "a torch.Tensor")
    if static_k is not None or static_v is not None:
        raise NotImplementedError(f"[{op}] static_k / static_v: not supported by mha; pass the keys and "
                                  "values as key and value")
    for x, n in ((query, "query"), (key, "key"), (value, "value")):
        _check_input(x, op, n, (2, 3))
    embed_dim = int(query.shape[-1])
    if embed_dim != embed_dim_to_check:
        raise ValueError(f"[{op}] query: width {embed_dim}; wanted embed_dim_to_check {embed_dim_to_check}")
    named = []
    if use_separate_proj_weight:
        for n, t in (("q_proj_weight", q_proj_weight), ("k_proj_weight", k_proj_weight),
                     ("v_proj_weight", v_proj_weight)):
            if t is None:
                raise ValueError(f"[{op}] {n}: None with use_separate_proj_weight=True; wanted a tensor")
            named.append((n, t))
    else:
        if in_proj_weight is None:
            raise ValueError(f"[{op}] in_proj_weight: None with use_separate_proj_weight=False; wanted a "
                             "(3 * embed_dim, embed_dim) tensor")
        named.append(("in_proj_weight", in_proj_weight))
    if in_proj_bias is not None:
        named.append(("in_proj_bias", in_proj_bias))
    named.append(("out_proj.weight", out_proj_weight))
    if out_proj_bias is not None:
        named.append(("out_proj.bias", out_proj_bias))
    if (bias_k is None) != (bias_v is None):
        raise ValueError(f"[{op}] bias_k / bias_v: one given without the other; wanted both or neither")
    if bias_k is not None:
        named += [("bias_k", bias_k), ("bias_v", bias_v)]
    out_dtype, mode = _call_dtype(op, (query, key, value))
    query, key, value = _as_float32(query, key, value)
    p = _dropout_p(op, "dropout_p", dropout_p) if training else 0.0
    return _drop_in_run(op, named, query, key, value, embed_dim=embed_dim, num_heads=num_heads,
                        batch_first=False, add_zero_attn=bool(add_zero_attn),
                        kpm=_mask_numpy(key_padding_mask, "key_padding_mask"),
                        am=_mask_numpy(attn_mask, "attn_mask"),
                        need_weights=need_weights, average=average_attn_weights,
                        is_causal=is_causal, kernel=_core.Kernel.FUSED, precision=mode or "float32",
                        fully_masked=_core.FullyMaskedRows.ZEROS, p=p, weights=None, out_dtype=out_dtype,
                        masks=(key_padding_mask, attn_mask))


def replace_attention(model, **kwargs):
    """Swaps every torch.nn.MultiheadAttention inside `model` (in place) for an
    mha.torch.MultiheadAttention with the same options, the same Parameter objects (so optimisers
    built before keep working) and the same state-dict keys. kwargs go to the new modules
    (kernel=, precision=, fully_masked_rows=). torch's TransformerEncoder(Layer)s then run mha in
    eval mode under no_grad too (their fused path is never taken with mha's module).
    Returns {qualified name: the nn.MultiheadAttention replaced}; a model that is itself an
    nn.MultiheadAttention cannot be replaced in place (ValueError: build the drop-in instead).
    """
    op = "mha.torch.replace_attention"
    if not isinstance(model, nn.Module):
        raise _checks.wrong_kind(op, "model", model, "a torch.nn.Module")
    if type(model) is nn.MultiheadAttention:
        raise ValueError(f"[{op}] model: an nn.MultiheadAttention itself; wanted a model that contains "
                         "some (build mha.torch.MultiheadAttention and load its state_dict instead)")
    replaced = {}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not nn.MultiheadAttention:
                continue
            ours = MultiheadAttention(child.embed_dim, child.num_heads, dropout=child.dropout,
                                      bias=child.in_proj_bias is not None,
                                      add_bias_kv=child.bias_k is not None, add_zero_attn=child.add_zero_attn,
                                      kdim=child.kdim, vdim=child.vdim, batch_first=child.batch_first, **kwargs)
            for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                         "bias_k", "bias_v"):
                setattr(ours, name, getattr(child, name))
            ours.out_proj = child.out_proj
            ours.train(child.training)
            setattr(parent, child_name, ours)
            replaced[f"{parent_name}.{child_name}" if parent_name else child_name] = child
    return replaced


def _cache_gates(impl, gates, num_heads):
    """The cached call's module gets the call's head gates (all 1 without)."""
    g = np.ones(num_heads, np.float32) if gates is None else gates.detach().float().numpy()
    if not np.array_equal(impl.head_gates, g):
        impl.head_gates = g


def _call_gates(op, head_gates, head_mask, num_heads):
    """The (h,) float32 factors of a call's heads: the module's head_gates times the call's head_mask
    (either may be None), through torch ops so that both get gradients."""
    if head_mask is not None:
        if not isinstance(head_mask, torch.Tensor):
            raise _checks.wrong_kind(op, "head_mask", head_mask, f"a tensor of {num_heads} values (one per head)")
        if head_mask.numel() != num_heads:
            raise ValueError(f"[{op}] head_mask: shape {tuple(head_mask.shape)} has {head_mask.numel()} values; "
                             f"wanted one per head ({num_heads})")
        head_mask = head_mask.reshape(num_heads).float()
    if head_gates is None:
        return head_mask
    return head_gates if head_mask is None else head_gates * head_mask


def _call_sinks(op, sinks, num_heads):
    """A call's attention sinks as a (num_heads,) float32 tensor, or None. A tensor keeps its autograd
    graph (a learned sink is the caller's nn.Parameter: its gradient flows); anything else is read as
    an array. The values (finite) are checked by mha."""
    if sinks is None:
        return None
    if isinstance(sinks, torch.Tensor):
        if sinks.device.type != "cpu":
            raise _not_on_cpu(op, "sinks", sinks.device)
        if not sinks.dtype.is_floating_point:
            raise _checks.wrong_kind(op, "sinks", sinks, f"a floating tensor of {num_heads} logits (one per head)")
    else:
        sinks = torch.from_numpy(np.ascontiguousarray(_checks.real_array(sinks, op, "sinks"), np.float32))
    if sinks.dim() != 1:
        raise ValueError(f"[{op}] sinks: {sinks.dim()} dimensions; wanted one logit per head, shape (num_heads,)")
    if sinks.numel() != num_heads:
        raise ValueError(f"[{op}] sinks: {sinks.numel()} logits for {num_heads} heads; wanted one per query head")
    return sinks.float()


def _sinks_numpy(sinks):
    """The (h,) float32 array mha reads of a call's sinks tensor (or None)."""
    return None if sinks is None else np.ascontiguousarray(sinks.detach().numpy(), np.float32)


def _alibi_numpy(op, alibi_slopes):
    """ALiBi slopes as mha reads them (a tensor detached to an array; anything else as given)."""
    if isinstance(alibi_slopes, torch.Tensor):
        if alibi_slopes.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"[{op}] alibi_slopes: requires grad; mha gives ALiBi slopes no gradient "
                             "(FlashAttention neither): pass alibi_slopes.detach()")
        alibi_slopes = alibi_slopes.detach().float().cpu().numpy()
    return alibi_slopes


def _gates_property(doc):
    def get(self):
        return self.__dict__.get("_head_gates")

    def set(self, g):
        op = f"mha.torch.{type(self).__name__}.head_gates"
        if g is not None:
            if not isinstance(g, torch.Tensor):
                raise _checks.wrong_kind(op, "head_gates", g, f"a tensor of {self.num_heads} values or None")
            if tuple(g.shape) != (self.num_heads,) or g.dtype != torch.float32:
                raise ValueError(f"[{op}] head_gates: shape {tuple(g.shape)} dtype {g.dtype}; wanted a float32 "
                                 f"tensor of shape ({self.num_heads},)")
        self.__dict__["_head_gates"] = g

    return property(get, set, doc=doc)


_GATES_DOC = """(num_heads,) float32 tensor or None (all 1): each head's output is multiplied by its gate
before the output projection. Not a parameter (not in state_dict() or parameters()); give it
requires_grad=True and its .grad after backward() is each head's gradient importance."""
MultiHeadAttention.head_gates = _gates_property(_GATES_DOC)
MultiheadAttention.head_gates = _gates_property(_GATES_DOC)


def head_importance(module, loss_fn, method="gradient"):
    """Each head's importance for `loss_fn()` (a callable that runs the model, `module` inside it,
    and returns a scalar loss), as the d2l chapter's exercise asks:
    - "gradient": |d loss / d gate| with every gate at 1 (one forward and backward);
    - "ablation": loss with the head's gate at 0 minus the loss with all gates at 1 (one forward per
      head, without gradients).
    module: an mha.torch module; its head_gates are restored afterwards. -> (num_heads,) tensor."""
    op = "mha.torch.head_importance"
    if not isinstance(module, (MultiHeadAttention, MultiheadAttention)):
        raise _checks.wrong_kind(op, "module", module, "an mha.torch module")
    if method not in ("gradient", "ablation"):
        raise ValueError(f"[{op}] method: {method!r}; wanted 'gradient' or 'ablation'")
    saved = module.head_gates
    h = module.num_heads
    try:
        if method == "gradient":
            gates = torch.ones(h, requires_grad=True)
            module.head_gates = gates
            (g,) = torch.autograd.grad(loss_fn(), gates)
            return g.abs()
        with torch.no_grad():
            module.head_gates = torch.ones(h)
            base = float(loss_fn())
            out = torch.empty(h)
            for i in range(h):
                gates = torch.ones(h)
                gates[i] = 0.0
                module.head_gates = gates
                out[i] = float(loss_fn()) - base
            return out
    finally:
        module.head_gates = saved


def _differentiable_weights(named, query, key, E, H, batch_first, add_zero_attn, masks, is_causal, fully_masked,
                            p, context, average, kept, window=None, rotary=None, softcap=None, alibi_slopes=None,
                            sinks=None):
    """nn.MultiheadAttention's returned weights (after dropout, averaged or per head) recomputed with
    torch's ops from the call's query, key and parameters, with the call's masks, fully masked
    policy and mha's dropout mask: what mha returned, now differentiable."""
    kpm, am = (torch.from_numpy(np.asarray(m)) if m is not None and not isinstance(m, torch.Tensor) else m
               for m in masks)
    batched = query.dim() == 3
    qx, kx = query, key
    if not batched:
        qx, kx = qx.unsqueeze(0), kx.unsqueeze(0)
    elif not batch_first:
        qx, kx = qx.transpose(0, 1), kx.transpose(0, 1)
    proj, bias_k, _ = _drop_in_split(named, E)
    d = E // H
    (wq, bq), (wk, bk) = proj[0], proj[1]
    if kept is not None:
        rows = _kept_rows(kept, d)
        wq, wk = wq[rows], wk[rows]
        bq = None if bq is None else bq[rows]
        bk = None if bk is None else bk[rows]
        bias_k = None if bias_k is None else bias_k.reshape(-1)[rows]
    h = H if kept is None else len(kept)
    q = nn.functional.linear(qx, wq, bq)
    k = nn.functional.linear(kx, wk, bk)
    B, L, S = q.shape[0], q.shape[1], k.shape[1]
    if bias_k is not None:
        k = torch.cat([k, bias_k.reshape(1, 1, -1).expand(B, 1, -1)], 1)
    if add_zero_attn:
        k = torch.cat([k, k.new_zeros(B, 1, k.shape[2])], 1)
    Kt = k.shape[1]
    q = q.reshape(B, L, h, d).transpose(1, 2)
    k = k.reshape(B, Kt, h, d).transpose(1, 2)
    if rotary is not None:  # the S given keys only (mha/rotary.h)
        q = _rope(q, rotary.dims, rotary.base, rotary.interleaved)
        k = torch.cat([_rope(k[:, :, :S], rotary.dims, rotary.base, rotary.interleaved), k[:, :, S:]], 2)
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if softcap:  # Gemma 2's softcapping, then ALiBi, before the masks (mha/masks.h ScoreOptions)
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:  # only without appended keys (refused otherwise): Kt == S
        dist = (torch.arange(L)[:, None] + S - L - torch.arange(Kt)[None, :]).abs().float()
        s = s - torch.from_numpy(np.asarray(alibi_slopes, np.float32))[None, :, None, None] * dist
    if kpm is not None and not batched:
        kpm = kpm.unsqueeze(0)
    if am is not None and am.dim() == 3 and kept is not None:  # the kept heads' slices of a per-head mask
        am = am.reshape(-1, H, L, S)[:, torch.tensor(kept, dtype=torch.long)].reshape(-1, L, S)
    # Causality and the window count the S given keys; the appended ones
    # (bias_k, add_zero_attn) stay visible, as mha's kernels mask them
    # (src/nn/call_masks.cpp) and as torch pads attn_mask.
    masked, additive = _traced.score_masks(B, h, L, S, Kt, kpm, am, _traced.causal_kind(is_causal), window)
    if additive is not None:
        s = s + additive
    s = s.masked_fill(masked, float("-inf"))
    if sinks is not None:  # one more logit per head in the denominator, with no value: never a dead row
        sink = sinks.float().reshape(1, h, 1, 1).expand(B, h, L, 1)
        w = torch.softmax(torch.cat([s, sink], -1), -1)[..., :Kt]
    else:
        dead = torch.isneginf(s).all(-1, keepdim=True)
        w = torch.softmax(s.masked_fill(dead, 0.0), -1)
        fill = 0.0 if fully_masked == _core.FullyMaskedRows.ZEROS else 1.0 / Kt
        w = torch.where(dead, torch.full_like(w, fill), w)
    if p > 0.0 and context is not None:
        w = w * torch.from_numpy(context.dropout_mask)
    if average:
        w = w.mean(1)
    return w if batched else w.squeeze(0)


# mha.torch.distributed (python/mha/torch_distributed.py): importable as `import mha.torch.distributed`
# and as the attribute mha.torch.distributed, while mha.torch stays one file.
import sys as _sys  # noqa: E402
from . import torch_distributed as distributed  # noqa: E402
_sys.modules[__name__ + ".distributed"] = distributed
