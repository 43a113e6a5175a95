// The unfused attention backward: for each (batch row, head) the (Q, K)
// weights are read from the forward's save (or recomputed), and the four
// gradient products are BLAS calls:
//   grad_v = (P*M)^T dO,  dP = (dO v^T) * M,  grad_q = dS k,  grad_k = dS^T q.
// Scratch is two (Q, K) matrices per thread, reused across heads.
//
// Masks (p.fwd.masks): the weights are recomputed by masked_softmax_row, the
// forward's own row rule, and dS is zeroed on every pair that does not take
// part and on every fully masked row. A softcap multiplies dS by its
// derivative and sinks get their gradient -exp(sink - lse) * rowsum(dP * P),
// both from recomputed scores (the saved weights are then not read). Grouped heads: the query heads of one
// kv head are consecutive, so the first of them writes grad_k/grad_v and the
// others add to it (beta = 1).
//
// Threads: the (batch row, kv head) pairs are split over mha's threads, each
// pair's query heads run in order on one thread from start to end, so that
// the softmax work runs in parallel with the products, no two threads write
// the same gradient rows, and the result does not depend on the thread count
// (inside, cpu::sgemm is one single-threaded BLAS call). Scratch is per thread.

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "cpu/blas/attention_blas.h"
#include "cpu/blas/blas.h"
#include "cpu/reference/reference.h"
#include "kernels/masked_row.h"
#include "mha/threads.h"

namespace mha::kernels {

namespace {

// Whether p uses a mask option (grouped heads alone change no weight).
bool uses_masks(const AttentionBackward& p) {
  const MaskOptions& m = p.fwd.masks;
  return m.key_keep || m.key_bias || m.pair_keep || m.pair_bias || m.bounds_keys() || m.has_score_options() ||
         m.fill != MaskFill::Seed || m.fully_masked != FullyMaskedRows::Uniform;
}

// Whether the weights must be recomputed even when the forward saved them:
// the softcap's derivative and the sinks' weights come from the scores.
bool needs_scores(const AttentionBackward& p) { return p.fwd.masks.softcap > 0.0f || p.fwd.masks.sinks; }

// s:[Q,K] <- the softmax weights of head (b, h), recomputed from q and k:
// by the forward's row rule when masks are set, else by a full softmax;
// cap:[Q,K] the softcap's derivative and sink_w:[Q] the sinks' weights
// (kernels/masked_row.h), each when not null.
void recompute_weights(const AttentionBackward& p, int64_t b, int64_t h, float* s, float* cap = nullptr,
                       float* sink_w = nullptr) {
  const int64_t Q = p.Q(), K = p.K(), hk = p.kv_head(h);
  cpu::sgemm(false, true, Q, K, p.d(), 1.0f, p.fwd.q.ptr(b, h), p.fwd.q.stride[2], p.fwd.k.ptr(b, hk),
             p.fwd.k.stride[2], 0.0f, s, K, p.fwd.precision);
  if (uses_masks(p)) {
    for (int64_t i = 0; i < Q; ++i)
      masked_softmax_row(p.fwd.masks, p.length(b, i), p.fwd.scale_divisor, b, h, i, Q, K, s + i * K,
                         cap ? cap + i * K : nullptr, sink_w ? sink_w + i : nullptr);
    return;
  }
  for (int64_t i = 0; i < Q; ++i) {
    float* row = s + i * K;
    const float len = p.length(b, i);
    float row_max = -INFINITY;
    for (int64_t j = 0; j < K; ++j) {
      float x = row[j] / p.fwd.scale_divisor;
      if (!(static_cast<float>(j) < len)) x = kMaskFill;
      row[j] = x;
      row_max = std::fmax(row_max, x);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += (row[j] = std::exp(row[j] - row_max));
    for (int64_t j = 0; j < K; ++j) row[j] /= sum;
  }
}

// row:[K] <- dS of query i: w * (dP - rowsum(dP * w)) / sqrt(d) (times the
// softcap's derivative cap:[K] when not null) on the pairs that take part,
// 0 elsewhere and on a fully masked row. row holds dP (already times the
// dropout multipliers) on entry; w:[K] are the weights. Returns
// rowsum(dP * w) (0 on a fully masked row): the sinks' gradient reads it.
double softmax_backward_row(const AttentionBackward& p, bool masked, int64_t b, int64_t h,
                            int64_t i, const float* w, const float* cap, float* row) {
  const int64_t Q = p.Q(), K = p.K();
  const float len = p.length(b, i);
  if (masked && fully_masked_row(p.fwd.masks, len, b, h, i, Q, K)) {
    for (int64_t j = 0; j < K; ++j) row[j] = 0.0f;
    return 0.0;
  }
  double row_dot = 0.0;
  for (int64_t j = 0; j < K; ++j) row_dot += static_cast<double>(row[j]) * w[j];
  const float rd = static_cast<float>(row_dot);
  for (int64_t j = 0; j < K; ++j) {
    const bool part = masked ? takes_part(p.fwd.masks, len, b, h, i, j, Q, K) : static_cast<float>(j) < len;
    row[j] = part ? w[j] * (row[j] - rd) / p.fwd.scale_divisor : 0.0f;
    if (cap) row[j] *= cap[j];
  }
  return row_dot;
}

}  // namespace

void attention_backward_blas(const AttentionBackward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  const int64_t group = H / p.Hkv();  // query heads per kv head
  const bool masked = uses_masks(p);
  const size_t QK = static_cast<size_t>(Q * K);
  const int64_t Hkv = p.Hkv();
  const bool scores = needs_scores(p), capped = p.fwd.masks.softcap > 0.0f, sinks = p.fwd.masks.sinks;
  const bool saved = p.fwd.weights && !scores;  // read the forward's weights
  // Each (b, h)'s share of dL/d sink_h, summed over b in order after the
  // threads: the same bits at any thread count.
  std::vector<double> sink_part(sinks ? static_cast<size_t>(B * H) : 0, 0.0);
  struct Scratch {
    std::vector<float> weights, dropped, dS, cap, sink_w;
  };
  const double work = static_cast<double>(B * H) * static_cast<double>(Q * K) * static_cast<double>(2 * (d + dv));
  core::parallel_for_with(
      B * Hkv, core::team_for(work, B * Hkv),
      [&](int) {
        return Scratch{std::vector<float>(saved ? 0 : QK), std::vector<float>(p.fwd.dropout.active() ? QK : 0),
                       std::vector<float>(QK), std::vector<float>(capped ? QK : 0),
                       std::vector<float>(sinks ? static_cast<size_t>(Q) : 0)};
      },
      [&](int64_t bg, Scratch& st) {
    const int64_t b = bg / Hkv, g = bg % Hkv;
    std::vector<float>& weights_scratch = st.weights;
    std::vector<float>& dropped = st.dropped;
    std::vector<float>& dS = st.dS;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const int64_t hk = p.kv_head(h);
      // The first query head of a kv head writes its gradients, the rest add.
      const float beta = h % group == 0 ? 0.0f : 1.0f;
      const uint64_t base = static_cast<uint64_t>((b * H + h) * Q * K);
      const float* P = saved ? p.fwd.weights + base : weights_scratch.data();
      if (!saved)
        recompute_weights(p, b, h, weights_scratch.data(), capped ? st.cap.data() : nullptr,
                          sinks ? st.sink_w.data() : nullptr);
      // The weights the forward multiplied v by: P * M.
      const float* Pd = P;
      if (p.fwd.dropout.active()) {
        for (size_t x = 0; x < QK; ++x) dropped[x] = P[x] * p.fwd.dropout.multiplier(base + x);
        Pd = dropped.data();
      }
      const float* dO = p.grad_out.ptr(b, h);
      const int64_t ld_dO = p.grad_out.stride[2];
      // grad_v:[K,dv] (+)= Pd^T:[K,Q] @ dO:[Q,dv]
      cpu::sgemm(true, false, K, dv, Q, 1.0f, Pd, K, dO, ld_dO, beta, p.grad_v.ptr(b, hk),
                 p.grad_v.stride[2]);
      // dS:[Q,K] <- dO:[Q,dv] @ v^T:[dv,K], then * M, then the softmax's Jacobian.
      cpu::sgemm(false, true, Q, K, dv, 1.0f, dO, ld_dO, p.fwd.v.ptr(b, hk), p.fwd.v.stride[2], 0.0f,
                 dS.data(), K);
      for (int64_t i = 0; i < Q; ++i) {
        float* row = dS.data() + i * K;
        if (p.fwd.dropout.active())
          for (int64_t j = 0; j < K; ++j) row[j] *= p.fwd.dropout.multiplier(base + i * K + j);
        const double rd = softmax_backward_row(p, masked, b, h, i, P + i * K, capped ? st.cap.data() + i * K : nullptr, row);
        // dL/d sink = -exp(sink - logsumexp) * rowsum(dP * P) (dP of the sink is 0: it has no value).
        if (sinks) sink_part[static_cast<size_t>(b * H + h)] -= static_cast<double>(st.sink_w[static_cast<size_t>(i)]) * rd;
      }
      // grad_q:[Q,d] = dS:[Q,K] @ k:[K,d];  grad_k:[K,d] (+)= dS^T:[K,Q] @ q:[Q,d]
      cpu::sgemm(false, false, Q, d, K, 1.0f, dS.data(), K, p.fwd.k.ptr(b, hk), p.fwd.k.stride[2], 0.0f,
                 p.grad_q.ptr(b, h), p.grad_q.stride[2]);
      cpu::sgemm(true, false, K, d, Q, 1.0f, dS.data(), K, p.fwd.q.ptr(b, h), p.fwd.q.stride[2], beta,
                 p.grad_k.ptr(b, hk), p.grad_k.stride[2]);
    }
      });
  if (sinks)
    for (int64_t h = 0; h < H; ++h) {
      double acc = 0.0;
      for (int64_t b = 0; b < B; ++b) acc += sink_part[static_cast<size_t>(b * H + h)];
      p.grad_sinks[h] = static_cast<float>(acc);
    }
}

}  // namespace mha::kernels
