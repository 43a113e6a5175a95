// The reference attention forward: the d2l chapter's DotProductAttention written as
// plain loops over (b, head, query), one query row at a time. Dot products and
// the weighted sum accumulate in double so that the reference is at least as
// accurate as anything it judges. Every option of AttentionForward is spelled
// out here, one line each, in the order the module applies them.
#include <cmath>
#include <vector>

#include "cpu/reference/masked_score.h"
#include "cpu/reference/reference.h"

namespace mha::kernels {

void attention_forward_reference(const AttentionForward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), dv = p.dv();
  std::vector<float> w(static_cast<size_t>(K));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = p.kv_head(h);  // grouped heads share k and v
      for (int64_t i = 0; i < Q; ++i) {
        const MaskOptions& m = p.masks;
        // scores = q . k / sqrt(d) (+ additive masks); masked keys get the fill.
        const reference::ScoreRow<float> row = reference::masked_scores(p, b, h, i, w.data(), nullptr);
        if (row.fully_masked) {
          // No key takes part, or every score of the row is -inf: the
          // caller's policy, never exp(-inf - -inf) = NaN. When kept keys
          // score -inf but masked keys hold the d2l chapter's finite fill, the
          // plain softmax runs over the filled row, as in PyTorch (the
          // masked keys then share the weight).
          const float fill = m.fully_masked == FullyMaskedRows::Uniform
                                 ? static_cast<float>(1.0 / static_cast<double>(K))
                                 : 0.0f;
          for (int64_t j = 0; j < K; ++j) w[j] = fill;
        } else {
          // A sink joins the denominator with no value (gpt-oss).
          const float sink = m.sinks ? m.sinks[h] : -INFINITY;
          const float mx = std::fmax(row.max, sink);
          double sum = m.sinks ? std::exp(sink - mx) : 0.0;
          for (int64_t j = 0; j < K; ++j) {
            w[j] = std::exp(w[j] - mx);
            sum += w[j];
          }
          for (int64_t j = 0; j < K; ++j) w[j] = static_cast<float>(w[j] / sum);
        }
        const uint64_t row_index = static_cast<uint64_t>(((b * H + h) * Q + i) * K);
        if (p.weights) {
          for (int64_t j = 0; j < K; ++j) p.weights[row_index + j] = w[j];
        }
        // out = dropout(weights) @ v.
        float* out = p.out.ptr(b, h, i);
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < K; ++j) {
            const float wj = w[j] * p.dropout.multiplier(row_index + j);
            acc += static_cast<double>(wj) * p.v.ptr(b, hk, j)[c];
          }
          out[c] = static_cast<float>(acc);
        }
      }
    }
  }
}

}  // namespace mha::kernels
