// The reference attention backward: the chain rule of the d2l chapter's
// DotProductAttention written out as plain loops over (b, head), everything in
// double. It recomputes the softmax weights from q and k rather than trusting
// any save of the forward, so that it judges the saves too.
#include <cmath>
#include <vector>

#include "cpu/blas/attention_blas.h"
#include "cpu/reference/attention_backward_masked.h"
#include "cpu/reference/reference.h"

namespace mha::kernels {

namespace {

// Whether p uses a mask option or grouped heads: the chapter's loops below
// take neither.
bool beyond_the_chapter(const AttentionBackward& p) {
  const MaskOptions& m = p.fwd.masks;
  return m.key_keep || m.key_bias || m.pair_keep || m.pair_bias || m.bounds_keys() || m.has_score_options() ||
         m.fill != MaskFill::Seed || m.fully_masked != FullyMaskedRows::Uniform || p.Hkv() != p.H();
}

}  // namespace

void attention_backward_reference(const AttentionBackward& p) {
  // Masks and grouped heads: the reference written with every option
  // (cpu/reference/attention_backward_masked.cpp). The loops below are the
  // d2l chapter's case alone, kept as its plainest statement.
  if (beyond_the_chapter(p)) {
    attention_backward_masked_reference(p.fwd, p.grad_out, p.grad_q, p.grad_k, p.grad_v, p.grad_sinks);
    return;
  }
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  const double scale = p.fwd.scale_divisor;
  std::vector<double> P(static_cast<size_t>(Q * K)), M(static_cast<size_t>(Q * K)),
      dS(static_cast<size_t>(Q * K));
  std::vector<char> masked(static_cast<size_t>(Q * K));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const uint64_t base = static_cast<uint64_t>((b * H + h) * Q * K);
      // P = masked_softmax(q k^T / sqrt(d)), M = the dropout multipliers.
      for (int64_t i = 0; i < Q; ++i) {
        const float len = p.length(b, i);
        double row_max = -INFINITY;
        for (int64_t j = 0; j < K; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(p.fwd.q.ptr(b, h, i)[c]) * p.fwd.k.ptr(b, h, j)[c];
          const bool m = !(static_cast<float>(j) < len);
          masked[i * K + j] = m;
          P[i * K + j] = m ? kMaskFill : dot / scale;
          row_max = std::fmax(row_max, P[i * K + j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < K; ++j) sum += (P[i * K + j] = std::exp(P[i * K + j] - row_max));
        for (int64_t j = 0; j < K; ++j) {
          P[i * K + j] /= sum;
          M[i * K + j] = p.fwd.dropout.multiplier(base + i * K + j);
        }
      }
      // grad_v[j] = sum_i P[i,j] M[i,j] grad_out[i].
      for (int64_t j = 0; j < K; ++j) {
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0.0;
          for (int64_t i = 0; i < Q; ++i) acc += P[i * K + j] * M[i * K + j] * p.grad_out.ptr(b, h, i)[c];
          p.grad_v.ptr(b, h, j)[c] = static_cast<float>(acc);
        }
      }
      // dP[i,j] = (grad_out[i] . v[j]) M[i,j]; dS = P (dP - sum_j dP P), 0 where masked.
      for (int64_t i = 0; i < Q; ++i) {
        std::vector<double> dP(static_cast<size_t>(K));
        double row_dot = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < dv; ++c)
            dot += static_cast<double>(p.grad_out.ptr(b, h, i)[c]) * p.fwd.v.ptr(b, h, j)[c];
          dP[j] = dot * M[i * K + j];
          row_dot += dP[j] * P[i * K + j];
        }
        for (int64_t j = 0; j < K; ++j)
          dS[i * K + j] = masked[i * K + j] ? 0.0 : P[i * K + j] * (dP[j] - row_dot) / scale;
      }
      // grad_q[i] = sum_j dS[i,j] k[j];  grad_k[j] = sum_i dS[i,j] q[i].
      for (int64_t i = 0; i < Q; ++i) {
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < K; ++j) acc += dS[i * K + j] * p.fwd.k.ptr(b, h, j)[c];
          p.grad_q.ptr(b, h, i)[c] = static_cast<float>(acc);
        }
      }
      for (int64_t j = 0; j < K; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0.0;
          for (int64_t i = 0; i < Q; ++i) acc += dS[i * K + j] * p.fwd.q.ptr(b, h, i)[c];
          p.grad_k.ptr(b, h, j)[c] = static_cast<float>(acc);
        }
      }
    }
  }
}

}  // namespace mha::kernels
