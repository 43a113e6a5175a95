"""mha.torch.MultiHeadAttention: the d2l chapter's module (constructor, lazy
W_q, W_k, W_v, W_o, state-dict names, forward(queries, keys, values,
valid_lens)) computed and differentiated by mha; its DotProductAttention
holder of attention_weights; rotary embeddings' state. The package's
overview: python/mha/torch.py."""

import torch
from torch import nn

from . import _checks, _core
from . import _torch_traced as _traced
from ._torch_call import (
    _GATES_DOC, _CallMasks, _gates_property, _public_errors, _unexpected_keywords, _Call, _SharedModule, _alibi_numpy, _as_float32, _call_dtype, _call_gates,
    _call_sinks, _calls, _check_input, _check_param, _dropout_key, _dropout_p, _float_array, _inputs_numpy,
    _not_on_cpu, _refuse_scripting, _refuse_tracing, _run, _sinks_numpy, _with_gates)
from ._torch_cache import TensorKVCache, _CacheImpl, _cache_gates, _check_cached


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


class MultiHeadAttention(_SharedModule, nn.Module):
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
            raise _unexpected_keywords(op, kwargs)
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

    __prepare_scriptable__ = _refuse_scripting  # torch.jit.script calls it first
    _public = "mha.torch.MultiHeadAttention"

    def _width(self):
        return self.num_hiddens

    @property
    def rotary(self):
        """The rotary position embeddings on q and k (an mha.Rotary), or None (off)."""
        return self._rotary

    @rotary.setter
    def rotary(self, r):
        self._rotary = _core._to_rotary(r, "mha.torch.MultiHeadAttention.rotary",
                                        self.num_hiddens // self.original_num_heads)

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

    def _cache_module(self):
        if self._cache_impl is None:
            impl = _core.MultiHeadAttention(self.num_hiddens, self.original_num_heads, 0.0, self._bias)
            gone = [h for h in range(self.original_num_heads) if h not in self.kept_heads]
            if gone:
                impl.prune_heads(gone)
            self._cache_impl = _CacheImpl(impl)
        return self._cache_impl

    def forward(self, queries, keys, values, valid_lens=None, *, cache=None, head_mask=None, window=None,
                softcap=None, alibi_slopes=None, sinks=None, **unexpected):
        """(B, Q, Dq), (B, K, Dk), (B, K, Dv), valid_lens None|(B,)|(B, Q) -> (B, Q, num_hiddens);
        with cache= (an mha.KVCache of kv_cache()): the cached call of the n new positions,
        queries, keys, values (B, n, D*), in eval mode without gradients (class docstring).
        window, softcap, alibi_slopes, sinks: as mha.torch.MultiheadAttention's (a window makes
        masked scores -inf, as any mask does; the others keep the chapter's -1e6 fill); sinks is a
        (num_heads,) tensor whose gradient flows (a learned sink is your nn.Parameter, passed per
        call), the others get none. In cached calls: window over each row's keys, ALiBi from each
        new query's position."""
        op = "mha.torch.MultiHeadAttention"
        if unexpected:
            raise _unexpected_keywords(op, unexpected)
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
        if isinstance(cache, TensorKVCache):  # torch's ops around mha's cached operator, eager or traced
            _, mode = _call_dtype(op, (queries, keys, values))
            masks = _CallMasks(window=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks)
            return _traced.chapter_cached(self, queries, keys, values, valid_lens, cache, masks, head_mask,
                                          mode or self._precision)
        if _traced.tracing(queries, keys, values):  # torch.compile / torch.export: torch's ops around mha's
            if cache is not None:
                _traced._refuse(op, "cache")
            if window is not None or sinks is not None:
                _traced._refuse(op, "window / sinks")
            _, mode = _call_dtype(op, (queries, keys, values))
            masks = _CallMasks(window=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks)
            return _traced.chapter(self, queries, keys, values, valid_lens, masks, head_mask, mode or self._precision)
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
            with _public_errors(op, ("MultiHeadAttention",)):
                out = impl(nq, nk, nv, lens, cache=cache, window=window, softcap=softcap,
                           alibi_slopes=alibi_slopes, sinks=sinks_np)
            return torch.from_numpy(out).to(out_dtype)
        p = _dropout_p(op, "attention.dropout.p", self.attention.dropout.p) if self.training else 0.0
        key = _dropout_key(p)
        kernel, num_heads, rotary = self._kernel, self.num_heads, self._rotary
        weights = self._weights
        module = self
        # The window and score options beside the chapter's lengths: one value, checked here.
        masks = _calls.call_masks(op, window=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks_np)

        def forward(q, k, v, ps, for_backward, gates):
            nq, nk, nv = _inputs_numpy(q, k, v)
            layers = _with_gates(weights.layers(ps, lambda ps: module._call_layers(ps, weights)), gates)
            settings = _calls.call_settings(op, kernel=kernel, precision=precision, for_backward=for_backward,
                                            dropout_p=p, dropout_key=key, keep_context=True, rotary=rotary)
            out, context = _calls._chapter_forward(weights.state, layers, nq, nk, nv, lens, num_heads, masks,
                                                   settings)
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



MultiHeadAttention.head_gates = _gates_property(_GATES_DOC)
