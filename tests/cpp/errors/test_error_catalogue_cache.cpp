// Triggers of docs/errors.md's rows for key/value caches (mha/kv_cache.h;
// see error_catalogue.h).
#include "error_catalogue.h"
#include "test_util.h"

namespace mha::test {

namespace {

// An evaluation-mode module of 16 features in 2 heads, initialised, and a
// cache of 2 rows of 4 positions holding 3 of them.
struct Cached {
  MultiHeadAttention m{16, 2, 0.0f, true, 1};
  KVCache cache;
  Cached() {
    m.eval();
    m.initialize(16, 16, 16);
    cache = m.kv_cache(2, 4);
    const Tensor x = ones({2, 3, 16});
    m.forward(x, x, x, cache);
  }
  void call(const Tensor& q, const Tensor& k, const Tensor& v) { m.forward(q, k, v, cache); }
  void call(const Tensor& x) { call(x, x, x); }
};

// An evaluation-mode module of 8 features in 2 heads and a ring cache for
// window 3 of 1 row, at most 2 new positions a call (5 slots).
struct Ring {
  MultiHeadAttention m{8, 2, 0.0f, true, 1};
  KVCache cache;
  Ring() {
    m.eval();
    m.initialize(8, 8, 8);
    cache = m.kv_cache(1, 2, KVCacheDtype::Float32, 3);
  }
  void call(const Tensor& x, const Window& w) { m.forward(x, x, x, ValidLens{}, cache, w); }
};

}  // namespace

Triggers cache_triggers() {
  return {
      {"kv_cache.batch_size", [] { MultiHeadAttention(16, 2).kv_cache(0, 4); }},
      {"precision.name", [] { parse_precision("MultiHeadAttention", "fp16"); }},
      {"rotary.dims", [] { MultiHeadAttention(16, 2).set_rotary({10}); }},
      {"rotary.even", [] { check_rotary("Rotary", {-1}); }},
      {"rotary.base", [] { check_rotary("Rotary", {8, 1.0f}); }},
      {"kv_cache.max_len", [] { MultiHeadAttention(16, 2).kv_cache(2, -1); }},
      {"kv_cache.window", [] { MultiHeadAttention(16, 2).kv_cache(2, 4, KVCacheDtype::Float32, -2); }},
      {"kv_cache.ring_step", [] { Ring().call(ones({1, 3, 8}), Window{3, 0}); }},
      {"kv_cache.ring_window", [] { Ring().call(ones({1, 1, 8}), Window{4, 0}); }},
      {"kv_cache.ring_truncate",
       [] {
         Ring r;
         for (int t = 0; t < 8; ++t) r.call(ones({1, 1, 8}), Window{3, 0});
         r.cache.truncate(0, 7);
       }},
      {"kv_cache.memory_limit",
       [] {
         struct Restore {
           ~Restore() { set_memory_limit(0); }
         } restore;
         set_memory_limit(1 << 20);
         MultiHeadAttention(16, 4).kv_cache(4, 4096);
       }},
      {"kv_cache.row", [] { Cached().cache.truncate(2, 0); }},
      {"kv_cache.truncate", [] { Cached().cache.truncate(0, 4); }},
      {"kv_cache.reorder_count", [] { Cached().cache.reorder({0}); }},
      {"kv_cache.reorder_row", [] { Cached().cache.reorder({0, 2}); }},
      {"kv_cache.append_shape", [] { Cached().cache.append(ones({2, 1, 15}), ones({2, 1, 16})); }},
      {"kv_cache.append_positions", [] { Cached().cache.append(ones({2, 1, 16}), ones({2, 2, 16})); }},
      {"kv_cache.append_capacity", [] { Cached().cache.append(ones({2, 3, 16}), ones({2, 3, 16})); }},
      {"kv_cache.capacity", [] { Cached().call(ones({2, 3, 16})); }},
      {"kv_cache.batch", [] { Cached().call(ones({3, 1, 16})); }},
      {"kv_cache.call_batch", [] { Cached().call(ones({2, 1, 16}), ones({3, 1, 16}), ones({3, 1, 16})); }},
      {"kv_cache.positions", [] { Cached().call(ones({2, 3, 16}), ones({2, 3, 16}), ones({2, 2, 16})); }},
      {"kv_cache.no_positions", [] { Cached().call(ones({2, 0, 16})); }},
      {"kv_cache.empty",
       [] {
         Cached c;
         KVCache empty;
         const Tensor x = ones({2, 1, 16});
         c.m.forward(x, x, x, empty);
       }},
      {"kv_cache.other_module",
       [] {
         Cached c;
         MultiHeadAttention other(16, 2);
         other.eval();
         const Tensor x = ones({2, 1, 16});
         other.forward(x, x, x, c.cache);
       }},
      {"kv_cache.heads",
       [] {
         Cached c;
         c.m.prune_heads({1});
         c.call(ones({2, 1, 16}));
       }},
      {"kv_cache.training",
       [] {
         Cached c;
         c.m.train();
         c.call(ones({2, 1, 16}));
       }},
      {"kv_cache.bias_kv",
       [] {
         StateDict s = {{"in_proj_weight", ones({12, 4})}, {"out_proj.weight", ones({4, 4})},
                        {"bias_k", ones({1, 1, 4})}, {"bias_v", ones({1, 1, 4})}};
         TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(s, 2, test::batch_first_options());
         m.eval();
         KVCache c = m.kv_cache(1, 4);
         const Tensor x = ones({1, 1, 4});
         m.forward(x, x, x, c);
       }},
      {"kv_cache.key_padding_mask",
       [] {
         StateDict s = {{"in_proj_weight", ones({12, 4})}, {"out_proj.weight", ones({4, 4})}};
         TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(s, 2, test::batch_first_options());
         m.eval();
         KVCache c = m.kv_cache(1, 4);
         const Tensor x2 = ones({1, 2, 4}), x1 = ones({1, 1, 4});
         m.forward(x2, x2, x2, c);
         m.forward(x1, x1, x1, c, Mask::keep({1, 2}, {1, 1}));
       }},
  };
}

}  // namespace mha::test
