"""What mha.torch's two modules share for a call (python/mha/torch_chapter.py,
python/mha/torch_drop_in.py): input checks in torch's words, the Parameters
read in place and packed once per version (_Weights), the call's autograd
Function that keeps the C++ context (_AttentionFunction), dropout keys from
torch's generator, the per-call options (head gates, sinks, ALiBi) and the value that carries a
call's masks and score options (_CallMasks)."""
import dataclasses
import numbers
import threading

import numpy as np
import torch

from . import _checks, _core
from ._torch_cache import TensorKVCache, _cache_dtype

_calls = _core._torch_calls


@dataclasses.dataclass
class _CallMasks:
    """What one module call masks and scores with, gathered once at its edge (a module's forward or
    the functional form): the masks as the caller gave them (the traced calls and the differentiable
    weights read them), their arrays, is_causal, the window, the score options and the fully-masked
    policy (the chapter's module: the window and score options only). The eager calls convert them
    for mha once (_calls.call_masks, which checks them)."""
    given: tuple = (None, None)  # (key_padding_mask, attn_mask) as given
    kpm: object = None           # their arrays (_mask_numpy)
    am: object = None
    is_causal: object = False
    window: object = None
    softcap: object = None
    alibi_slopes: object = None
    sinks: object = None         # (num_heads,) tensor or None: its gradient flows
    fully_masked: object = _core.FullyMaskedRows.ZEROS


# The two modules' names are one letter apart; each takes arguments the other does not.
_DROP_IN_NAMES = frozenset(("embed_dim", "batch_first", "kdim", "vdim", "add_bias_kv", "add_zero_attn", "device",
                            "dtype", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
                            "is_causal"))
_CHAPTER_NAMES = frozenset(("num_hiddens", "valid_lens"))


def _unexpected_keywords(op, names):
    """The TypeError for keywords a module does not take, with the other module's name when they are
    its arguments (mha.torch.MultiHeadAttention: the d2l chapter's; MultiheadAttention: the drop-in)."""
    names = sorted(names)
    msg = f"[{op}] unexpected keyword arguments: {', '.join(names)}"
    chapter = op.endswith("MultiHeadAttention")
    if chapter and _DROP_IN_NAMES.intersection(names):
        msg += ("; they are nn.MultiheadAttention's: its drop-in is mha.torch.MultiheadAttention (lower-case "
                "h); this is the d2l chapter's module, MultiHeadAttention(num_hiddens, num_heads, dropout, "
                "bias=False), called as (queries, keys, values, valid_lens)")
    elif not chapter and _CHAPTER_NAMES.intersection(names):
        msg += ("; they are the d2l chapter's module's: mha.torch.MultiHeadAttention (capital H); this is the "
                "drop-in for torch.nn.MultiheadAttention, whose padding is key_padding_mask (B, S), True = "
                "masked")
    return TypeError(msg)


def _kept_slopes(op, alibi_slopes, kept, num_heads):
    """ALiBi slopes of a drop-in with pruned heads: one per head as built (the rule sinks and head_mask
    follow: heads keep their numbers after prune_heads), the kept heads' taken; as given otherwise."""
    if kept is None or alibi_slopes is None:
        return alibi_slopes
    a = _checks.real_array(alibi_slopes, op, "alibi_slopes").astype(np.float32).reshape(-1)
    if a.size != num_heads:
        raise ValueError(f"[{op}] alibi_slopes: {a.size} slopes for the module's {num_heads} heads; wanted one per "
                         "head as built (heads keep their numbers after prune_heads; the pruned heads' slopes "
                         "are not used)")
    return np.ascontiguousarray(a[list(kept)])


class _public_errors:
    """Re-raises an mha error of the C++ module behind a torch module under the torch module's name
    (a cached call runs an internal mha.TorchMultiheadAttention or mha.MultiHeadAttention)."""

    def __init__(self, op, internal):
        self.op, self.internal = op, internal

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or not isinstance(e, (ValueError, TypeError)):
            return False
        text = str(e)
        for name in self.internal:
            if text.startswith(f"[{name}"):
                text = f"[{self.op}" + text[len(name) + 1:]
                text = text.replace(f"[{self.op}.forward]", f"[{self.op}]", 1)
                break
        else:
            return False
        raise type(e)(text) from None


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
        if m.dtype != torch.bool and not m.is_floating_point():
            raise ValueError(f"[mha.torch.MultiheadAttention] {name}: dtype {m.dtype} is neither bool nor floating; "
                             "wanted a boolean mask (mask.bool(): True = masked) or an additive one")
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


def _as_float32(*xs):
    """The inputs as float32 (a differentiable conversion for bfloat16 and float16)."""
    if all(x.dtype == torch.float32 for x in xs):
        return xs
    out = []
    for x in xs:
        done = next((o for y, o in zip(xs, out) if y is x), None)  # one tensor passed twice stays one
        out.append(done if done is not None else (x if x.dtype == torch.float32 else x.float()))
    return out


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


def _rotary_state(r):
    """An mha.Rotary as plain values for pickle / deepcopy (None stays None)."""
    return None if r is None else {"dims": r.dims, "base": r.base, "interleaved": r.interleaved}


def _rotary_of_state(r):
    return r if r is None or isinstance(r, _core.Rotary) else _core.Rotary(r["dims"], r["base"], r["interleaved"])


class _SharedModule:
    """What both modules (torch_chapter.MultiHeadAttention, torch_drop_in.MultiheadAttention) hold
    alike: mha's per-module state (packed weights, the cached calls' module, the last context) and
    how pickle and deepcopy remake it, the kernel and precision settings, parameters_written and
    kv_cache. `_public` names the class in errors."""
    _public = "mha.torch"

    def _make_state(self):
        self._weights = _Weights()
        self._cache_impl = None
        self._last_context = None

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
            raise _checks.wrong_kind(f"{self._public}.kernel", "kernel", k, "an mha.Kernel")
        self._kernel = k

    @property
    def precision(self):
        """The matrix products' format: 'float32' or 'bfloat16'."""
        return self._precision

    @precision.setter
    def precision(self, p):
        self._precision = _checks.precision(p, f"{self._public}.precision")

    def parameters_written(self):
        """Tell mha that parameters were written where torch's version counter does not see it
        (in place on ``.data``, or through a numpy view of their storage): the next call repacks
        them. Writes through torch (optimisers, in-place ops, nn.init) and replaced or tied
        Parameters need nothing: every call reads the Parameters the module has then."""
        self._weights.forget()
        if self._cache_impl is not None:
            self._cache_impl.forget()

    def tensor_kv_cache(self, batch_size, max_len, dtype=torch.float32):
        """An mha.torch.TensorKVCache of batch_size rows of max_len positions for this module's cached
        calls, forward(x, x, x, cache=cache): torch tensors, so that the calls compile with
        fullgraph=True and export (an mha.KVCache from kv_cache() runs eagerly only)."""
        H = self.num_heads
        return TensorKVCache(batch_size, max_len, H, self._width() // H, dtype)

    def kv_cache(self, batch_size, max_len, dtype="float32", window=None):
        """An mha.KVCache of batch_size rows of max_len positions for this module's cached calls,
        forward(x, x, x, cache=cache); dtype 'float32' or 'bfloat16' (or torch.float32 /
        torch.bfloat16). window=w (>= 0): a ring buffer of w + max_len slots for calls with
        window=(left, right), 0 <= left <= w, of at most max_len new positions each."""
        if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral)):
            raise _checks.wrong_kind(f"{self._public}.kv_cache", "window", window,
                                     "None or an integer >= 0 (a ring buffer's window)")
        return self._cache_module().impl.kv_cache(batch_size, max_len, _cache_dtype(dtype), window)
