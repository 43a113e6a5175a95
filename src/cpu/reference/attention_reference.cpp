// The reference attention forward: the seed's DotProductAttention written as
// plain loops over (b, head, query), one query row at a time. Dot products and
// the weighted sum accumulate in double so that the reference is at least as
// accurate as anything it judges.
#include <cmath>
#include <vector>

#include "kernels/attention_params.h"

namespace mha::kernels {

void attention_forward_reference(const AttentionForward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  std::vector<float> w(static_cast<size_t>(K));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Q; ++i) {
        const float* q = p.q.ptr(b, h, i);
        const float len = p.length(b, i);
        // scores = q . k / sqrt(d); masked keys become -1e6 (masked_softmax).
        float row_max = -INFINITY;
        for (int64_t j = 0; j < K; ++j) {
          const float* k = p.k.ptr(b, h, j);
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[c];
          float s = static_cast<float>(dot) / p.scale_divisor;
          if (!(static_cast<float>(j) < len)) s = kMaskFill;
          w[j] = s;
          row_max = std::fmax(row_max, s);
        }
        // softmax over the row.
        double sum = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          w[j] = std::exp(w[j] - row_max);
          sum += w[j];
        }
        for (int64_t j = 0; j < K; ++j) w[j] = static_cast<float>(w[j] / sum);
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
            acc += static_cast<double>(wj) * p.v.ptr(b, h, j)[c];
          }
          out[c] = static_cast<float>(acc);
        }
      }
    }
  }
}

}  // namespace mha::kernels
