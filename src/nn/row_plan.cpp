#include "nn/row_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "kernels/dispatch.h"
#include "mha/threads.h"
#include "nn/attention_engine.h"

namespace mha::nn {

// The scans below run on every call with lengths or masks (W_v's finiteness:
// 10^4 floats in the d2l chapter's toy call), so with GCC on x86-64 they are
// compiled for AVX-512 and AVX2 as well, the best chosen when the library
// loads (target_clones): 0.85 against 2.0 us for 10^4 floats on the
// development machine, against the baseline (SSE2) loop.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MHA_SCAN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MHA_SCAN_CLONES
#endif

namespace {

// No NaN or infinity in x[0, n): the exponent bits are never all ones. An
// integer test, so that the compiler vectorises it.
MHA_SCAN_CLONES bool all_finite(const float* x, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any == 0;
}

// Largest |x| over positions [0, rows) of batch row b of a head view
// (B, heads, L, d), all heads. Sixteen running maxima so that the compiler
// vectorises the loop.
MHA_SCAN_CLONES float max_abs(const TensorView& x, int64_t b, int64_t rows) {
  const int64_t n = x.shape[1] * x.shape[3];
  float part[16] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.ptr(b, 0, r);
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

// Batch row b (of B) is read in full by the fused kernel.
void read_all(RowPlan& plan, int64_t b, int64_t B) {
  if (plan.read_all_keys.empty()) plan.read_all_keys.assign(static_cast<size_t>(B), 0);
  plan.read_all_keys[static_cast<size_t>(b)] = 1;
}

// Threads for a scan of `floats` values split by batch row: below ~2^18
// floats (tens of microseconds) waking a team costs more than it saves, and
// on a loaded machine far more (the d2l chapter's toy call: 3 scans of a few
// hundred floats each took 0.5-1.5 ms of team waits while other processes
// ran).
int scan_threads(int64_t B, int64_t floats) {
  return core::team_for(static_cast<double>(floats), B);
}

}  // namespace

RowPlan plan_rows(const ValidLens& lens, const AttentionMasks& masks, const RowLayout& layout, int64_t Q,
                  int64_t K, int64_t Kt, const Tensor& values, const LayerRef& W_v) {
  RowPlan plan;
  const int64_t B = layout.B;
  const bool keep_mask = !masks.key_keep.empty();
  if ((lens.is_none() && !keep_mask) || Kt != K || !layout.batch_major()) return plan;
  // limit[b]: keys past it are read by no query of batch row b.
  // uniform[b]: some query of b may have no live key and average every value.
  std::vector<int64_t> limit(static_cast<size_t>(B), K);
  std::vector<uint8_t> uniform(static_cast<size_t>(B), 0);
  // Under the -inf fill only the Uniform policy averages values; under the
  // -1e6 fill a row of masked keys always does (it is a softmax of equal scores).
  const bool policy_uniform = !masks.neg_inf_fill || masks.fully_masked == FullyMaskedRows::Uniform;
  // Masks that can leave a query without a live key whatever the limit says.
  const bool other_masks = !masks.pair_keep.empty() || !masks.key_bias.empty() || !masks.pair_bias.empty() ||
                           masks.causal != Causal::None || masks.window.any();
  if (!lens.is_none()) {
    kernels::AttentionForward p;
    kernels::set_lengths(p, lens);
    const std::vector<int32_t> n = kernels::valid_key_counts(p.length_kind, p.lens, B, Q, K);
    for (int64_t b = 0; b < B; ++b) {
      int64_t longest = 0;
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t c = n[static_cast<size_t>(b * Q + q)];
        longest = std::max(longest, c);
        uniform[static_cast<size_t>(b)] |= c == 0;
      }
      limit[static_cast<size_t>(b)] = longest;
    }
  }
  if (keep_mask)
    for (int64_t b = 0; b < B; ++b) {
      int64_t last = 0;  // last kept key + 1
      for (int64_t j = K - 1; j >= 0; --j)
        if (masks.key_keep[static_cast<size_t>(b * K + j)]) {
          last = j + 1;
          break;
        }
      limit[static_cast<size_t>(b)] = std::min(limit[static_cast<size_t>(b)], last);
    }
  plan.needs.k_rows.assign(static_cast<size_t>(B), K);
  plan.needs.v_rows.assign(static_cast<size_t>(B), K);
  const int64_t Dv = values.size(-1);
  const bool layer_finite = all_finite(W_v.weight(), W_v.weight_numel()) &&
                            (!W_v.has_bias() || all_finite(W_v.bias(), W_v.out_features()));
  bool skips = false;
  std::vector<uint8_t> bad(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lim = limit[static_cast<size_t>(b)];
    const bool all_values =
        policy_uniform && (uniform[static_cast<size_t>(b)] || lim == 0 || (masks.neg_inf_fill && other_masks));
    plan.needs.k_rows[static_cast<size_t>(b)] = lim;
    plan.needs.v_rows[static_cast<size_t>(b)] = all_values ? K : lim;
    skips |= lim < K;
  }
  if (!skips) return {};
  // Skipped value rows must be finite (inputs and W_v), else the row is read
  // in full; the scans run on mha's threads, one batch row each.
  const int scan = scan_threads(B, B * K * Dv);
  core::parallel_for(B, scan, [&](int64_t b) {
    const int64_t v_rows = plan.needs.v_rows[static_cast<size_t>(b)];
    if (v_rows >= K) return;
    bad[static_cast<size_t>(b)] =
        !layer_finite || !all_finite(values.data() + (b * K + v_rows) * Dv, (K - v_rows) * Dv);
  });
  for (int64_t b = 0; b < B; ++b) {
    if (!bad[static_cast<size_t>(b)]) continue;
    read_all(plan, b, B);
    plan.needs.k_rows[static_cast<size_t>(b)] = K;
    plan.needs.v_rows[static_cast<size_t>(b)] = K;
  }
  return plan;
}

void flag_nonfinite_values(RowPlan& plan, const TensorView& v, int64_t width) {
  const int64_t B = v.shape[0], Kt = v.shape[2];
  std::vector<uint8_t> bad(static_cast<size_t>(B), 0);
  const int scan = scan_threads(B, B * Kt * width);
  core::parallel_for(B, scan, [&](int64_t b) {
    const int64_t rows = plan.needs.v_rows.empty() ? Kt : plan.needs.v_rows[static_cast<size_t>(b)];
    bool finite = true;
    for (int64_t pos = 0; pos < rows && finite; ++pos) finite = all_finite(v.ptr(b, 0, pos), width);
    bad[static_cast<size_t>(b)] = !finite;
  });
  for (int64_t b = 0; b < B; ++b)
    if (bad[static_cast<size_t>(b)]) read_all(plan, b, B);
}

void complete_values_near_fill(Projected& proj, const RowNeeds& needs, const Tensor& values, int64_t K,
                               const LayerRef& W_v, float scale_divisor, Precision precision) {
  if (needs.v_rows.empty()) return;
  const int64_t B = proj.q.shape[0], Q = proj.q.shape[2];
  std::vector<uint8_t> near(static_cast<size_t>(B), 0);
  const int scan = scan_threads(B, B * (Q + K) * proj.q.shape[1] * proj.q.shape[3]);
  core::parallel_for(B, scan, [&](int64_t b) {
    if (needs.v_rows[static_cast<size_t>(b)] >= K) return;
    const double d = static_cast<double>(proj.q.shape[3]);
    const double bound = d * max_abs(proj.q, b, Q) *
                         max_abs(proj.k, b, needs.k_rows[static_cast<size_t>(b)]) / scale_divisor;
    near[static_cast<size_t>(b)] = bound >= kFarFromFill;
  });
  for (int64_t b = 0; b < B; ++b)
    if (near[static_cast<size_t>(b)])
      project_rows(values, K, W_v, b, needs.v_rows[static_cast<size_t>(b)], K, proj.v, precision);
}

}  // namespace mha::nn
