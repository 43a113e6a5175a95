// src/kernels/softmax_merge.h: one softmax over several key blocks, from each
// block's own softmax (the ring over ranks; split-K in general).
//
// A block b of keys gives, per query row, its normalised output O_b (the
// weighted sum of its values) and the fused kernel's statistics of its
// scores (kernels/params.h, SoftmaxStats: base 2, no additive mask): m_b =
// max_k t_k and s_b = sum_k 2^(t_k - m_b). The softmax over all blocks is
//   M = max_b m_b,   S = sum_b s_b 2^(m_b - M),
//   O = sum_b (s_b 2^(m_b - M) / S) O_b,
// and (M, S) are the statistics of that softmax, from which the fused
// backward recomputes the global weights block by block. A block in which
// the row has no live key (m_b = -inf) adds nothing; a row with no live key
// in any block keeps M = -inf, and its caller applies the fully-masked
// policy (uniform weights over every key, or zeros).
//
// merge_block (or merge_partial, for a block whose output is not yet
// divided by s_b) folds blocks in one at a time into a running (acc, M, S)
// with acc = sum_b s_b 2^(m_b - M) O_b (unnormalised); finish_row divides.
// The blocks' order is fixed by the caller, so the result is too. Used by
// the ring over ranks (dist/ring_attention.cpp) and the decode kernel's
// split-K chunks (cpu/decode/decode.cpp).
#pragma once

#include <cmath>
#include <cstdint>

namespace mha::kernels {

// One query row's running merge: acc:[width] (start zeroed), M = -inf, S = 0.
struct SoftmaxMergeRow {
  float* acc;
  float& M;
  float& S;
};

namespace detail {
// acc = acc 2^(M_old - M) + block 2^(m_b - M) * block_scale, S likewise.
inline void merge_scaled(SoftmaxMergeRow row, const float* block, float block_scale, float m_b, float s_b,
                         int64_t width) {
  if (m_b == -INFINITY) return;  // no live key in this block
  const float M = row.M > m_b ? row.M : m_b;
  const float keep = row.M == -INFINITY ? 0.0f : std::exp2(row.M - M);  // rescales what is there
  const float grow = std::exp2(m_b - M);
  const float add = block_scale * grow;
  for (int64_t x = 0; x < width; ++x) row.acc[x] = row.acc[x] * keep + block[x] * add;
  row.S = row.S * keep + s_b * grow;
  row.M = M;
}
}  // namespace detail

// Folds block (out:[width] normalised, m_b, s_b) into `row` (the ring: each
// block is a whole fused-kernel call, which normalises its output).
inline void merge_block(SoftmaxMergeRow row, const float* out, float m_b, float s_b, int64_t width) {
  detail::merge_scaled(row, out, s_b, m_b, s_b, width);
}

// Folds block (acc_b:[width] = sum_k 2^(t_k - m_b) v_k, not normalised,
// m_b, s_b) into `row` (split-K: the decode kernel's chunks leave their
// sums unnormalised, saving a division per chunk).
inline void merge_partial(SoftmaxMergeRow row, const float* acc_b, float m_b, float s_b, int64_t width) {
  detail::merge_scaled(row, acc_b, 1.0f, m_b, s_b, width);
}

// Folds one more logit t (base 2) that has no value into `row`: an
// attention sink (gpt-oss, kernels/params.h), counted once per row after
// its blocks. A row with no live key then ends with M = t and acc = 0.
inline void merge_sink(SoftmaxMergeRow row, float t, int64_t width) {
  const float M = row.M > t ? row.M : t;
  const float keep = row.M == -INFINITY ? 0.0f : std::exp2(row.M - M);  // acc is 0 when M = -inf
  for (int64_t x = 0; x < width; ++x) row.acc[x] *= keep;
  row.S = row.S * keep + std::exp2(t - M);
  row.M = M;
}

// acc /= S for a row with a live key (M > -inf); returns false (acc left
// as it is) for a row with none.
inline bool finish_row(SoftmaxMergeRow row, int64_t width) {
  if (row.M == -INFINITY) return false;
  const float inv = 1.0f / row.S;
  for (int64_t x = 0; x < width; ++x) row.acc[x] *= inv;
  return true;
}

}  // namespace mha::kernels
