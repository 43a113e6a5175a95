"""The modules' cached calls (cache=, python/mha/torch_chapter.py and
python/mha/torch_drop_in.py): an mha module owned by the torch module, whose
buffers get a copy of each Parameter that changed since the last cached call,
and the KV cache's checks. (A cache of tensors for compiled decoders:
python/mha/torch_kv_cache.py.)"""
import threading
import weakref

import numpy as np
import torch

from . import _checks, _core



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


def _cache_dtype(dtype):
    if dtype is torch.bfloat16:
        return "bfloat16"
    if dtype is torch.float32:
        return "float32"
    return dtype


def _cache_gates(impl, gates, num_heads):
    """The cached call's module gets the call's head gates (all 1 without)."""
    g = np.ones(num_heads, np.float32) if gates is None else gates.detach().float().numpy()
    if not np.array_equal(impl.head_gates, g):
        impl.head_gates = g



_CACHE_LOCKS = weakref.WeakKeyDictionary()  # TensorKVCache -> its lock (a Module attribute would not pickle)
_CACHE_LOCKS_LOCK = threading.Lock()


def tensor_cache_lock(cache):
    """The lock that serialises the eager cached calls on one TensorKVCache, so that threads sharing
    it append in turn (each call reads the lengths, writes its keys there and advances them)."""
    with _CACHE_LOCKS_LOCK:
        lock = _CACHE_LOCKS.get(cache)
        if lock is None:
            lock = _CACHE_LOCKS[cache] = threading.Lock()
        return lock


class TensorKVCache(torch.nn.Module):
    """A key/value cache held as torch tensors, for the modules' cached calls under torch.compile
    and torch.export (an mha.KVCache is a C++ object no graph can hold): buffers key and value
    (batch_size, max_len, num_kv_heads, head_dim) of float32 or bfloat16, and lengths (batch_size,)
    int64, the positions each row holds. Made by a module's tensor_kv_cache(); a cached call
    m(x, x, x, cache=c) writes the new keys and values at each row's length, attends through
    mha.torch.attention_with_kv_cache (causal over the new positions) and advances lengths. Being a
    Module, it can be an attribute of the model, so torch.export keeps it as mutated buffers.
    Threads may share one: its eager cached calls run one at a time (each appends its positions
    after the previous call's); a compiled or exported graph that writes it is the caller's to run
    from one thread at a time, as any graph that mutates a buffer."""

    def __init__(self, batch_size, max_len, num_kv_heads, head_dim, dtype=torch.float32):
        super().__init__()
        op = "mha.torch.TensorKVCache"
        sizes = [_checks.integer(v, op, n) for v, n in ((batch_size, "batch_size"), (max_len, "max_len"),
                                                        (num_kv_heads, "num_kv_heads"), (head_dim, "head_dim"))]
        if min(sizes) < 1:
            raise ValueError(f"[{op}] sizes: batch_size {sizes[0]}, max_len {sizes[1]}, num_kv_heads {sizes[2]}, "
                             f"head_dim {sizes[3]}; wanted each >= 1")
        if isinstance(dtype, str):
            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype, dtype)
        elif not isinstance(dtype, torch.dtype):
            raise _checks.wrong_kind(op, "dtype", dtype, "torch.float32 or torch.bfloat16")
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"[{op}] dtype: {dtype!r}; wanted torch.float32 or torch.bfloat16")
        B, L, H, d = sizes
        # Sized against mha's memory limit before anything is allocated, as mha's own caches are.
        need, limit = 2 * B * L * H * d * (4 if dtype == torch.float32 else 2), _core.memory_limit()
        if need > limit:
            names = ("batch_size", "max_len", "num_kv_heads", "head_dim")
            big = names[max(range(4), key=lambda i: sizes[i])]
            raise ValueError(f"[{op}] {big}: {sizes[names.index(big)]} makes keys and values of {need} bytes, above "
                             f"mha.memory_limit() ({limit}); wanted a smaller cache (or a larger limit)")
        self.register_buffer("key", torch.zeros(B, L, H, d, dtype=dtype))
        self.register_buffer("value", torch.zeros(B, L, H, d, dtype=dtype))
        self.register_buffer("lengths", torch.zeros(B, dtype=torch.int64))

    def reset(self):
        """Every row back to length 0 (the storage stays)."""
        self.lengths.zero_()
