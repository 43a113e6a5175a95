#include "mha/attention.h"

#include <cmath>

#include "core/finite.h"
#include "core/memory.h"
#include "kernels/dispatch.h"
#include "mha/error.h"

namespace mha {

Tensor masked_softmax(const Tensor& X, const ValidLens& valid_lens) {
  static const char* op = "masked_softmax";
  if (X.dim() != 3) fail(op, "X: shape ", shape_str(X.shape()), " is not (N, Q, K)");
  const int64_t N = X.size(0), Q = X.size(1), K = X.size(2);
  valid_lens.check(op, N, Q);
  core::MemoryPlan(op).add("softmax", X.shape()).check();
  Tensor out = X;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < Q; ++i) {
      float* row = out.data() + (n * Q + i) * K;
      const float len = valid_lens.at(n, i);
      float row_max = -INFINITY;
      for (int64_t j = 0; j < K; ++j) {
        if (!(static_cast<float>(j) < len)) row[j] = kernels::kMaskFill;
        row_max = std::fmax(row_max, row[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) sum += (row[j] = std::exp(row[j] - row_max));
      for (int64_t j = 0; j < K; ++j) row[j] /= sum;
    }
  }
  return out;
}

DotProductAttention::DotProductAttention(float dropout, uint64_t seed)
    : dropout_(dropout), dropout_keys_(seed) {
  if (!(dropout >= 0.0f && dropout <= 1.0f))
    fail("DotProductAttention", "dropout: ", dropout, " is not a probability in [0, 1]");
}

Tensor DotProductAttention::forward(const Tensor& queries, const Tensor& keys,
                                    const Tensor& values, const ValidLens& valid_lens) {
  static const char* op = "DotProductAttention.forward";
  if (queries.dim() != 3) fail(op, "queries: shape ", shape_str(queries.shape()), " is not (N, Q, d)");
  if (keys.dim() != 3) fail(op, "keys: shape ", shape_str(keys.shape()), " is not (N, K, d)");
  if (values.dim() != 3) fail(op, "values: shape ", shape_str(values.shape()), " is not (N, K, dv)");
  const int64_t N = queries.size(0), Q = queries.size(1), d = queries.size(2);
  const int64_t K = keys.size(1), dv = values.size(2);
  if (keys.size(0) != N || keys.size(2) != d)
    fail(op, "keys: shape ", shape_str(keys.shape()), " does not match queries ",
         shape_str(queries.shape()), "; wanted (", N, ", K, ", d, ")");
  if (values.size(0) != N || values.size(1) != K)
    fail(op, "values: shape ", shape_str(values.shape()), " does not match keys ",
         shape_str(keys.shape()), "; wanted (", N, ", ", K, ", dv)");
  if (K == 0) fail(op, "keys: shape ", shape_str(keys.shape()), " has no keys to attend to");
  if (d == 0)
    fail(op, "queries: shape ", shape_str(queries.shape()), " has no features; the scores q k^T / sqrt(d) would be 0 / 0");
  valid_lens.check(op, N, Q);
  core::MemoryPlan(op).add("attention weights", {N, Q, K}).add("output", {N, Q, dv}).check();

  Tensor out({N, Q, dv});
  Tensor weights({N, Q, K});  // published as attention_weights() at the end
  kernels::AttentionForward p;
  // (N, L, w) seen as (N, 1, L, w): one head per row.
  auto as_heads = [](const Tensor& t) { return t.view().split_heads(1); };
  p.q = as_heads(queries);
  p.k = as_heads(keys);
  p.v = as_heads(values);
  p.out = as_heads(out);
  p.weights = weights.data();
  kernels::set_lengths(p, valid_lens);
  p.scale_divisor = std::sqrt(static_cast<float>(d));
  // One snapshot of the settings for the whole call.
  const AttentionKernel kernel = kernel_.get();
  if (training_.get() && dropout_ > 0.0f) p.dropout = {dropout_, dropout_keys_.next()};
  (void)kernels::attention_forward(kernel, p);  // p.stats unset: nothing saved
  // Finite inputs whose scores overflow float32 (|q|, |k| ~ 1e20) would give
  // NaN rows: an error instead (NaN or infinite inputs are computed through).
  if (!core::all_finite(out) && core::all_finite(queries) && core::all_finite(keys) && core::all_finite(values))
    fail(op, "finite queries and keys give scores that overflow float32 (largest magnitudes ",
         core::max_abs(queries), " and ", core::max_abs(keys), "); scale them down");
  weights_.store(std::make_shared<Tensor>(std::move(weights)));
  return out;
}

}  // namespace mha
