// The unfused attention backward: for each (batch row, head) the (Q, K)
// weights are read from the forward's save (or recomputed), and the four
// gradient products are BLAS calls:
//   grad_v = (P*M)^T dO,  dP = (dO v^T) * M,  grad_q = dS k,  grad_k = dS^T q.
// Scratch is two (Q, K) matrices per thread, reused across heads.
//
// The (batch row, head) pairs are split over mha's threads, one pair per
// thread from start to end, so that the softmax work runs in parallel with
// the products and the result does not depend on the thread count (inside,
// cpu::sgemm is one single-threaded BLAS call).
#include <omp.h>

#include <cmath>
#include <vector>

#include "cpu/blas.h"
#include "kernels/attention_backward.h"
#include "mha/threads.h"

namespace mha::kernels {

namespace {

// s:[Q,K] <- the softmax weights of head (b, h), recomputed from q and k:
// from the saved log-sum-exp when there is one, else by a full softmax.
void recompute_weights(const AttentionBackward& p, int64_t b, int64_t h, float* s) {
  const int64_t Q = p.Q(), K = p.K();
  cpu::sgemm(false, true, Q, K, p.d(), 1.0f, p.q.ptr(b, h), p.q.stride[2], p.k.ptr(b, h),
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
    if (p.lse) {
      const float lse = p.lse[(b * p.H() + h) * Q + i];
      for (int64_t j = 0; j < K; ++j) row[j] = std::exp(row[j] - lse);
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += (row[j] = std::exp(row[j] - row_max));
    for (int64_t j = 0; j < K; ++j) row[j] /= sum;
  }
}

}  // namespace

void attention_backward_blas(const AttentionBackward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  const size_t QK = static_cast<size_t>(Q * K);
  const int threads = B * H > 1 ? num_threads() : 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
  std::vector<float> weights_scratch(p.weights ? 0 : QK), dropped(p.dropout.active() ? QK : 0), dS(QK);
#pragma omp for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const uint64_t base = static_cast<uint64_t>((b * H + h) * Q * K);
      const float* P = p.weights ? p.weights + base : weights_scratch.data();
      if (!p.weights) recompute_weights(p, b, h, weights_scratch.data());
      // The weights the forward multiplied v by: P * M.
      const float* Pd = P;
      if (p.dropout.active()) {
        for (size_t x = 0; x < QK; ++x) dropped[x] = P[x] * p.dropout.multiplier(base + x);
        Pd = dropped.data();
      }
      const float* dO = p.grad_out.ptr(b, h);
      const int64_t ld_dO = p.grad_out.stride[2];
      // grad_v:[K,dv] = Pd^T:[K,Q] @ dO:[Q,dv]
      cpu::sgemm(true, false, K, dv, Q, 1.0f, Pd, K, dO, ld_dO, 0.0f, p.grad_v.ptr(b, h),
                 p.grad_v.stride[2]);
      // dS:[Q,K] <- dO:[Q,dv] @ v^T:[dv,K], then * M, then the softmax's Jacobian.
      cpu::sgemm(false, true, Q, K, dv, 1.0f, dO, ld_dO, p.v.ptr(b, h), p.v.stride[2], 0.0f,
                 dS.data(), K);
      for (int64_t i = 0; i < Q; ++i) {
        float* row = dS.data() + i * K;
        const float* w = P + i * K;
        const float len = p.length(b, i);
        if (p.dropout.active())
          for (int64_t j = 0; j < K; ++j) row[j] *= p.dropout.multiplier(base + i * K + j);
        double row_dot = 0.0;
        for (int64_t j = 0; j < K; ++j) row_dot += static_cast<double>(row[j]) * w[j];
        const float rd = static_cast<float>(row_dot);
        for (int64_t j = 0; j < K; ++j)
          row[j] = static_cast<float>(j) < len ? w[j] * (row[j] - rd) / p.scale_divisor : 0.0f;
      }
      // grad_q:[Q,d] = dS:[Q,K] @ k:[K,d];  grad_k:[K,d] = dS^T:[K,Q] @ q:[Q,d]
      cpu::sgemm(false, false, Q, d, K, 1.0f, dS.data(), K, p.k.ptr(b, h), p.k.stride[2], 0.0f,
                 p.grad_q.ptr(b, h), p.grad_q.stride[2]);
      cpu::sgemm(true, false, K, d, Q, 1.0f, dS.data(), K, p.q.ptr(b, h), p.q.stride[2], 0.0f,
                 p.grad_k.ptr(b, h), p.grad_k.stride[2]);
    }
  }
  }
}

}  // namespace mha::kernels
