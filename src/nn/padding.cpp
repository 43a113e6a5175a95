#include "nn/padding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention_params.h"
#include "kernels/dispatch.h"
#include "mha/threads.h"

namespace mha::nn {

RowNeeds padding_row_needs(const ValidLens& lens, int64_t B, int64_t Q, int64_t K) {
  RowNeeds needs;
  if (lens.is_none()) return needs;
  kernels::AttentionForward p;
  kernels::set_lengths(p, lens);
  const std::vector<int32_t> n = kernels::valid_key_counts(p.length_kind, p.lens, B, Q, K);
  needs.k_rows.assign(static_cast<size_t>(B), 0);
  needs.v_rows.assign(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t longest = 0;
    bool uniform = false;  // some query has no valid key: it averages all v rows
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t c = n[static_cast<size_t>(b * Q + q)];
      longest = std::max(longest, c);
      uniform = uniform || c == 0;
    }
    needs.k_rows[static_cast<size_t>(b)] = longest;
    needs.v_rows[static_cast<size_t>(b)] = uniform ? K : longest;
  }
  return needs;
}

namespace {

// Largest |x| over rows [0, rows) of batch row b (all heads). Sixteen
// running maxima so that the compiler vectorises the loop.
float max_abs(const TensorView& x, int64_t b, int64_t rows) {
  const int64_t n = x.shape[2];
  float part[16] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.ptr(b, r);
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
      for (int k = 0; k < 16; ++k) {
        const float a = std::fabs(row[c + k]);
        part[k] = part[k] < a ? a : part[k];
      }
    for (; c < n; ++c) part[0] = std::max(part[0], std::fabs(row[c]));
  }
  return *std::max_element(part, part + 16);
}

// |score| = |q.k| / scale <= d max|q| max|k| / scale; below this bound every
// real score exceeds the fill by > 9000, far beyond float32's exp underflow
// (~104).
constexpr double kFarFromFill = 9.9e5;

}  // namespace

namespace {

// No NaN or infinity in x[0, n): the exponent bits are never all ones. An
// integer test, so that the compiler vectorises it.
bool all_finite(const float* x, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any == 0;
}

}  // namespace

std::vector<uint8_t> complete_nonfinite_values(Projected& proj, RowNeeds& needs, const Tensor& keys,
                                               const Tensor& values, const LazyLinear& W_k,
                                               const LazyLinear& W_v) {
  std::vector<uint8_t> flags;
  if (needs.v_rows.empty()) return flags;
  const int64_t B = values.size(0), K = values.size(1), Dv = values.size(2);
  const bool layer_finite =
      all_finite(W_v.weight().data(), W_v.weight().numel()) &&
      (!W_v.has_bias() || all_finite(W_v.bias().data(), W_v.bias().numel()));
  // The scans run on mha's threads, one batch row each (the flags do not
  // depend on the order); the rare projections after them.
  std::vector<uint8_t> bad(static_cast<size_t>(B), 0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads()) if (B > 1)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t v_rows = needs.v_rows[static_cast<size_t>(b)];
    if (v_rows >= K) continue;
    bad[static_cast<size_t>(b)] =
        !layer_finite || !all_finite(values.data() + (b * K + v_rows) * Dv, (K - v_rows) * Dv);
  }
  for (int64_t b = 0; b < B; ++b) {
    if (!bad[static_cast<size_t>(b)]) continue;
    if (flags.empty()) flags.assign(static_cast<size_t>(B), 0);
    flags[static_cast<size_t>(b)] = 1;
    project_rows(values, W_v, b, needs.v_rows[static_cast<size_t>(b)], K, proj.v);
    project_rows(keys, W_k, b, needs.k_rows[static_cast<size_t>(b)], K, proj.k);
    needs.v_rows[static_cast<size_t>(b)] = K;
    needs.k_rows[static_cast<size_t>(b)] = K;
  }
  return flags;
}

void complete_values_near_fill(Projected& proj, const RowNeeds& needs, const Tensor& values,
                               const LazyLinear& W_v, int64_t heads, float scale_divisor) {
  if (needs.v_rows.empty()) return;
  const int64_t B = values.size(0), K = values.size(1), Q = proj.q.shape[1];
  std::vector<uint8_t> near(static_cast<size_t>(B), 0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads()) if (B > 1)
  for (int64_t b = 0; b < B; ++b) {
    if (needs.v_rows[static_cast<size_t>(b)] >= K) continue;
    const double d = static_cast<double>(proj.q.shape[2] / heads);
    const double bound = d * max_abs(proj.q, b, Q) *
                         max_abs(proj.k, b, needs.k_rows[static_cast<size_t>(b)]) / scale_divisor;
    near[static_cast<size_t>(b)] = bound >= kFarFromFill;
  }
  for (int64_t b = 0; b < B; ++b)
    if (near[static_cast<size_t>(b)])
      project_rows(values, W_v, b, needs.v_rows[static_cast<size_t>(b)], K, proj.v);
}

}  // namespace mha::nn
