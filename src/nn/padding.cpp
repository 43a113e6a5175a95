#include "nn/padding.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention_fused.h"
#include "kernels/dispatch.h"

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

// Largest squared norm of a head's slice over rows [0, rows) of batch row b.
double max_head_norm2(const TensorView& x, int64_t b, int64_t rows, int64_t heads) {
  const int64_t d = x.shape[2] / heads;
  double best = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.ptr(b, r);
    for (int64_t h = 0; h < heads; ++h) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += static_cast<double>(row[h * d + c]) * row[h * d + c];
      best = std::max(best, s);
    }
  }
  return best;
}

// |score| = |q.k| / scale <= |q| |k| / scale; below this bound every real
// score exceeds the fill by > 9000, far beyond float32's exp underflow (~104).
constexpr double kFarFromFill = 9.9e5;

}  // namespace

void complete_values_near_fill(Projected& proj, const RowNeeds& needs, const Tensor& values,
                               const LazyLinear& W_v, int64_t heads, float scale_divisor) {
  if (needs.v_rows.empty()) return;
  const int64_t B = values.size(0), K = values.size(1), Q = proj.q.shape[1];
  for (int64_t b = 0; b < B; ++b) {
    const int64_t v_rows = needs.v_rows[static_cast<size_t>(b)];
    if (v_rows >= K) continue;
    const double qn = max_head_norm2(proj.q, b, Q, heads);
    const double kn = max_head_norm2(proj.k, b, needs.k_rows[static_cast<size_t>(b)], heads);
    if (std::sqrt(qn * kn) / scale_divisor < kFarFromFill) continue;
    project_rows(values, W_v, b, v_rows, K, proj.v);
  }
}

}  // namespace mha::nn
