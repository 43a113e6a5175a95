// mha/inspect.h: what a head attends to, read from its attention weights.
//
// A head that always looks d positions back draws a diagonal in its weights:
// query t puts its weight on key t - d. head_offsets() finds that d for each
// head: the mean weight at every offset d = t - k, over the real (query, key)
// pairs of a batch, and the offset where that mean is largest.
//
//   model.forward(batch.tokens, B, T, batch.valid_lens());
//   mha::HeadOffsets o = mha::head_offsets(model.layer(0).attention_weights(),
//                                          batch.valid_lens(), /*first_query=*/task.config().far);
//   o.offset[h];   // e.g. 10: head h looks ten positions back
//   o.weight[h];   // its mean weight there, e.g. 0.97
//
// Pairs (self-attention, where the queries and keys are one sequence): key k
// of query t in batch row b counts iff float(k) < valid_len(b, t), the d2l chapter's
// masking rule, and query t counts iff float(t) < valid_len(b, t) too, i.e.
// the query is itself a position of the sequence rather than padding. With
// valid_lens (B,) that keeps the t, k < length square of each row; with
// (B, Q) lengths a query whose own position is masked counts as padding; with
// none every pair counts. The mean at an offset is over the pairs that have
// it (the count is in `pairs`), so a long offset is not diluted by the
// queries too close to the start to look that far back. Queries before
// `first_query` can be left out too, e.g. the positions a task does not
// score, where a trained head has nothing to look for.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha {

// What head_offsets() found: per head, the mean attention weight at every
// offset t - k and the offset where it peaks.
struct HeadOffsets {
  // Offsets run from min_offset = -(K-1) (query 0 on the last key) to
  // max_offset = Q-1 (the last query on key 0); index i stands for
  // offset min_offset + i.
  int64_t min_offset = 0, max_offset = 0;
  Tensor mean;                  // [H, Q+K-1]: mean weight at each offset, NaN where no pair has it
  std::vector<int64_t> pairs;   // [Q+K-1]: (batch row, query, key) triples averaged at each offset
  std::vector<int64_t> offset;  // [H]: the offset with the largest mean (the smallest such offset on a tie)
  std::vector<double> weight;   // [H]: that mean weight

  // The index of offset t in mean's columns and pairs: t - min_offset.
  int64_t index_of(int64_t t) const { return t - min_offset; }
};

// weights:[B,H,Q,K] (softmax weights, e.g. attention_weights()), valid_lens
// none, (B,) or (B,Q) -> each head's dominant offset t - k, over queries
// t >= first_query. Throws mha::Error for a rank other than 4, an empty axis,
// valid_lens that do not fit (B, Q), first_query outside [0, Q), non-finite
// weights, or no real (query, key) pair at all.
HeadOffsets head_offsets(const Tensor& weights, const ValidLens& valid_lens = {}, int64_t first_query = 0);

}  // namespace mha
