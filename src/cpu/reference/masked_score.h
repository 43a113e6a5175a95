// src/cpu/reference/masked_score.h: the reference kernels' score of one
// (query, key) pair, every mask rule spelled out one line each, in the order
// the module applies them. The forward reference and the masked backward
// reference (which recomputes the forward's weights) share it; the fast
// kernels have their own (kernels/masked_row.h), and the tests hold the two
// together.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/params.h"

namespace mha::kernels::reference {

// Query i of (b, h) against key j of kv head hk (grouped heads share k), the
// row's valid length `len`: q . k / scale_divisor (the dot product in double,
// then in T), softcapped, plus ALiBi's bias and the additive masks; a key
// that does not take part (keep = false) scores the fill.
template <class T>
T masked_score(const AttentionForward& p, int64_t b, int64_t h, int64_t hk, int64_t i, int64_t j, float len,
               bool& keep) {
  const MaskOptions& m = p.masks;
  const int64_t Q = p.Q(), K = p.K(), d = p.d();
  const float* q = p.q.ptr(b, h, i);
  const float* k = p.k.ptr(b, hk, j);
  double dot = 0.0;
  for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[c];
  T s = static_cast<T>(dot) / p.scale_divisor;
  if (m.softcap > 0.0f) s = m.softcap * std::tanh(s / m.softcap);  // Gemma 2's softcapping
  if (m.alibi_slopes)  // ALiBi: -slope * |i + K - Q - j|
    s -= m.alibi_slopes[h] * static_cast<T>(m.alibi_distance(i, j, Q, K));
  if (m.key_bias) s += m.bias_row(b, K)[j];
  if (m.pair_bias) s += m.pair_bias[m.pair_offset(b, h, i, K) + j];
  keep = static_cast<float>(j) < len;  // the d2l chapter's comparison (a length 2.5 keeps key 2)
  if (m.key_keep && !m.keep_row(b, K)[j]) keep = false;
  if (m.pair_keep && !m.pair_keep[m.pair_offset(b, h, i, K) + j]) keep = false;
  if (j > m.last_key(i, Q, K) || j < m.first_key(i, Q, K)) keep = false;
  if (!keep) s = m.fill_value();
  return s;
}

// Query i of (b, h)'s scores by masked_score, over every key: row:[K] (in
// T), keep:[K] whether each key takes part (null: not wanted). Returns the
// row's largest score, and whether the row gets the fully-masked policy
// instead of a softmax: no key takes part, or every score of the row is -inf
// (kept keys at -inf and no masked key holding the d2l chapter's finite fill).
template <class T>
struct ScoreRow {
  T max;
  bool fully_masked;
};
template <class T>
ScoreRow<T> masked_scores(const AttentionForward& p, int64_t b, int64_t h, int64_t i, T* row, char* keep) {
  const MaskOptions& m = p.masks;
  const int64_t K = p.K(), hk = p.kv_head(h);
  const float len = p.length(b, i);
  T row_max = -INFINITY;
  int64_t kept = 0, live = 0;  // keys kept; kept with a score above -inf
  for (int64_t j = 0; j < K; ++j) {
    bool k_ok = false;
    const T s = masked_score<T>(p, b, h, hk, i, j, len, k_ok);
    kept += k_ok;
    live += k_ok && s != -INFINITY;
    if (keep) keep[j] = k_ok;
    row[j] = s;
    row_max = std::fmax(row_max, s);
  }
  // With sinks the denominator always holds the sink: no row is fully masked.
  return {row_max, !m.sinks && (kept == 0 || (live == 0 && (kept == K || m.fill_value() == -INFINITY)))};
}

// The derivative of the softcap at query i of (b, h), key j of kv head hk:
// d softcap(x) / dx = 1 - tanh^2(x / softcap), x = q . k / scale_divisor
// (in double); 1 without a softcap.
inline double softcap_slope(const AttentionForward& p, int64_t b, int64_t h, int64_t hk, int64_t i, int64_t j) {
  const float cap = p.masks.softcap;
  if (!(cap > 0.0f)) return 1.0;
  const float* q = p.q.ptr(b, h, i);
  const float* k = p.k.ptr(b, hk, j);
  double dot = 0.0;
  for (int64_t c = 0; c < p.d(); ++c) dot += static_cast<double>(q[c]) * k[c];
  const double t = std::tanh(dot / p.scale_divisor / cap);
  return 1.0 - t * t;
}

}  // namespace mha::kernels::reference
