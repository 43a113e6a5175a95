// head_offsets: see mha/inspect.h. A plain loop over every weight; the
// matrices are small (a batch of sequences a model was trained on), and
// accumulating in double keeps the means exact to the float inputs.
#include "mha/inspect.h"

#include <cmath>
#include <limits>

#include "mha/error.h"

namespace mha {

HeadOffsets head_offsets(const Tensor& weights, const ValidLens& valid_lens, int64_t first_query) {
  static const char* op = "head_offsets";
  if (weights.dim() != 4)
    fail(op, "weights: shape ", shape_str(weights.shape()), ", wanted (B, H, Q, K)");
  const int64_t B = weights.size(0), H = weights.size(1), Q = weights.size(2), K = weights.size(3);
  if (B == 0 || H == 0 || Q == 0 || K == 0)
    fail(op, "weights: shape ", shape_str(weights.shape()), " has an empty axis; wanted (B, H, Q, K) all >= 1");
  if (!valid_lens.is_none()) valid_lens.check(op, B, Q);
  if (first_query < 0 || first_query >= Q)
    fail(op, "first_query: ", first_query, " is outside the ", Q, " queries (0 .. ", Q - 1, ")");

  HeadOffsets out;
  out.min_offset = -(K - 1);
  out.max_offset = Q - 1;
  const int64_t n = Q + K - 1;
  std::vector<double> sum(static_cast<size_t>(H * n), 0.0);
  out.pairs.assign(static_cast<size_t>(n), 0);

  const float* w = weights.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = first_query; t < Q; ++t) {
      const float len = valid_lens.at(b, t);  // +inf without valid_lens
      if (!(static_cast<float>(t) < len)) continue;  // a padding query
      for (int64_t k = 0; k < K && static_cast<float>(k) < len; ++k) {
        const int64_t i = t - k - out.min_offset;
        ++out.pairs[static_cast<size_t>(i)];
        for (int64_t h = 0; h < H; ++h) {
          const float v = w[((b * H + h) * Q + t) * K + k];
          if (!std::isfinite(v))
            fail(op, "weights: element (", b, ", ", h, ", ", t, ", ", k, ") is ", v, "; wanted finite weights");
          sum[static_cast<size_t>(h * n + i)] += v;
        }
      }
    }

  bool any = false;
  for (int64_t c : out.pairs) any |= c > 0;
  if (!any)
    fail(op, "valid_lens: every query t >= ", first_query, " of the ", shape_str(weights.shape()),
         " weights is padding (none has t < valid_len); wanted at least one real (query, key) pair");

  out.mean = Tensor({H, n}, std::numeric_limits<float>::quiet_NaN());
  out.offset.assign(static_cast<size_t>(H), 0);
  out.weight.assign(static_cast<size_t>(H), -std::numeric_limits<double>::infinity());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = out.pairs[static_cast<size_t>(i)];
      if (c == 0) continue;
      const double m = sum[static_cast<size_t>(h * n + i)] / static_cast<double>(c);
      out.mean.at({h, i}) = static_cast<float>(m);
      if (m > out.weight[static_cast<size_t>(h)]) {  // strict: the first (smallest) offset wins a tie
        out.weight[static_cast<size_t>(h)] = m;
        out.offset[static_cast<size_t>(h)] = out.min_offset + i;
      }
    }
  return out;
}

}  // namespace mha
