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
- The torch.nn.Parameters are the source of truth. After the first call the
  module's parameters share memory with mha's own buffers, so a call copies
  no weights and torch.optim's in-place updates reach mha directly. Where the
  layouts differ (nn.MultiheadAttention's packed in_proj_weight (3E, E), which
  mha keeps as three (E, E) blocks) the parameter is copied into mha once
  after each change (tracked by the tensor's version counter), not per call.
  A parameter whose storage was replaced (`.data = ...`, `.to()`,
  `copy.deepcopy`) is linked again at the next call.
- mha packs each weight for its matrix products once per change, found by
  the parameters' version counters: writes through torch (torch.optim,
  in-place ops under no_grad, nn.init) are seen. A write the counter does not
  see (in place on `.data`, or through a numpy view of the storage; autograd
  does not see it either) needs `module.parameters_written()` before the
  next call, or the call reads the weights as they were.
- Gradients come from mha's backward through torch.autograd.Function: input
  and parameter gradients (parameters' accumulate into .grad as torch's do),
  with the call's masks and dropout mask. A module called several times
  before backward (a shared layer) redoes the earlier call's forward, with
  the same dropout mask, before that call's backward.
- Dropout masks are drawn by mha from a seed taken from torch's generator,
  so torch.manual_seed makes them repeatable; they are not torch's masks.
- Inputs: CPU float32 tensors, contiguous or not (a non-contiguous one costs
  one more copy). float64, float16 and bfloat16 inputs raise TypeError (mha
  computes in float32: convert with .float()); CUDA tensors raise ValueError.
- Under torch.no_grad() / inference_mode(), or when nothing requires grad, no
  graph is built; in eval mode mha then keeps nothing for backward (in
  training mode with dropout it keeps its last call, as it always does).
- Threads: torch's and mha's pools are separate (torch.set_num_threads,
  mha.set_num_threads); with more than one thread, run with
  OMP_WAIT_POLICY=PASSIVE so that neither spins while the other computes.
- attention_weights are those of mha's last forward: the last call, unless a
  backward redid an earlier call's forward since.
"""

import numpy as np
import torch
from torch import nn

from . import _checks, _core

__all__ = ["MultiHeadAttention", "MultiheadAttention"]


def _not_on_cpu(op, name, device):
    """The error for a tensor on another device (docs/errors.md, torch.device)."""
    return ValueError(f"[{op}] {name}: a tensor on {device}; mha.torch computes on the CPU "
                      "only (the CUDA path does not exist yet): pass x.cpu()")


def _check_input(x, op, name, ndims):
    """A CPU float32 tensor of one of the ranks in ndims, or an error that says why not."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"[{op}] {name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise _not_on_cpu(op, name, x.device)
    if x.dtype != torch.float32:
        raise TypeError(f"[{op}] {name}: dtype {x.dtype}; mha computes in float32: pass x.float() "
                        "(float64, float16 and bfloat16 are not converted silently)")
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


class _Link:
    """Keeps torch parameters and an mha module's buffers in step.

    shared: {torch name: (Parameter, numpy view)}: the Parameter's storage is
    the view's (set on link); a Parameter found elsewhere (storage replaced) is
    copied into the view and pointed at it again.
    packed: {torch name: (Parameter, [views])}: the Parameter's rows are the
    views stacked; copied in when its version or storage changes.
    """

    def __init__(self, impl):
        self.impl = impl
        self.shared = {}
        self.packed = {}
        self.seen = {}  # packed name -> (data_ptr, version) last copied
        self.versions = None  # the shared parameters' (data_ptr, version) at the last call

    def share(self, name, param, view):
        # Outside inference mode: a parameter must stay a normal tensor
        # (autograd refuses to save inference tensors).
        with torch.inference_mode(False), torch.no_grad():
            t = torch.from_numpy(view)
            t.copy_(param.detach())
            param.data = t
        self.shared[name] = (param, view)

    def pack(self, name, param, views):
        self.packed[name] = (param, views)
        self.seen.pop(name, None)

    def forget(self):
        """Forget what was seen: the next sync copies every packed parameter and has mha repack."""
        self.seen = {}
        self.versions = None

    def sync(self):
        """Before a call: every parameter's current values are in mha, and mha
        knows which changed (it packs each weight once per version)."""
        written = False
        for name, (param, view) in self.shared.items():
            if param.data_ptr() != view.ctypes.data:
                if param.dtype != torch.float32 or param.device.type != "cpu":
                    raise TypeError(f"parameter {name}: {param.dtype} on {param.device}; mha.torch "
                                    "keeps float32 parameters on the CPU")
                self.share(name, param, view)
        versions = tuple((p.data_ptr(), p._version) for p, _ in self.shared.values())
        if versions != self.versions:
            self.versions = versions
            written = True
        for name, (param, views) in self.packed.items():
            key = (param.data_ptr(), param._version)
            if self.seen.get(name) == key:
                continue
            if param.dtype != torch.float32 or param.device.type != "cpu":
                raise TypeError(f"parameter {name}: {param.dtype} on {param.device}; mha.torch "
                                "keeps float32 parameters on the CPU")
            rows = 0
            with torch.no_grad():
                for view in views:
                    n = view.shape[0]
                    torch.from_numpy(view).copy_(param.detach()[rows:rows + n])
                    rows += n
            self.seen[name] = key
            written = True
        if written:
            self.impl._parameters_written()


class _Call:
    """One forward call: what a backward needs to redo it if mha's saved state
    is another call's (the module was called again before this backward)."""

    def __init__(self, runner, args, seed, dropout):
        self.runner, self.args, self.seed, self.dropout = runner, args, seed, dropout


class _Runner:
    """Runs calls on an mha module and remembers which call its saved state is."""

    def __init__(self, impl, call_fn):
        self.impl = impl
        self.call_fn = call_fn  # (impl, numpy q, k, v, extra) -> (output ndarray, weights or None)
        self.last = None        # the _Call whose state mha holds for backward
        self.dropout = None

    def run(self, call, q, k, v, keep):
        """keep: run in training mode so that mha keeps the call for backward."""
        impl = self.impl
        if self.dropout != call.dropout:
            impl._set_dropout(call.dropout)
            self.dropout = call.dropout
        if keep or call.dropout > 0:
            impl.train(True)
        else:
            impl.eval()
        if call.seed is not None:
            impl._reseed(call.seed)
        nq, nk, nv = _inputs_numpy(q, k, v)
        result = self.call_fn(impl, nq, nk, nv, call.args)
        self.last = call if (keep or call.dropout > 0) else None
        return result


class _AttentionFunction(torch.autograd.Function):
    """forward(call, q, k, v, *params) -> (output, weights or empty); backward by mha."""

    @staticmethod
    def forward(ctx, call, link, q, k, v, *params):
        out, weights = call.runner.run(call, q, k, v, keep=True)
        ctx.call, ctx.link = call, link
        ctx.save_for_backward(q, k, v, *params)
        out = torch.from_numpy(out)
        if weights is None:
            weights = torch.empty(0)
        else:
            weights = torch.from_numpy(weights)
        ctx.mark_non_differentiable(weights)
        return out, weights

    @staticmethod
    def backward(ctx, grad_out, _grad_weights):
        call, link = ctx.call, ctx.link
        saved = ctx.saved_tensors  # raises if a parameter or input changed in place since forward
        q, k, v = saved[:3]
        runner = call.runner
        if runner.last is not call:
            # mha holds another call's state: redo this one, same dropout mask.
            link.sync()
            runner.run(call, q, k, v, keep=True)
        impl = runner.impl
        impl.zero_grad()
        g = grad_out.detach()
        if g.dtype != torch.float32:
            g = g.float()
        (gq, gk, gv), pgrads = impl.backward(g.numpy())
        grads = [torch.from_numpy(gq), torch.from_numpy(gk), torch.from_numpy(gv)]
        names = call.param_names
        for name, p in zip(names, saved[3:]):
            grads.append(torch.from_numpy(pgrads[name]).reshape(p.shape) if p.requires_grad else None)
        return (None, None, *grads)


def _run(module, call, link, q, k, v, params):
    """Output (and weights) of one call, through autograd when a gradient is wanted."""
    link.sync()
    need_grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or any(p.requires_grad for p in params))
    if need_grad:
        out, weights = _AttentionFunction.apply(call, link, q, k, v, *params)
        return out, (None if weights.numel() == 0 and call.no_weights else weights)
    out, weights = call.runner.run(call, q, k, v, keep=False)
    return torch.from_numpy(out), (None if weights is None else torch.from_numpy(weights))


def _dropout_seed(training, p):
    """A seed for mha's dropout stream, drawn from torch's generator (None without dropout)."""
    if not training or p <= 0.0:
        return None
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())


def _check_cached(op, cache, tensors):
    """cache is an mha.KVCache, and the call needs no gradient (cached calls have no backward)."""
    if not isinstance(cache, _core.KVCache):
        raise _checks.wrong_kind(op, "cache", cache, "an mha.KVCache (made by this module's kv_cache())")
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise ValueError(f"[{op}] cache: cached calls have no backward; run them under torch.no_grad() "
                         "or torch.inference_mode() (a parameter or input requires grad)")


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
    gradients and optimiser steps stay float32; default 'float32').

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
        if kwargs:
            raise TypeError(f"[{op}] unexpected keyword arguments: {', '.join(sorted(kwargs))}")
        self.num_heads = num_heads
        self.num_hiddens = num_hiddens
        self.attention = DotProductAttention(dropout, self)
        self.W_q = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_k = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_v = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_o = nn.LazyLinear(num_hiddens, bias=bias)
        self._bias = bias
        self._kernel = kernel
        self._precision = precision
        self._make_impl()

    def _make_impl(self):
        impl = _core.MultiHeadAttention(self.num_hiddens, self.num_heads, 0.0, self._bias,
                                        precision=self._precision)
        if self._kernel is not None:
            impl.kernel = self._kernel
        self._impl = impl
        self._link = None
        self._runner = _Runner(impl, _call_chapter)

    def __getstate__(self):  # copy.deepcopy / pickle: mha's module is rebuilt, then linked
        state = dict(self.__dict__)
        for k in ("_impl", "_link", "_runner"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._make_impl()

    @property
    def kernel(self):
        """mha's attention implementation (mha.Kernel)."""
        return self._impl.kernel

    @kernel.setter
    def kernel(self, k):
        self._kernel = k
        self._impl.kernel = k

    @property
    def precision(self):
        """The matrix products' format: 'float32' or 'bfloat16'."""
        return self._impl.precision

    @precision.setter
    def precision(self, p):
        p = _checks.precision(p, "mha.torch.MultiHeadAttention.precision")
        self._impl.precision = p
        self._precision = p

    def parameters_written(self):
        """Tell mha that parameters were written where torch's version counter does not see it
        (in place on ``.data``, or through a numpy view of their storage): the next call copies
        and repacks them. Writes through torch (optimisers, in-place ops, nn.init) need nothing."""
        if self._link is not None:
            self._link.forget()

    def _layers(self):
        return (("W_q", self.W_q), ("W_k", self.W_k), ("W_v", self.W_v), ("W_o", self.W_o))

    def _materialise(self, queries, keys, values):
        """torch's lazy initialisation, as the chapter's first call does it (same draws, same order)."""
        for layer, x in ((self.W_q, queries), (self.W_k, keys), (self.W_v, values),
                         (self.W_o, queries.new_empty((0, self.num_hiddens)))):
            if isinstance(layer, nn.modules.lazy.LazyModuleMixin):
                layer._infer_parameters(layer, (x,))  # what torch's pre-forward hook does
                layer.in_features = layer.weight.shape[1]  # also after a load_state_dict

    def _ensure_link(self, queries, keys, values):
        if self._link is not None:
            return
        with torch.inference_mode(False):  # parameters stay normal tensors
            self._materialise(queries, keys, values)
        W = dict(self._layers())
        self._impl.initialize(W["W_q"].weight.shape[1], W["W_k"].weight.shape[1], W["W_v"].weight.shape[1])
        link = _Link(self._impl)
        views = self._impl._parameter_views()
        for name, layer in self._layers():
            for pname in ("weight", "bias"):
                p = getattr(layer, pname, None)
                if p is not None:
                    link.share(f"{name}.{pname}", p, views[f"{name}.{pname}"])
        self._link = link

    def _params(self):
        return [p for _, layer in self._layers() for p in
                ((layer.weight, layer.bias) if layer.bias is not None else (layer.weight,))]

    def kv_cache(self, batch_size, max_len, dtype="float32"):
        """An mha.KVCache of batch_size rows of max_len positions for this module's cached calls,
        forward(x, x, x, cache=cache); dtype 'float32' or 'bfloat16'."""
        return self._impl.kv_cache(batch_size, max_len, dtype)

    def forward(self, queries, keys, values, valid_lens=None, *, cache=None):
        """(B, Q, Dq), (B, K, Dk), (B, K, Dv), valid_lens None|(B,)|(B, Q) -> (B, Q, num_hiddens);
        with cache= (an mha.KVCache of kv_cache()): the cached call of the n new positions,
        queries, keys, values (B, n, D*), in eval mode without gradients (class docstring)."""
        op = "mha.torch.MultiHeadAttention"
        for x, n in ((queries, "queries"), (keys, "keys"), (values, "values")):
            _check_input(x, op, n, (3,))
        lens = None
        if valid_lens is not None:
            if isinstance(valid_lens, torch.Tensor):
                if valid_lens.device.type != "cpu":
                    raise _not_on_cpu(op, "valid_lens", valid_lens.device)
                lens = valid_lens.detach().numpy()
            else:
                lens = _checks.real_array(valid_lens, op, "valid_lens")
        self._ensure_link(queries, keys, values)
        if cache is not None:
            _check_cached(op, cache, [queries, keys, values, *self._params()])
            self._link.sync()
            self._impl.train(self.training)  # a training-mode module's cached call is refused by mha
            nq, nk, nv = _inputs_numpy(queries, keys, values)
            return torch.from_numpy(self._impl(nq, nk, nv, lens, cache=cache))
        p = float(self.attention.dropout.p)
        call = _Call(self._runner, lens, _dropout_seed(self.training, p), p if self.training else 0.0)
        call.param_names = [n for n, layer in self._layers() for n in
                            ((n + ".weight", n + ".bias") if layer.bias is not None else (n + ".weight",))]
        call.no_weights = True
        out, _ = _run(self, call, self._link, queries, keys, values, self._params())
        return out

    @property
    def attention_weights(self):
        """(B, num_heads, Q, K): the last call's softmax weights before dropout (None before a call)."""
        w = self._impl.attention_weights
        return torch.from_numpy(w) if w.ndim == 4 else None


def _call_chapter(impl, q, k, v, lens):
    return impl(q, k, v, lens), None


class _TorchCallArgs:
    __slots__ = ("key_padding_mask", "need_weights", "attn_mask", "average_attn_weights", "is_causal")


def _call_torch(impl, q, k, v, a):
    return impl(q, k, v, key_padding_mask=a.key_padding_mask, need_weights=a.need_weights,
                attn_mask=a.attn_mask, average_attn_weights=a.average_attn_weights,
                is_causal=a.is_causal)


class MultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention, computed and differentiated by mha.

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                       add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
                       device=None, dtype=None, *, fully_masked_rows=mha.FullyMaskedRows.ZEROS,
                       kernel=None, precision='float32')

    The same parameters, names, initialisation (torch's, from torch's generator)
    and state dict as nn.MultiheadAttention, so either's state dict loads into
    the other and it can replace TransformerEncoderLayer(...).self_attn.

    forward(query, key, value, key_padding_mask=None, need_weights=True,
            attn_mask=None, average_attn_weights=True, is_causal=False)
        -> (attn_output, attn_weights or None)
    query (B, L, E) if batch_first else (L, B, E), or unbatched (L, E); key
    (.., S, kdim), value (.., S, vdim); key_padding_mask (B, S) or (S,);
    attn_mask (L, S) or (B*num_heads, L, S); a boolean mask means True = masked
    out, a floating one is added to the scores. attn_output is shaped like query;
    attn_weights (B, L, S) averaged over heads or (B, num_heads, L, S) (S + 1 with
    bias_k/bias_v, + 1 with add_zero_attn). Differences from PyTorch 1.13: a row
    whose every key is masked gets fully_masked_rows (zeros by default), not NaN;
    is_causal=True always applies the causal mask; the weights are not
    differentiable and masks get no gradient. precision='bfloat16' ('bf16')
    runs the projections' products in bfloat16 with float32 sums and rounds
    q, k, v to bfloat16; attention, parameters, gradients and optimiser steps
    stay float32.

    Note: in eval mode under no_grad, torch's TransformerEncoderLayer may skip
    self_attn.forward for its own fused kernel, reading these same parameters.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, fully_masked_rows=None, kernel=None, precision="float32"):
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
        if dtype is not None and dtype != torch.float32:
            raise TypeError(f"[mha.torch.MultiheadAttention] dtype {dtype}: mha computes in float32")
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
        self._qkv_same_embed_dim = ref._qkv_same_embed_dim
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
        self._fully_masked_rows = fully_masked_rows
        self._kernel = kernel
        self._precision = _checks.precision(precision, op)
        self._impl = None
        self._link = None
        self._runner = None

    def __getstate__(self):
        state = dict(self.__dict__)
        for k in ("_impl", "_link", "_runner"):
            state[k] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)

    def _named_params(self):
        """(torch state-dict name, Parameter) in nn.MultiheadAttention's order."""
        out = []
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"):
            p = getattr(self, name)
            if p is not None:
                out.append((name, p))
        out.append(("out_proj.weight", self.out_proj.weight))
        if self.out_proj.bias is not None:
            out.append(("out_proj.bias", self.out_proj.bias))
        for name in ("bias_k", "bias_v"):
            p = getattr(self, name)
            if p is not None:
                out.append((name, p))
        return out

    def _ensure_impl(self):
        if self._impl is not None:
            return
        named = self._named_params()
        for name, p in named:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError(f"[mha.torch.MultiheadAttention] parameter {name}: {p.dtype} on "
                                f"{p.device}; mha keeps float32 parameters on the CPU")
        state = {n: p.detach().numpy() for n, p in named}
        kw = {}
        if self._fully_masked_rows is not None:
            kw["fully_masked_rows"] = self._fully_masked_rows
        impl = _core.TorchMultiheadAttention.from_state_dict(
            state, self.num_heads, batch_first=self.batch_first, kdim=self.kdim, vdim=self.vdim,
            add_zero_attn=self.add_zero_attn, dropout=0.0, **kw)
        if self._kernel is not None:
            impl.kernel = self._kernel
        impl.precision = self._precision
        views = impl._parameter_views()
        link = _Link(impl)
        for name, p in named:
            if name in views:
                link.share(name, p, views[name])
            elif name == "in_proj_weight":
                link.pack(name, p, [views["q_proj_weight"], views["k_proj_weight"], views["v_proj_weight"]])
            elif name == "in_proj_bias":
                link.pack(name, p, [views["q_proj_bias"], views["k_proj_bias"], views["v_proj_bias"]])
            else:  # pragma: no cover - a name mha does not know
                raise RuntimeError(f"mha.torch.MultiheadAttention: no buffer for {name}")
        self._impl, self._link = impl, link
        self._runner = _Runner(impl, _call_torch)

    @property
    def kernel(self):
        """mha's attention implementation (mha.Kernel)."""
        self._ensure_impl()
        return self._impl.kernel

    @kernel.setter
    def kernel(self, k):
        self._kernel = k
        if self._impl is not None:
            self._impl.kernel = k

    def parameters_written(self):
        """Tell mha that parameters were written where torch's version counter does not see it
        (in place on ``.data``, or through a numpy view of their storage): the next call copies
        and repacks them. Writes through torch (optimisers, in-place ops, nn.init) need nothing."""
        if self._link is not None:
            self._link.forget()

    @property
    def precision(self):
        """The matrix products' format: 'float32' or 'bfloat16'."""
        self._ensure_impl()
        return self._impl.precision

    @precision.setter
    def precision(self, p):
        p = _checks.precision(p, "mha.torch.MultiheadAttention.precision")
        if self._impl is not None:
            self._impl.precision = p
        self._precision = p

    def kv_cache(self, batch_size, max_len, dtype="float32"):
        """An mha.KVCache of batch_size rows of max_len positions for this module's cached calls,
        forward(x, x, x, cache=cache); dtype 'float32' or 'bfloat16'."""
        self._ensure_impl()
        return self._impl.kv_cache(batch_size, max_len, dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, *, cache=None):
        """(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
        average_attn_weights=True, is_causal=False, *, cache=None) -> (attn_output,
        attn_weights or None); shapes in the class docstring. With cache= (an mha.KVCache of
        kv_cache()): the cached call of the n new positions (eval mode, no gradients, causal
        over the new positions, no attn_mask; key_padding_mask over the cached and new keys),
        -> (attn_output, None)."""
        op = "mha.torch.MultiheadAttention"
        for x, n in ((query, "query"), (key, "key"), (value, "value")):
            _check_input(x, op, n, (2, 3))
        self._ensure_impl()
        if cache is not None:
            _check_cached(op, cache, [query, key, value, *(p for _, p in self._named_params())])
            if attn_mask is not None:
                raise ValueError(f"[{op}] attn_mask: a cached call takes none (its new positions are "
                                 "causal already); pass key_padding_mask over the cached and new keys")
            self._link.sync()
            self._impl.train(self.training)
            nq, nk, nv = _inputs_numpy(query, key, value)
            mask = _mask_numpy(key_padding_mask, "key_padding_mask")
            return torch.from_numpy(self._impl(nq, nk, nv, mask, cache=cache)), None
        a = _TorchCallArgs()
        a.key_padding_mask = _mask_numpy(key_padding_mask, "key_padding_mask")
        a.attn_mask = _mask_numpy(attn_mask, "attn_mask")
        a.need_weights = _checks.flag(need_weights, op, "need_weights")
        a.average_attn_weights = _checks.flag(average_attn_weights, op, "average_attn_weights")
        a.is_causal = is_causal
        p = float(self.dropout)
        call = _Call(self._runner, a, _dropout_seed(self.training, p), p if self.training else 0.0)
        call.param_names = [n for n, _ in self._named_params()]
        call.no_weights = not need_weights
        out, weights = _run(self, call, self._link, query, key, value,
                            [p for _, p in self._named_params()])
        return out, weights

    def extra_repr(self):
        # nn.MultiheadAttention prints only its submodules; so does this one.
        return ""
