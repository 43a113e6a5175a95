// The reference backward of attention with every mask option and grouped
// heads (cpu/reference/attention_backward_masked.h has the formulas). Everything in
// double, the weights recomputed from q and k by the forward reference's
// rules (cpu/reference/masked_score.h).
#include <cmath>
#include <vector>

#include "cpu/reference/attention_backward_masked.h"
#include "cpu/reference/masked_score.h"

namespace mha::kernels {

void attention_backward_masked_reference(const AttentionForward& p, const TensorView& grad_out,
                                         const TensorView& grad_q, const TensorView& grad_k,
                                         const TensorView& grad_v, float* grad_sinks) {
  const int64_t B = p.B(), H = p.H(), Hkv = p.Hkv(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  const MaskOptions& m = p.masks;
  const double scale = p.scale_divisor;
  const size_t QK = static_cast<size_t>(Q * K);
  std::vector<double> P(QK), M(QK), dS(QK), dP(static_cast<size_t>(K));
  std::vector<char> keep(QK), empty(static_cast<size_t>(Q));
  // The sink's weight exp(sink - logsumexp) of each query, and each head's
  // dL/d sink = -sum over rows and queries of that weight * rowsum(dP * P).
  std::vector<double> sink_w(static_cast<size_t>(Q), 0.0), gs(static_cast<size_t>(H), 0.0);
  // grad_k, grad_v accumulate over the query heads of each kv head.
  std::vector<double> gk(static_cast<size_t>(B * Hkv * K * d), 0.0);
  std::vector<double> gv(static_cast<size_t>(B * Hkv * K * dv), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = p.kv_head(h);
      double* gk_bh = gk.data() + (b * Hkv + hk) * K * d;
      double* gv_bh = gv.data() + (b * Hkv + hk) * K * dv;
      const uint64_t base = static_cast<uint64_t>((b * H + h) * Q * K);
      // P: the forward's weights, and which pairs take part.
      for (int64_t i = 0; i < Q; ++i) {
        const reference::ScoreRow<double> row =
            reference::masked_scores(p, b, h, i, P.data() + i * K, keep.data() + i * K);
        for (int64_t j = 0; j < K; ++j) M[i * K + j] = p.dropout.multiplier(base + i * K + j);
        // The forward's rule: the policy when no key is kept or every score of
        // the row is -inf.
        empty[i] = row.fully_masked;
        if (empty[i]) {
          const double w = m.fully_masked == FullyMaskedRows::Uniform ? 1.0 / K : 0.0;
          for (int64_t j = 0; j < K; ++j) P[i * K + j] = w;
          continue;
        }
        const double sink = m.sinks ? m.sinks[h] : -INFINITY;
        const double mx = std::fmax(row.max, sink);
        double sum = m.sinks ? std::exp(sink - mx) : 0.0;
        for (int64_t j = 0; j < K; ++j) sum += (P[i * K + j] = std::exp(P[i * K + j] - mx));
        for (int64_t j = 0; j < K; ++j) P[i * K + j] /= sum;
        if (m.sinks) sink_w[i] = std::exp(sink - mx) / sum;
      }
      // grad_v[hk][j] += sum_i P[i,j] M[i,j] dO[i];  dS as in the header.
      for (int64_t i = 0; i < Q; ++i) {
        const float* dO = grad_out.ptr(b, h, i);
        double row_dot = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          const double pm = P[i * K + j] * M[i * K + j];
          double dot = 0.0;
          for (int64_t c = 0; c < dv; ++c) {
            gv_bh[j * dv + c] += pm * dO[c];
            dot += static_cast<double>(dO[c]) * p.v.ptr(b, hk, j)[c];
          }
          dP[j] = dot * M[i * K + j];
          row_dot += dP[j] * P[i * K + j];
        }
        // The softcap's chain rule: dS times 1 - tanh^2 (ALiBi's bias is a constant).
        for (int64_t j = 0; j < K; ++j)
          dS[i * K + j] = empty[i] || !keep[i * K + j]
                              ? 0.0
                              : P[i * K + j] * (dP[j] - row_dot) / scale * reference::softcap_slope(p, b, h, hk, i, j);
        if (m.sinks) gs[h] -= sink_w[i] * row_dot;
      }
      // grad_q[i] = sum_j dS[i,j] k[hk][j];  grad_k[hk][j] += sum_i dS[i,j] q[i].
      for (int64_t i = 0; i < Q; ++i) {
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < K; ++j) acc += dS[i * K + j] * p.k.ptr(b, hk, j)[c];
          grad_q.ptr(b, h, i)[c] = static_cast<float>(acc);
        }
      }
      for (int64_t j = 0; j < K; ++j)
        for (int64_t c = 0; c < d; ++c)
          for (int64_t i = 0; i < Q; ++i) gk_bh[j * d + c] += dS[i * K + j] * p.q.ptr(b, h, i)[c];
    }
  }
  if (m.sinks)
    for (int64_t h = 0; h < H; ++h) grad_sinks[h] = static_cast<float>(gs[h]);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hkv; ++hk)
      for (int64_t j = 0; j < K; ++j) {
        for (int64_t c = 0; c < d; ++c)
          grad_k.ptr(b, hk, j)[c] = static_cast<float>(gk[((b * Hkv + hk) * K + j) * d + c]);
        for (int64_t c = 0; c < dv; ++c)
          grad_v.ptr(b, hk, j)[c] = static_cast<float>(gv[((b * Hkv + hk) * K + j) * dv + c]);
      }
}

}  // namespace mha::kernels
