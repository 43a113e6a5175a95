"""The modules' cached calls (cache=, python/mha/torch_chapter.py and
python/mha/torch_drop_in.py): an mha module owned by the torch module, whose
buffers get a copy of each Parameter that changed since the last cached call,
and the KV cache's checks. (A cache of tensors for compiled decoders:
python/mha/torch_kv_cache.py.)"""
import threading

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

