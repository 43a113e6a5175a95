// The reference backward of attention with every mask option and grouped
// heads (kernels/attention_backward_masked.h has the formulas). Everything in
// double, the weights recomputed from q and k by the forward's rules spelled
// out again here, one line per rule.
#include <cmath>
#include <vector>

#include "kernels/attention_backward_masked.h"

namespace mha::kernels {

void attention_backward_masked_reference(const AttentionForward& p, const TensorView& grad_out,
                                         const TensorView& grad_q, const TensorView& grad_k,
                                         const TensorView& grad_v) {
  const int64_t B = p.B(), H = p.H(), Hkv = p.Hkv(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  const MaskOptions& m = p.masks;
  const double scale = p.scale_divisor;
  const size_t QK = static_cast<size_t>(Q * K);
  std::vector<double> P(QK), M(QK), dS(QK), dP(static_cast<size_t>(K));
  std::vector<char> keep(QK), empty(static_cast<size_t>(Q));
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
        const float len = p.length(b, i);
        double row_max = -INFINITY;
        int64_t kept = 0, live = 0;  // keys kept; kept with a score above -inf
        for (int64_t j = 0; j < K; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += static_cast<double>(p.q.ptr(b, h, i)[c]) * p.k.ptr(b, hk, j)[c];
          double s = dot / scale;
          if (m.key_bias) s += m.bias_row(b, K)[j];
          if (m.pair_bias) s += m.pair_bias[m.pair_offset(b, h, i, K) + j];
          bool k_ok = static_cast<float>(j) < len;
          if (m.key_keep && !m.keep_row(b, K)[j]) k_ok = false;
          if (m.pair_keep && !m.pair_keep[m.pair_offset(b, h, i, K) + j]) k_ok = false;
          if (j > m.last_key(i, Q, K)) k_ok = false;
          if (j < m.first_key(i, Q, K)) k_ok = false;
          if (!k_ok) s = m.fill_value();
          kept += k_ok;
          if (k_ok && s != -INFINITY) ++live;
          keep[i * K + j] = k_ok;
          P[i * K + j] = s;
          row_max = std::fmax(row_max, s);
          M[i * K + j] = p.dropout.multiplier(base + i * K + j);
        }
        // The forward's rule (attention_reference.cpp): the policy when no key
        // is kept or every score of the row is -inf.
        empty[i] = kept == 0 || (live == 0 && (kept == K || m.fill == MaskFill::NegInf));
        if (empty[i]) {
          const double w = m.fully_masked == FullyMaskedRows::Uniform ? 1.0 / K : 0.0;
          for (int64_t j = 0; j < K; ++j) P[i * K + j] = w;
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < K; ++j) sum += (P[i * K + j] = std::exp(P[i * K + j] - row_max));
        for (int64_t j = 0; j < K; ++j) P[i * K + j] /= sum;
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
        for (int64_t j = 0; j < K; ++j)
          dS[i * K + j] = empty[i] || !keep[i * K + j] ? 0.0 : P[i * K + j] * (dP[j] - row_dot) / scale;
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
