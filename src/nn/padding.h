// src/nn/padding.h: which projected key and value rows attention will read.
//
// With the seed's -1e6 fill, a masked key of a query whose valid length n is
// > 0 has weight exp(-1e6 - max score), exactly 0 in float32 unless one of
// the query's real scores is itself within ~104 of -1e6. So batch row b needs
// k rows only below max_q n(b, q) and v rows only below that too, except
// where some query has n = 0: such a query attends uniformly to all K keys,
// so all of b's v rows are needed (but still no k row past the lengths: every
// masked score is the fill, whatever the key).
#pragma once

#include <cstdint>
#include <vector>

#include "mha/linear.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"
#include "nn/projections.h"

namespace mha::nn {

// Row needs for keys of K positions; empty (all rows) without lengths.
RowNeeds padding_row_needs(const ValidLens& lens, int64_t B, int64_t Q, int64_t K);

// Non-finite values past the lengths: the seed multiplies a masked key's
// value by weight 0, and 0 * NaN or 0 * inf is NaN in every output that
// weighs it. For each batch row whose skipped value rows are not all finite
// (in `values`, or because W_v / its bias is not), project all its k and v
// rows, set its needs to K, and flag it in the result ([B], for
// kernels::AttentionForward::read_all_keys; empty when no row is flagged).
// values:[B,K,Dv] keys:[B,K,Dk]
std::vector<uint8_t> complete_nonfinite_values(Projected& proj, RowNeeds& needs, const Tensor& keys,
                                               const Tensor& values, const LazyLinear& W_k,
                                               const LazyLinear& W_v);

// The exception above, made safe after the projections: where a batch row's
// v rows were cut short and its scores are not bounded away from the fill
// (d max|q| max|k| / scale_divisor < 9.9e5), project its remaining v rows
// from `values`. values:[B,K,Dv]
void complete_values_near_fill(Projected& proj, const RowNeeds& needs, const Tensor& values,
                               const LazyLinear& W_v, int64_t heads, float scale_divisor);

}  // namespace mha::nn
