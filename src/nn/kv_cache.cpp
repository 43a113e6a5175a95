// mha::KVCache (mha/kv_cache.h) and the modules' access to it (nn/kv_cache.h).
#include "nn/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "core/memory.h"
#include "mha/error.h"
#include "nn/projections.h"

namespace mha {

const char* to_string(KVCacheDtype dtype) { return dtype == KVCacheDtype::BFloat16 ? "bfloat16" : "float32"; }

namespace {

int64_t item_bytes(KVCacheDtype dtype) { return dtype == KVCacheDtype::BFloat16 ? 2 : 4; }

void check_row(const char* op, const KVCache& c, int64_t row) {
  if (row < 0 || row >= c.batch_size())
    fail(op, "row: ", row, " is not a batch row of the cache; wanted 0 <= row < ", c.batch_size());
}

// Throws unless each row has room for n more positions: a ring for at most
// its max_len (capacity - window) at a time, any other cache up to its capacity.
void check_room(const char* op, const char* what, const KVCache& c, int64_t n) {
  if (c.window() >= 0) {
    if (n > c.capacity() - c.window())
      fail(op, what, ": ", n, " new positions in one call; a ring cache made for window ", c.window(),
           " takes at most ", c.capacity() - c.window(), " at a time (the max_len it was made with)");
    return;
  }
  for (int64_t b = 0; b < c.batch_size(); ++b)
    if (c.lengths()[static_cast<size_t>(b)] + n > c.capacity())
      fail(op, what, ": ", n, " new positions do not fit row ", b, " (length ", c.lengths()[static_cast<size_t>(b)],
           ", capacity ", c.capacity(), ")");
}

}  // namespace

int64_t KVCache::length(int64_t row) const {
  check_row("KVCache.length", *this, row);
  return lengths_[static_cast<size_t>(row)];
}

int64_t KVCache::held(int64_t row) const {
  check_row("KVCache.held", *this, row);
  return std::min(lengths_[static_cast<size_t>(row)], capacity_);
}

int64_t KVCache::storage_bytes() const { return 2 * B_ * Hkv_ * capacity_ * d_ * item_bytes(dtype_); }

void KVCache::append(const Tensor& keys, const Tensor& values) {
  static const char* op = "KVCache.append";
  const int64_t width = Hkv_ * d_;
  for (const auto& [t, name] : {std::pair{&keys, "keys"}, std::pair{&values, "values"}})
    if (t->dim() != 3 || t->size(0) != B_ || t->size(2) != width)
      fail(op, name, ": shape ", shape_str(t->shape()), "; wanted (", B_, ", n, ", width,
           ") (batch size, new positions, num_kv_heads * head_dim)");
  if (values.size(1) != keys.size(1))
    fail(op, "values: shape ", shape_str(values.shape()), " has ", values.size(1), " positions but keys ",
         shape_str(keys.shape()), " have ", keys.size(1));
  const int64_t n = keys.size(1);
  check_room(op, "keys", *this, n);
  const nn::RowLayout layout{false, B_};
  nn::CacheAccess::write(*this, layout.heads(const_cast<float*>(keys.data()), n, Hkv_, d_, width),
                         layout.heads(const_cast<float*>(values.data()), n, Hkv_, d_, width));
}

void KVCache::truncate(int64_t row, int64_t length) {
  static const char* op = "KVCache.truncate";
  check_row(op, *this, row);
  const int64_t have = lengths_[static_cast<size_t>(row)];
  if (length < 0 || length > have)
    fail(op, "length: ", length, " for row ", row, " of length ", have, "; wanted 0 <= length <= ", have,
         " (a cache can only be rewound)");
  if (window_ >= 0 && have > capacity_ && length < have)
    fail(op, "row ", row, " of a ring cache has wrapped (length ", have, ", capacity ", capacity_,
         "): its first positions are overwritten; wanted a row that has not wrapped to rewind");
  lengths_[static_cast<size_t>(row)] = length;
}

void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KVCache::reorder(const std::vector<int64_t>& rows) {
  static const char* op = "KVCache.reorder";
  if (static_cast<int64_t>(rows.size()) != B_)
    fail(op, "rows: ", rows.size(), " entries; wanted one per batch row of the cache (", B_, ")");
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= B_)
      fail(op, "rows: entry ", i, " is ", rows[i], "; wanted 0 <= row < ", B_);
  core::check_bytes(op, "reordered cache storage", static_cast<uint64_t>(storage_bytes()));
  // Copy the held positions of each source row; slots past a length are
  // never read, so they are left as they are.
  auto move_rows = [&](auto& store) {
    auto old = store;
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t i = 0; i < B_; ++i) {
        const int64_t src = rows[static_cast<size_t>(i)];
        const int64_t len = std::min(lengths_[static_cast<size_t>(src)], capacity_);  // slots in use (a ring's all, once wrapped)
        for (int64_t h = 0; h < Hkv_; ++h) {
          const size_t from = static_cast<size_t>(((kv * B_ + src) * Hkv_ + h) * capacity_ * d_);
          const size_t to = static_cast<size_t>(((kv * B_ + i) * Hkv_ + h) * capacity_ * d_);
          std::copy(old.begin() + from, old.begin() + from + len * d_, store.begin() + to);
        }
      }
  };
  if (dtype_ == KVCacheDtype::BFloat16) move_rows(bf16_);
  else move_rows(f32_);
  std::vector<int64_t> lengths(static_cast<size_t>(B_));
  for (int64_t i = 0; i < B_; ++i) lengths[static_cast<size_t>(i)] = lengths_[static_cast<size_t>(rows[static_cast<size_t>(i)])];
  lengths_ = std::move(lengths);
}

namespace {

Tensor stored(const KVCache& c, const std::vector<float>& f32, const std::vector<uint16_t>& bf16, int64_t kv,
              int64_t row) {
  // The held positions lo .. length-1, oldest first (a ring's position j in slot j % capacity).
  const int64_t len = c.held(row), lo = c.length(row) - len, Hkv = c.num_kv_heads(), d = c.head_dim(),
                cap = c.capacity();
  Tensor out({Hkv, len, d});
  for (int64_t h = 0; h < Hkv; ++h) {
    const size_t base = static_cast<size_t>(((kv * c.batch_size() + row) * Hkv + h) * cap * d);
    float* dst = out.data() + h * len * d;
    for (int64_t j = 0; j < len; ++j) {
      const size_t at = base + static_cast<size_t>(((lo + j) % cap) * d);
      for (int64_t x = 0; x < d; ++x)
        dst[j * d + x] = c.dtype() == KVCacheDtype::BFloat16 ? core::from_bf16(bf16[at + static_cast<size_t>(x)])
                                                             : f32[at + static_cast<size_t>(x)];
    }
  }
  return out;
}

}  // namespace

Tensor KVCache::keys(int64_t row) const {
  check_row("KVCache.keys", *this, row);
  return stored(*this, f32_, bf16_, 0, row);
}

Tensor KVCache::values(int64_t row) const {
  check_row("KVCache.values", *this, row);
  return stored(*this, f32_, bf16_, 1, row);
}

namespace nn {

KVCache CacheAccess::make(const char* op, const CacheOwner& who, int64_t batch_size, int64_t max_len,
                          KVCacheDtype dtype, int64_t window) {
  if (batch_size <= 0) fail(op, "batch_size: ", batch_size, " is not positive");
  if (max_len <= 0) fail(op, "max_len: ", max_len, " is not positive");
  if (window < -1 || window > (int64_t{1} << 40))
    fail(op, "window: ", window, "; wanted -1 (no ring buffer) or the keys >= 0 a query sees before its own");
  if (window >= 0) max_len += window;  // a ring: the window behind the oldest new query, and the new ones
  // Keys and values, checked (and overflow-safe) before anything is allocated.
  core::MemoryPlan(op)
      .add("key cache", {batch_size, who.Hkv, max_len, who.d}, static_cast<uint64_t>(item_bytes(dtype)))
      .add("value cache", {batch_size, who.Hkv, max_len, who.d}, static_cast<uint64_t>(item_bytes(dtype)))
      .check();
  KVCache c;
  c.module_ = who.module;
  c.owner_ = who.owner;
  c.B_ = batch_size, c.Hkv_ = who.Hkv, c.d_ = who.d, c.capacity_ = max_len;
  c.window_ = window;
  c.dtype_ = dtype;
  c.lengths_.assign(static_cast<size_t>(batch_size), 0);
  const size_t n = static_cast<size_t>(2 * batch_size * who.Hkv * max_len * who.d);
  if (dtype == KVCacheDtype::BFloat16) c.bf16_.assign(n, 0);
  else c.f32_.assign(n, 0.0f);
  return c;
}

void CacheAccess::check_call(const char* op, const KVCache& c, const CacheOwner& who, int64_t B, int64_t n,
                             int64_t window_left) {
  if (c.owner_ == 0)
    fail(op, "cache: an empty cache; wanted one made by this module's kv_cache()");
  if (c.owner_ != who.owner)
    fail(op, "cache: made by another ", c.module_, " object; wanted one made by this module's kv_cache() "
         "(its keys come from that module's projections)");
  if (c.Hkv_ != who.Hkv || c.d_ != who.d)
    fail(op, "cache: ", c.Hkv_, " key/value heads of width ", c.d_, "; the module now has ", who.Hkv,
         " of width ", who.d, " (heads pruned since the cache was made?): make a new cache");
  if (c.B_ != B) fail(op, "cache: batch size ", c.B_, "; the call has ", B, " batch rows");
  check_room(op, "cache", c, n);
  if (c.window_ >= 0 && (window_left < 0 || window_left > c.window_))
    fail(op, "window: left side ", window_left, " with a ring cache made for window ", c.window_,
         "; wanted a left side from 0 to ", c.window_, " (the ring keeps no older keys)");
}

void CacheAccess::write(KVCache& c, const TensorView& k, const TensorView& v) {
  const int64_t B = c.B_, H = c.Hkv_, d = c.d_, cap = c.capacity_, n = k.shape[2];
  for (int64_t kv = 0; kv < 2; ++kv) {
    const TensorView& src = kv == 0 ? k : v;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t at = c.lengths_[static_cast<size_t>(b)];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i) {
          const float* s = src.ptr(b, h, i);
          const int64_t slot = c.window_ >= 0 ? (at + i) % cap : at + i;  // a ring overwrites its oldest
          const size_t dst = static_cast<size_t>((((kv * B + b) * H + h) * cap + slot) * d);
          if (c.dtype_ == KVCacheDtype::BFloat16)
            for (int64_t x = 0; x < d; ++x) c.bf16_[dst + static_cast<size_t>(x)] = core::to_bf16(s[x]);
          else
            std::memcpy(c.f32_.data() + dst, s, sizeof(float) * static_cast<size_t>(d));
        }
    }
  }
  for (int64_t& len : c.lengths_) len += n;
}

void CacheAccess::point(const KVCache& c, kernels::AttentionForward& p) {
  auto view = [&](float* data) {
    TensorView t;
    t.data = data, t.rank = 4;
    t.shape[0] = c.B_, t.shape[1] = c.Hkv_, t.shape[2] = c.capacity_, t.shape[3] = c.d_;
    t.stride[0] = c.Hkv_ * c.capacity_ * c.d_, t.stride[1] = c.capacity_ * c.d_, t.stride[2] = c.d_, t.stride[3] = 1;
    return t;
  };
  const int64_t half = c.B_ * c.Hkv_ * c.capacity_ * c.d_;  // the values start here
  p.cache = {};
  if (c.dtype_ == KVCacheDtype::BFloat16) {
    p.cache.dtype = kernels::CacheDtype::BF16;
    p.cache.k_bf16 = c.bf16_.data();
    p.cache.v_bf16 = c.bf16_.data() + half;
    p.k = view(nullptr), p.v = view(nullptr);
  } else {
    // The float32 views point into storage the call only reads (const_cast:
    // TensorView's data is not const).
    float* f32 = const_cast<float*>(c.f32_.data());
    p.k = view(f32), p.v = view(f32 + half);
  }
  p.cache.lengths = c.lengths_.data();
  p.cache.ring = c.window_ >= 0;
}

}  // namespace nn
}  // namespace mha
