// src/nn/projections.h: W_q, W_k, W_v applied with as few matrix products as
// the inputs allow, and only to the rows attention will read.
//
//   queries:[B,Q,Dq] keys:[B,K,Dk] values:[B,K,Dv] -> q:[B,Q,D] k:[B,K,D] v:[B,K,D]
//
// Inputs that are the same tensor (self-attention: queries, keys and values
// all one tensor; or keys = values) are projected by one product against the
// layers' weights stacked as [W_q; W_v; W_k], so each input row is read once.
// The outputs are column blocks of one (B, L, n*D) buffer, and q, k, v are
// strided views of it: nothing is copied to split heads either.
//
// Row needs: q rows are always all computed; batch row b needs v rows below
// v_rows[b] and k rows below k_rows[b] (k_rows <= v_rows <= K), e.g. the
// largest valid length of that row when padding is skipped. Rows past a need
// stay 0. Stacking q, v, k in that order makes every row's need a prefix of
// the stacked outputs, so each segment of rows is one product.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/linear.h"
#include "mha/tensor.h"

namespace mha::nn {

struct Projected {
  std::vector<Tensor> buffers;  // owners of the views below
  TensorView q, k, v;           // (B, L, D) views, innermost contiguous
};

struct RowNeeds {
  std::vector<int64_t> k_rows;  // [B], empty: all K rows
  std::vector<int64_t> v_rows;  // [B], empty: all K rows
};

// The layers must be initialised with the inputs' widths. Buffers are taken
// from `reuse` where one has the shape wanted (see take_buffer).
Projected project_qkv(const Tensor& queries, const Tensor& keys, const Tensor& values,
                      const LazyLinear& W_q, const LazyLinear& W_k, const LazyLinear& W_v,
                      const RowNeeds& needs, std::vector<Tensor>* reuse = nullptr);

// A tensor of `shape`: one from `reuse` with that shape if there is one (its
// contents are stale, for buffers that are fully written or whose stale rows
// are never read), else a new zeroed one. Reusing the last call's buffers
// saves the page faults and zeroing of fresh memory: ~10% of a B8 L512
// forward.
Tensor take_buffer(const Shape& shape, std::vector<Tensor>* reuse);

// dst rows [r0, r1) of batch row b = x rows [r0, r1) of b through `layer`.
// x:[B,L,in] dst:(B, L, out) view
void project_rows(const Tensor& x, const LazyLinear& layer, int64_t b, int64_t r0, int64_t r1,
                  const TensorView& dst);

}  // namespace mha::nn
