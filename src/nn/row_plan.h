// src/nn/row_plan.h: which projected key and value rows attention will read,
// so that the others are neither projected nor read (padding skipped).
//
// The fused kernel reads a batch row's keys only up to the last one any of
// its queries can see: the largest valid length (the d2l chapter's lengths)
// and the last kept key of a boolean key mask. Past that limit a masked key
// has weight exactly 0 in float32 (-inf, or the chapter's -1e6 fill below a
// real score by more than ~104), except
// - where a query has no live key: it averages every value row, uniformly
//   (the chapter's -1e6 fill, or FullyMaskedRows::Uniform), so all of the
//   batch row's v rows are needed (but still no k row past the limit);
// - where a skipped value is not finite: the chapter multiplies it by weight
//   0, and 0 * NaN is NaN in every output that weighs it, so the batch row is
//   projected and read in full (the kernel's read_all_keys);
// - under the -1e6 fill, where scores are not bounded away from the fill:
//   the remaining value rows are projected (complete_values_near_fill).
// Skipping needs batch-major rows and no appended keys (they sit past the
// given ones and always take part).
#pragma once

#include <cstdint>
#include <vector>

#include "mha/linear.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"
#include "nn/projections.h"

namespace mha::nn {

struct AttentionMasks;

struct RowPlan {
  RowNeeds needs;                      // empty: every row
  std::vector<uint8_t> read_all_keys;  // [B] or empty: batch rows read in full
};

// The rows the fused kernel reads for B batch rows of Q queries over K keys
// (Kt with appended ones), with these lengths and masks. values:[B*K rows, Dv]
// (batch-major) and W_v are scanned for non-finite skipped rows.
RowPlan plan_rows(const ValidLens& lens, const AttentionMasks& masks, const RowLayout& layout, int64_t Q,
                  int64_t K, int64_t Kt, const Tensor& values, const LayerRef& W_v);

// After the projections: flags in plan.read_all_keys every batch row with a
// non-finite projected value row among those projected (v:(B,Hkv,Kt,d) head
// view of the value buffer), which a masked key would otherwise hide.
void flag_nonfinite_values(RowPlan& plan, const TensorView& v, int64_t width);

// Under the -1e6 fill: where a batch row's v rows were cut short and its
// scores are not bounded away from the fill (d max|q| max|k| / scale_divisor
// < 9.9e5), project its remaining v rows from `values` (K positions per row).
// `precision`: of those products (mha/precision.h).
void complete_values_near_fill(Projected& proj, const RowNeeds& needs, const Tensor& values, int64_t K,
                               const LayerRef& W_v, float scale_divisor, Precision precision);

}  // namespace mha::nn
