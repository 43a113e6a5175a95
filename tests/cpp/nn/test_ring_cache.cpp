// A ring-buffer KV cache (kv_cache(..., window), mha/kv_cache.h) on both
// modules: decoding a sequence many times longer than the ring, in steps of
// one and of several positions, gives the rows of one uncached causal call
// with the same window over the whole sequence; the ring's memory does not
// grow; keys() gives the held positions; and its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mha/mha.h"
#include "test_util.h"

namespace {

using namespace mha;
using mha::test::random_tensor;
using mha::test::throws_with;

// Positions [t0, t0 + n) of every batch row of x:[B, L, D].
Tensor slice(const Tensor& x, int64_t t0, int64_t n) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  Tensor out({B, n, D});
  for (int64_t b = 0; b < B; ++b)
    std::copy(x.data() + (b * L + t0) * D, x.data() + (b * L + t0 + n) * D, out.data() + b * n * D);
  return out;
}

// max |got - want| over the largest |want|, for positions [t0, t0 + n) of want:[B, L, E].
double rel_err_at(const Tensor& got, const Tensor& want, int64_t t0) {
  const int64_t B = got.size(0), n = got.size(1), E = got.size(2), L = want.size(1);
  double diff = 0, scale = 0;
  for (int64_t x = 0; x < want.numel(); ++x) scale = std::max(scale, static_cast<double>(std::fabs(want.data()[x])));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n * E; ++i)
      diff = std::max(diff, static_cast<double>(std::fabs(got.data()[b * n * E + i] - want.data()[(b * L + t0) * E + i])));
  return diff / scale;
}

template <class Module, class Cached, class Uncached>
void ring_case(Module& m, int64_t D, int64_t left, KVCacheDtype dtype, const Cached& cached, const Uncached& uncached) {
  const int64_t B = 2, L = 150, max_len = 3;
  Generator gen(static_cast<uint64_t>(left) + 3);
  const Tensor X = random_tensor({B, L, D}, gen);
  const Window window{left, 0};
  const Tensor want = uncached(X, window);
  KVCache cache = m.kv_cache(B, max_len, dtype, left);
  EXPECT_EQ(cache.capacity(), left + max_len);
  EXPECT_EQ(cache.window(), left);
  const int64_t bytes = cache.storage_bytes();
  double worst = 0;
  int64_t t = 0;
  for (int step = 0; t < L; ++step) {
    const int64_t n = std::min<int64_t>(L - t, step % 4 == 0 ? 3 : 1);  // a prefill of 3, steps of 1 and 3
    const Tensor got = cached(slice(X, t, n), cache, window);
    worst = std::max(worst, rel_err_at(got, want, t));
    t += n;
  }
  EXPECT_EQ(cache.lengths(), std::vector<int64_t>(B, L));  // positions keep counting past the capacity
  EXPECT_EQ(cache.storage_bytes(), bytes);
  EXPECT_EQ(cache.held(0), left + max_len);
  EXPECT_LE(worst, dtype == KVCacheDtype::Float32 ? 1e-5 : 2e-2) << "left " << left;
}

TEST(RingCache, TheChaptersModuleDecodesAsTheUncachedWindowedCall) {
  const int64_t D = 16;
  MultiHeadAttention m(D, 2, 0.0f, /*bias=*/true, /*seed=*/5);
  m.eval();
  m.initialize(D, D, D);
  auto cached = [&](const Tensor& x, KVCache& cache, const Window& w) { return m.forward(x, x, x, ValidLens{}, cache, w); };
  auto uncached = [&](const Tensor& X, const Window& w) {
    CallMasks masks;
    masks.causal = Causal::BottomRight;
    masks.window = w;
    return m.forward(X, X, X, ValidLens{}, masks);
  };
  for (int64_t left : {0, 1, 4, 17})
    for (KVCacheDtype dtype : {KVCacheDtype::Float32, KVCacheDtype::BFloat16})
      ring_case(m, D, left, dtype, cached, uncached);
  // Rotary positions follow the cache's lengths, which count positions past
  // the ring's slots: still the uncached call's.
  m.set_rotary({8});
  for (int64_t left : {2, 11}) ring_case(m, D, left, KVCacheDtype::Float32, cached, uncached);
}

TEST(RingCache, TheDropInDecodesAsTheUncachedWindowedCall) {
  const int64_t E = 16, H = 4, Ekv = 8;  // 2 key/value heads
  Generator gen(9);
  StateDict s = {{"in_proj_weight", random_tensor({E + 2 * Ekv, E}, gen)},
                 {"in_proj_bias", random_tensor({E + 2 * Ekv}, gen)},
                 {"out_proj.weight", random_tensor({E, E}, gen)},
                 {"out_proj.bias", random_tensor({E}, gen)}};
  TorchMhaOptions o = test::batch_first_options();
  o.num_kv_heads = 2;
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(s, H, o);
  m.eval();
  auto cached = [&](const Tensor& x, KVCache& cache, const Window& w) { return m.forward(x, x, x, cache, Mask{}, w); };
  auto uncached = [&](const Tensor& X, const Window& w) {
    TorchMhaCall call;
    call.need_weights = false;
    call.causal = Causal::BottomRight;
    call.window = w;
    return m.forward(X, X, X, call).output;
  };
  for (int64_t left : {2, 9}) ring_case(m, E, left, KVCacheDtype::Float32, cached, uncached);
}

TEST(RingCache, KeysAreTheHeldPositionsOldestFirst) {
  const int64_t D = 8;
  MultiHeadAttention m(D, 2, 0.0f, true, 3);
  m.eval();
  m.initialize(D, D, D);
  Generator gen(1);
  KVCache flat = m.kv_cache(1, 40);
  KVCache ring = m.kv_cache(1, 2, KVCacheDtype::Float32, 3);  // 5 slots
  for (int t = 0; t < 12; ++t) {
    const Tensor x = random_tensor({1, 1, D}, gen);
    m.forward(x, x, x, ValidLens{}, flat, Window{3, 0});
    m.forward(x, x, x, ValidLens{}, ring, Window{3, 0});
  }
  const Tensor all = flat.keys(0), held = ring.keys(0);  // [Hkv, 12, hd] and [Hkv, 5, hd]
  ASSERT_EQ(held.size(1), 5);
  const int64_t H = all.size(0), hd = all.size(2);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t x = 0; x < hd; ++x)
        EXPECT_EQ(held.data()[(h * 5 + j) * hd + x], all.data()[(h * 12 + 7 + j) * hd + x]);
}

TEST(RingCache, MisuseIsRefused) {
  const int64_t D = 8;
  MultiHeadAttention m(D, 2, 0.0f, true, 3);
  m.eval();
  m.initialize(D, D, D);
  EXPECT_TRUE(throws_with([&] { m.kv_cache(1, 2, KVCacheDtype::Float32, -2); },
                          "[MultiHeadAttention.kv_cache] window: -2; wanted -1 (no ring buffer)"));
  KVCache ring = m.kv_cache(1, 2, KVCacheDtype::Float32, 3);
  const Tensor x3({1, 3, D}, 1.0f), x1({1, 1, D}, 1.0f);
  EXPECT_TRUE(throws_with([&] { m.forward(x3, x3, x3, ValidLens{}, ring, Window{3, 0}); },
                          "[MultiHeadAttention.forward] cache: 3 new positions in one call; a ring cache made for "
                          "window 3 takes at most 2 at a time"));
  EXPECT_TRUE(throws_with([&] { m.forward(x1, x1, x1, ValidLens{}, ring, Window{4, 0}); },
                          "[MultiHeadAttention.forward] window: left side 4 with a ring cache made for window 3"));
  EXPECT_TRUE(throws_with([&] { m.forward(x1, x1, x1, ValidLens{}, ring); }, "window: left side -1"));
  for (int t = 0; t < 4; ++t) m.forward(x1, x1, x1, ValidLens{}, ring, Window{2, 0});  // a narrower window is fine
  ring.truncate(0, 2);  // not wrapped yet: rewinds
  for (int t = 0; t < 6; ++t) m.forward(x1, x1, x1, ValidLens{}, ring, Window{3, 0});
  EXPECT_TRUE(throws_with([&] { ring.truncate(0, 7); }, "[KVCache.truncate] row 0 of a ring cache has wrapped"));
  EXPECT_EQ(ring.length(0), 8);
}

}  // namespace
