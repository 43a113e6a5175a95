// tests/dist/dist_test_util.h: what the dist tests share: the world
// communicator, inputs that are equal on every rank, and the comparison with
// the single-process module.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "mha/dist.h"
#include "mha/mha.h"

namespace mha::dist::test {

// Messages of errors raised before MPI started (main.cpp), by catalogue id.
inline std::map<std::string, std::string>& early_errors() {
  static std::map<std::string, std::string> errors;
  return errors;
}

// MPI_COMM_WORLD's duplicate, made once (a duplicate is collective).
inline const Communicator& world() {
  static const Communicator comm = Communicator::world();
  return comm;
}

// A tensor of normal numbers from `seed`: the same on every rank.
inline Tensor randn(Shape shape, uint64_t seed, float scale = 1.0f) {
  Generator gen(seed);
  Tensor t(std::move(shape));
  for (float& x : t.values()) x = scale * static_cast<float>(gen.normal());
  return t;
}

// max |got - want| / max(max |want|, floor): the error relative to the
// tensor's scale (elementwise ratios blow up where an output is near 0), or
// to `floor` for a tensor that is 0 up to rounding (W_k.bias's gradient: a
// softmax's gradient sums to 0 over its keys).
inline double relative_error(const Tensor& got, const Tensor& want, double floor = 0.0) {
  EXPECT_EQ(shape_str(got.shape()), shape_str(want.shape()));
  if (got.shape() != want.shape()) return INFINITY;
  double diff = 0, scale = floor;
  for (int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got.data()[i] - want.data()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want.data()[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// The d2l chapter's module with weights drawn from `seed` (bias or not),
// initialised for inputs of widths dq, dk, dv, in evaluation mode.
inline std::unique_ptr<MultiHeadAttention> reference_module(int64_t num_hiddens, int64_t num_heads, bool bias,
                                                            int64_t dq, int64_t dk, int64_t dv, uint64_t seed) {
  auto module = std::make_unique<MultiHeadAttention>(num_hiddens, num_heads, 0.0f, bias, seed);
  MultiHeadAttention& m = *module;
  m.initialize(dq, dk, dv);
  if (bias) {  // the lazy initialisation's biases are zero: give them values
    StateDict s = m.state_dict();
    uint64_t k = seed * 7 + 1;
    for (auto& [name, t] : s)
      if (name.find(".bias") != std::string::npos) t = randn(t.shape(), ++k, 0.5f);
    m.load_state_dict(s);
  }
  m.eval();
  return module;
}

// Rows [begin, begin + n) of axis 1 of x:[B, L, D] -> [B, n, D].
inline Tensor rows(const Tensor& x, int64_t begin, int64_t n) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  Tensor out({B, n, D});
  for (int64_t b = 0; b < B; ++b)
    std::copy(x.data() + (b * L + begin) * D, x.data() + (b * L + begin + n) * D, out.data() + b * n * D);
  return out;
}

}  // namespace mha::dist::test

namespace mha::dist::test {

// Queries [begin, begin + n) of x:[B, H, Q, K] -> [B, H, n, K].
inline Tensor query_rows(const Tensor& x, int64_t begin, int64_t n) {
  const int64_t B = x.size(0), H = x.size(1), Q = x.size(2), K = x.size(3);
  Tensor out({B, H, n, K});
  for (int64_t bh = 0; bh < B * H; ++bh)
    std::copy(x.data() + (bh * Q + begin) * K, x.data() + (bh * Q + begin + n) * K, out.data() + bh * n * K);
  return out;
}

// Heads [first, first + n) of x:[B, H, Q, K] -> [B, n, Q, K].
inline Tensor head_slice(const Tensor& x, int64_t first, int64_t n) {
  const int64_t B = x.size(0), H = x.size(1), QK = x.size(2) * x.size(3);
  Tensor out({B, n, x.size(2), x.size(3)});
  for (int64_t b = 0; b < B; ++b)
    std::copy(x.data() + (b * H + first) * QK, x.data() + (b * H + first + n) * QK, out.data() + b * n * QK);
  return out;
}

// Whether two tensors hold the same bits.
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::equal(a.data(), a.data() + a.numel(), b.data(), [](float x, float y) {
           return std::memcmp(&x, &y, sizeof x) == 0;
         });
}

}  // namespace mha::dist::test
