// mha/kv_cache.h: a key/value cache for incremental decoding.
//
//   mha::MultiHeadAttention attention(/*num_hiddens=*/64, /*num_heads=*/4);
//   attention.eval();                                   // cached calls run in evaluation mode
//   mha::KVCache cache = attention.kv_cache(/*batch_size=*/2, /*max_len=*/128);
//   mha::Tensor out = attention.forward(prompt, prompt, prompt, cache);   // prefill: [2, P, 64]
//   for (...) out = attention.forward(x, x, x, cache);                    // one step: x:[2, 1, Dq]
//
// The d2l chapter's Transformer decoder predicts one position at a time and
// concatenates every earlier input to its state, so step t projects all t
// earlier positions again and attends over them. A cache keeps each
// position's projected key and value instead: a cached call projects only the
// new positions, appends their keys and values, and its queries attend over
// every cached position and, causally, over the new ones up to themselves
// (query i of n new ones sees the row's earlier positions and new keys
// 0..i). The result is the chapter's attention over the concatenated inputs.
// Masks narrow it further, over the same key axis of each row (cached
// positions, then the new ones): the chapter's valid_lens on its module
// (key j of query i takes part iff j < length and j <= the query's own
// position), nn.MultiheadAttention's key_padding_mask on the drop-in (see
// the cached forward() of each module).
//
// Layout: per batch row and key/value head (the drop-in's num_kv_heads when
// heads are grouped), `capacity` slots of head_dim floats (or bfloat16s) for
// the keys and as many for the values. Each batch row has its own length
// (ragged batches): a cached call appends its n new positions after each
// row's own last one. Storage is allocated once, at creation, after a check
// against mha::memory_limit(); a cache is a value (copying copies it).
//
// A ring buffer for a sliding window: kv_cache(batch_size, max_len, dtype,
// window) with window = w >= 0 makes a cache of w + max_len slots per row
// that keeps only each row's last w + max_len positions, the newest
// overwriting the oldest, so its memory does not grow with the sequence.
// Its cached calls must have a window (left, right) with 0 <= left <= w and
// at most max_len new positions each: every new query's window (the keys
// from its own position back `left`) then lies in the slots kept, and the
// call is exactly the one over the whole sequence (positions keep counting
// past the capacity: lengths() counts every position a row was given). A
// query whose every held key is masked gets the fully-masked policy over
// the held keys (not every earlier one). Rows that have wrapped cannot be
// rewound (truncate); reorder, reset, keys and values work as on any cache
// (keys and values give the held positions, oldest first).
//
// A cache belongs to the module object that made it (its projections made
// the keys): a cached call of any other module, or of the same module after
// its heads were pruned, is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mha/tensor.h"

namespace mha {

namespace nn {
struct CacheAccess;  // src/nn/kv_cache.cpp: the modules' access to the storage
}

// How a cache stores keys and values; the arithmetic is float32 either way.
// BFloat16 halves the memory and rounds each stored element to 8 bits of
// mantissa (nearest, ties to even).
enum class KVCacheDtype { Float32, BFloat16 };

// "float32" / "bfloat16".
const char* to_string(KVCacheDtype dtype);

// Projected keys and values of earlier positions (see the top of this file).
class KVCache {
 public:
  // An empty cache (no module's, capacity 0); modules make real ones with
  // kv_cache().
  KVCache() = default;

  // B: the batch rows it holds.
  int64_t batch_size() const { return B_; }
  // Slots per batch row: positions each row can hold (a ring: the last
  // window() + max_len positions).
  int64_t capacity() const { return capacity_; }
  // A ring buffer's window (the left side its calls' windows may have at
  // most); -1: not a ring.
  int64_t window() const { return window_; }
  // Positions batch row `row` keeps: its length, or a ring's capacity once
  // the row has wrapped.
  int64_t held(int64_t row) const;
  // Key/value heads stored per position.
  int64_t num_kv_heads() const { return Hkv_; }
  // Width of one head's key or value.
  int64_t head_dim() const { return d_; }
  // How keys and values are stored.
  KVCacheDtype dtype() const { return dtype_; }
  // The module class that made the cache ("MultiHeadAttention", "TorchMultiheadAttention").
  const std::string& module_name() const { return module_; }
  // [B]: how many positions each batch row was given (a ring keeps the last
  // capacity() of them).
  const std::vector<int64_t>& lengths() const { return lengths_; }
  // Positions batch row `row` holds (mha::Error for a row out of range).
  int64_t length(int64_t row) const;
  // Bytes of key and value storage.
  int64_t storage_bytes() const;

  // keys, values: [B, n, num_kv_heads * head_dim], projected keys and values
  // (heads side by side, as a projection writes them) -> appended after each
  // batch row's last position. Throws mha::Error (and changes nothing) on a
  // batch size other than the cache's, another width, or a row that would
  // pass the capacity (a ring: more than max_len positions at once). Cached
  // module calls append this way.
  void append(const Tensor& keys, const Tensor& values);
  // Rewinds batch row `row` to its first `length` positions (0 <= length <=
  // its length); the later ones are forgotten (a rejected draft, a beam cut).
  // A ring's row only while it has not wrapped (length <= capacity).
  void truncate(int64_t row, int64_t length);
  // Every row back to length 0; the storage stays allocated.
  void reset();
  // Beam search: new row i = old row rows[i], lengths included (rows.size()
  // must be the batch size; a row may be copied many times or dropped).
  // Needs one copy of the storage, checked against mha::memory_limit().
  void reorder(const std::vector<int64_t>& rows);

  // [num_kv_heads, held(row), head_dim]: row's stored keys in position order,
  // as float32 (bfloat16 ones widened exactly). For inspection and tests.
  Tensor keys(int64_t row) const;
  // [num_kv_heads, held(row), head_dim]: row's stored values, as keys().
  Tensor values(int64_t row) const;

 private:
  friend struct nn::CacheAccess;
  std::string module_;
  uint64_t owner_ = 0;  // the module object's instance number (mha/detail/instance_id.h)
  int64_t B_ = 0, Hkv_ = 0, d_ = 0, capacity_ = 0;
  int64_t window_ = -1;  // >= 0: a ring buffer; position j of a row in slot j % capacity_
  KVCacheDtype dtype_ = KVCacheDtype::Float32;
  std::vector<int64_t> lengths_;
  // [2][B][Hkv][capacity][d]: keys, then values; one of the two is used.
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
};

}  // namespace mha
