// tests/cpp/nn/test_rotary.cpp: apply_rotary (src/nn/rotary.h) against the
// plain one-row loop, bitwise at 1 and 2 threads, on strided head views;
// rotating back restores the rows; per-row first positions are honoured.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mha/random.h"
#include "mha/threads.h"
#include "nn/rotary.h"

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

}  // namespace
}  // namespace mha::nn
