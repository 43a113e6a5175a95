// The unfused attention forward: for each (batch row, head) the (Q, K) score
// matrix is one BLAS product, the masked softmax runs over its rows, and the
// output is a second BLAS product. Its cost is the Q x K scratch per head; it
// is the path that materialises attention weights most simply.
#include <cmath>
#include <vector>

#include "cpu/blas.h"
#include "kernels/attention_params.h"

namespace mha::kernels {

void attention_forward_blas(const AttentionForward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  std::vector<float> scratch;
  if (!p.weights) scratch.resize(static_cast<size_t>(Q * K));
  std::vector<float> dropped;
  if (p.dropout.active()) dropped.resize(static_cast<size_t>(Q * K));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const uint64_t base = static_cast<uint64_t>((b * H + h) * Q * K);
      float* s = p.weights ? p.weights + base : scratch.data();
      // s:[Q,K] = q_bh:[Q,d] @ k_bh:[K,d]^T
      cpu::sgemm(false, true, Q, K, d, 1.0f, p.q.ptr(b, h), p.q.stride[2], p.k.ptr(b, h),
                 p.k.stride[2], 0.0f, s, K);
      for (int64_t i = 0; i < Q; ++i) {
        float* row = s + i * K;
        const float len = p.length(b, i);
        float row_max = -INFINITY;
        for (int64_t j = 0; j < K; ++j) {
          float x = row[j] / p.scale_divisor;
          if (!(static_cast<float>(j) < len)) x = kMaskFill;
          row[j] = x;
          row_max = std::fmax(row_max, x);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
          row[j] = std::exp(row[j] - row_max);
          sum += row[j];
        }
        for (int64_t j = 0; j < K; ++j) row[j] /= sum;
      }
      const float* pw = s;
      if (p.dropout.active()) {
        for (int64_t x = 0; x < Q * K; ++x) dropped[x] = s[x] * p.dropout.multiplier(base + x);
        pw = dropped.data();
      }
      // out_bh:[Q,dv] = pw:[Q,K] @ v_bh:[K,dv]
      cpu::sgemm(false, false, Q, dv, K, 1.0f, pw, K, p.v.ptr(b, h), p.v.stride[2], 0.0f,
                 p.out.ptr(b, h), p.out.stride[2]);
    }
  }
}

}  // namespace mha::kernels
