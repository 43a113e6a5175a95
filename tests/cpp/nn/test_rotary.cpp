// tests/cpp/nn/test_rotary.cpp: apply_rotary (src/nn/rotary.h) against the
// plain one-row loop, bitwise at 1 and 2 threads, on strided head views;
// rotating back restores the rows; per-row first positions are honoured.
// A rotary module's cached decoding (ragged rows, token by token) against
// its uncached causal call over each row's whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mha/mha.h"
#include "mha/random.h"
#include "mha/threads.h"
#include "nn/rotary.h"
#include "test_util.h"

namespace mha::nn {
namespace {

// A (B, heads, L, d) view into rows of width ld (heads*d <= ld), as the
// projections lay their buffers out.
TensorView view(std::vector<float>& buf, int64_t B, int64_t heads, int64_t L, int64_t d, int64_t ld) {
  TensorView v;
  v.data = buf.data();
  v.rank = 4;
  v.shape[0] = B, v.stride[0] = L * ld;
  v.shape[1] = heads, v.stride[1] = d;
  v.shape[2] = L, v.stride[2] = ld;
  v.shape[3] = d, v.stride[3] = 1;
  return v;
}

TEST(Rotary, MatchesTheRowLoopBitwiseAtOneAndTwoThreadsAndInvertsWithinRounding) {
  const int saved = num_threads();
  Generator gen(5);
  for (const auto layout : {Rotary::Layout::Half, Rotary::Layout::Interleaved})
    for (int64_t dims : {2, 6, 16}) {
      const int64_t B = 3, heads = 2, L = 37, d = 16, ld = heads * d + 3;
      const Rotary r{dims, 10000.0f, layout};
      std::vector<float> x(static_cast<size_t>(B * L * ld));
      for (float& v : x) v = gen.uniform(-1.0f, 1.0f);
      const std::vector<int64_t> first = {0, 5, 1000};
      std::vector<float> want = x;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < L; ++i)
            rotate_row_reference(want.data() + (b * L + i) * ld + h * d, first[static_cast<size_t>(b)] + i, r, false);
      std::vector<std::vector<float>> got;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<float> y = x;
        apply_rotary(view(y, B, heads, L, d, ld), L, r, first.data(), false);
        got.push_back(y);
      }
      EXPECT_EQ(got[0], want) << "dims " << dims;
      EXPECT_EQ(got[1], want) << "dims " << dims;
      // Entries past dims and the columns past heads*d are untouched.
      for (int64_t row = 0; row < B * L; ++row) {
        for (int64_t c = heads * d; c < ld; ++c) EXPECT_EQ(got[0][row * ld + c], x[row * ld + c]);
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = dims; c < d; ++c) EXPECT_EQ(got[0][row * ld + h * d + c], x[row * ld + h * d + c]);
      }
      std::vector<float> back = got[0];
      apply_rotary(view(back, B, heads, L, d, ld), L, r, first.data(), true);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-6f);
    }
  set_num_threads(saved);
}

TEST(Rotary, FrequenciesAreRoFormersInFloat32) {
  const Rotary r{8, 10000.0f};
  std::vector<float> theta(4);
  rotary_frequencies(r, theta.data());
  for (int m = 0; m < 4; ++m)
    EXPECT_NEAR(theta[static_cast<size_t>(m)], std::pow(10000.0, -2.0 * m / 8.0), 1e-7 * std::pow(10000.0, -2.0 * m / 8.0));
  EXPECT_EQ(theta[0], 1.0f);
}

// Rows [p0, p1) of batch row b of x:[B, L, D] appended to out (a [1, n, D] row's data).
void append_rows(std::vector<float>& out, const Tensor& x, int64_t b, int64_t p0, int64_t p1) {
  const int64_t L = x.size(1), D = x.size(2);
  out.insert(out.end(), x.data() + (b * L + p0) * D, x.data() + (b * L + p1) * D);
}

// Prompts of {6, 3} positions prefilled in one cached call (each row rewound
// to its own length), then 4 steps of one position per row: every output
// row equals the same position of the uncached causal call (valid lengths
// i + 1) over that row's whole sequence, whose queries and keys sit at
// positions 0..n-1. Without rotary positions from the cache, row 1's steps
// would be rotated as positions 6.. instead of 3..
void cached_equals_uncached(const Rotary& r) {
  const int64_t B = 2, P = 6, D = 24, steps = 4;
  const std::vector<int64_t> lens = {6, 3};
  MultiHeadAttention m(D, 3, 0.0f, /*bias=*/true, /*seed=*/5);
  m.set_rotary(r);
  m.eval();
  m.initialize(D, D, D);
  Generator gen(17);
  const Tensor prompt = mha::test::random_tensor({B, P, D}, gen);
  KVCache cache = m.kv_cache(B, P + steps);
  const Tensor pre = m.forward(prompt, prompt, prompt, cache);
  for (int64_t b = 0; b < B; ++b) cache.truncate(b, lens[static_cast<size_t>(b)]);
  std::vector<std::vector<float>> seq(B), got(B);  // each row's inputs and cached outputs
  for (int64_t b = 0; b < B; ++b) {
    append_rows(seq[static_cast<size_t>(b)], prompt, b, 0, lens[static_cast<size_t>(b)]);
    append_rows(got[static_cast<size_t>(b)], pre, b, 0, lens[static_cast<size_t>(b)]);
  }
  for (int64_t t = 0; t < steps; ++t) {
    const Tensor x = mha::test::random_tensor({B, 1, D}, gen);
    const Tensor y = m.forward(x, x, x, cache);
    for (int64_t b = 0; b < B; ++b) {
      append_rows(seq[static_cast<size_t>(b)], x, b, 0, 1);
      append_rows(got[static_cast<size_t>(b)], y, b, 0, 1);
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<float>& s = seq[static_cast<size_t>(b)];
    const int64_t n = static_cast<int64_t>(s.size()) / D;
    Tensor X({1, n, D});
    std::copy(s.begin(), s.end(), X.data());
    std::vector<float> causal;
    for (int64_t i = 0; i < n; ++i) causal.push_back(static_cast<float>(i + 1));
    const Tensor want = m.forward(X, X, X, ValidLens::per_query(1, n, causal));
    const std::vector<float>& g = got[static_cast<size_t>(b)];
    ASSERT_EQ(static_cast<int64_t>(g.size()), want.numel());
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(g[static_cast<size_t>(i)]) - want.data()[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want.data()[i])));
    }
    EXPECT_LE(diff, 1e-5 * scale) << "row " << b << " dims " << r.dims;
  }
}

TEST(Rotary, CachedDecodingOfRaggedRowsEqualsTheUncachedCausalCall) {
  cached_equals_uncached(Rotary{8, 10000.0f, Rotary::Layout::Half});
  cached_equals_uncached(Rotary{4, 500.0f, Rotary::Layout::Interleaved});
  // The test can fail: the same cached outputs differ from a module without rotary.
  MultiHeadAttention a(8, 1, 0.0f, false, 1), b(8, 1, 0.0f, false, 1);
  a.set_rotary(Rotary{8});
  a.eval(), b.eval();
  Generator gen(3);
  const Tensor x = mha::test::random_tensor({1, 5, 8}, gen);
  const Tensor ya = a.forward(x, x, x), yb = b.forward(x, x, x);
  double diff = 0.0;
  for (int64_t i = 0; i < ya.numel(); ++i) diff = std::max(diff, std::fabs(static_cast<double>(ya.data()[i]) - yb.data()[i]));
  EXPECT_GT(diff, 1e-3);
}

}  // namespace
}  // namespace mha::nn
