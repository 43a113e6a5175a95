// src/kernels/masked_row.h: one row of scores -> softmax weights, every mask
// applied. The one definition shared by the kernels that materialise score
// rows (the BLAS forward, and a backward that recomputes the weights), so
// that they cannot drift apart; the reference kernel spells the same rules
// out on its own, and the tests hold the two together.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/params.h"

namespace mha::kernels {

// Whether key j takes part for query i of (b, h): the valid length `len`
// (float(j) < len, the d2l chapter's comparison), the boolean masks and the
// range [first_key, last_key].
inline bool takes_part(const MaskOptions& m, float len, int64_t b, int64_t h, int64_t i, int64_t j,
                       int64_t Q, int64_t K) {
  return static_cast<float>(j) < len && j >= m.first_key(i, Q, K) && j <= m.last_key(i, Q, K) &&
         (!m.key_keep || m.keep_row(b, K)[j]) &&
         (!m.pair_keep || m.pair_keep[m.pair_offset(b, h, i, K) + j]);
}

// row:[K] raw scores q.k of query i in (b, h) -> its weights, in place:
// scaled, softcapped, ALiBi's bias and the additive masks added, masked keys
// set to the fill, then a softmax (with the head's sink in the denominator),
// or the fully-masked policy when no key is live. Returns true for a fully
// masked row (its weights do not depend on the scores: no gradient flows).
// For a backward: cap_slope:[K] (or null) gets the softcap's derivative
// 1 - tanh^2 per key (1 without a softcap), *sink_weight (or null) the
// sink's weight exp(sink - logsumexp) (0 without sinks).
inline bool masked_softmax_row(const MaskOptions& m, float len, float scale_divisor, int64_t b,
                               int64_t h, int64_t i, int64_t Q, int64_t K, float* row,
                               float* cap_slope = nullptr, float* sink_weight = nullptr) {
  const int64_t first = m.first_key(i, Q, K);  // keys before it are masked
  const int64_t last = m.last_key(i, Q, K);    // keys after it are masked
  const uint8_t* key_keep = m.keep_row(b, K);
  const float* key_bias = m.bias_row(b, K);
  const uint8_t* pair_keep = m.pair_keep ? m.pair_keep + m.pair_offset(b, h, i, K) : nullptr;
  const float* pair_bias = m.pair_bias ? m.pair_bias + m.pair_offset(b, h, i, K) : nullptr;
  const float fill = m.fill_value();
  float row_max = -INFINITY;
  int64_t kept = 0, live = 0;  // keys kept; kept with a score above -inf
  const float cap = m.softcap;
  const float slope = m.alibi_slopes ? m.alibi_slopes[h] : 0.0f;
  for (int64_t j = 0; j < K; ++j) {
    float x = row[j] / scale_divisor;
    if (cap > 0.0f) {
      const float t = std::tanh(x / cap);
      x = cap * t;
      if (cap_slope) cap_slope[j] = 1.0f - t * t;
    } else if (cap_slope) {
      cap_slope[j] = 1.0f;
    }
    if (m.alibi_slopes) x -= slope * static_cast<float>(m.alibi_distance(i, j, Q, K));
    if (key_bias) x += key_bias[j];
    if (pair_bias) x += pair_bias[j];
    // float(j) < len is the d2l chapter's comparison (a length 2.5 keeps key 2).
    const bool keep = static_cast<float>(j) < len && j >= first && j <= last &&
                      (!key_keep || key_keep[j]) && (!pair_keep || pair_keep[j]);
    if (!keep) x = fill;
    kept += keep;
    live += keep && x != -INFINITY;
    row[j] = x;
    row_max = std::fmax(row_max, x);
  }
  // No key kept, or every score -inf: the policy (see attention_reference.cpp);
  // never with sinks (kernels/params.h).
  if (!m.sinks && (kept == 0 || (live == 0 && (kept == K || fill == -INFINITY)))) {
    const float w = m.fully_masked == FullyMaskedRows::Uniform ? 1.0f / static_cast<float>(K) : 0.0f;
    std::fill(row, row + K, w);
    if (sink_weight) *sink_weight = 0.0f;
    return true;
  }
  const float sink = m.sinks ? m.sinks[h] : -INFINITY;
  const float mx = std::fmax(row_max, sink);
  const float sink_e = m.sinks ? std::exp(sink - mx) : 0.0f;
  float sum = sink_e;
  for (int64_t j = 0; j < K; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  for (int64_t j = 0; j < K; ++j) row[j] /= sum;
  if (sink_weight) *sink_weight = sink_e / sum;
  return false;
}

// Whether query i of (b, h) gets the fully-masked policy, as
// masked_softmax_row decides it, but without the scores (for a backward that
// reads saved weights): no key takes part, or every key that does has
// additive masks summing to -inf (a finite score plus -inf is -inf) and no
// masked key holds the d2l chapter's finite fill.
inline bool fully_masked_row(const MaskOptions& m, float len, int64_t b, int64_t h, int64_t i,
                             int64_t Q, int64_t K) {
  if (m.sinks) return false;  // the sink is always in the denominator
  const float* key_bias = m.bias_row(b, K);
  const float* pair_bias = m.pair_bias ? m.pair_bias + m.pair_offset(b, h, i, K) : nullptr;
  int64_t kept = 0;
  for (int64_t j = 0; j < K; ++j) {
    if (!takes_part(m, len, b, h, i, j, Q, K)) continue;
    ++kept;
    const float bias = (key_bias ? key_bias[j] : 0.0f) + (pair_bias ? pair_bias[j] : 0.0f);
    if (bias != -INFINITY) return false;
  }
  return kept == 0 || kept == K || m.fill == MaskFill::NegInf;
}

}  // namespace mha::kernels
