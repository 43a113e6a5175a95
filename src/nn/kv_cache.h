// src/nn/kv_cache.h: the modules' side of mha::KVCache (mha/kv_cache.h):
// making a cache for a module, checking that a cached call fits it, writing
// projected keys and values into it, and pointing the decode kernel at it.
#pragma once

#include <cstdint>

#include "kernels/params.h"
#include "mha/kv_cache.h"
#include "mha/tensor.h"

namespace mha::nn {

// What a module says about itself to its caches.
struct CacheOwner {
  const char* module = "";  // "MultiHeadAttention" / "TorchMultiheadAttention"
  uint64_t owner = 0;       // its instance number
  int64_t Hkv = 0, d = 0;   // key/value heads and head width now
};

struct CacheAccess {
  // A cache of batch_size rows of max_len positions for `who` (window >= 0:
  // a ring buffer of window + max_len slots); the storage is checked
  // against mha::memory_limit() (naming `op`) before it is allocated.
  // Throws mha::Error on a size that is not positive, a window below -1.
  static KVCache make(const char* op, const CacheOwner& who, int64_t batch_size, int64_t max_len,
                      KVCacheDtype dtype, int64_t window = -1);
  // Throws mha::Error naming `op` unless `cache` was made by `who` (same
  // object, same heads), has batch size B, and every row has room for n
  // more positions (a ring: n at most its max_len; and the call's window,
  // window_left (-1: none), within the ring's window).
  static void check_call(const char* op, const KVCache& cache, const CacheOwner& who, int64_t B, int64_t n,
                         int64_t window_left);
  // k, v: (B, Hkv, n, d) head views -> written after each row's length (a
  // ring: position j in slot j % capacity), the lengths advanced by n.
  // Sizes already checked.
  static void write(KVCache& cache, const TensorView& k, const TensorView& v);
  // The cache's keys and values in p.k, p.v ([B,Hkv,capacity,d] views of
  // its storage) and p.cache (dtype, bfloat16 storage, lengths, ring).
  static void point(const KVCache& cache, kernels::AttentionForward& p);
};

}  // namespace mha::nn
