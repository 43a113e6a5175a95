// src/nn/projections.h: W_q, W_k, W_v applied with as few matrix products as
// the inputs allow, and only to the rows attention will read.
//
//   queries:[B*Q rows, Dq] keys:[B*K rows, Dk] values:[B*K rows, Dv]  (rows in a RowLayout)
//     -> q:(B,H,Q,d) k:(B,Hkv,Kt,d) v:(B,Hkv,Kt,d) head views
//
// Inputs that are the same tensor (self-attention: queries, keys and values
// all one tensor; or keys = values) are projected into one row buffer whose
// column blocks are [q | v | k], one product per layer against its weight
// packed once per version (LazyLinear::packed_weight), all in one batch of
// row blocks; q, k, v are strided head views of the buffer: nothing is
// copied to split heads. Key and value
// buffers hold Kt >= K positions per batch row: the rows after the K given
// ones are left for the caller to fill (appended keys), and are zero unless
// the buffer was reused.
//
// Row needs (batch-major layouts only): q rows are always all computed;
// batch row b needs v rows below v_rows[b] and k rows below k_rows[b]
// (k_rows <= v_rows <= K), e.g. the largest valid length of that row when
// padding is skipped. Rows past a need are not written. Stacking q, v, k in
// that order makes every row's need a prefix of the stacked outputs, so each
// segment of rows is one product.
//
// Rotary (ProjectionShape::rotary, mha/rotary.h): q and k are rotated in
// their products' epilogue (cpu/gemm/parallel_gemm.h, RowEpilogue), each row
// block right after it is computed, with one cos/sin table per call; the
// same bits as apply_rotary over the finished buffers (nn/rotary.h).
#pragma once

#include <cstdint>
#include <vector>

#include "nn/layer_ref.h"
#include "mha/precision.h"
#include "mha/rotary.h"
#include "mha/tensor.h"

namespace mha::nn {

// How the rows of a call's buffers are ordered: rows are (b, position)
// pairs, batch-major ([B, L, width]: the d2l chapter's layout, batch_first)
// or position-major ([L, B, width]: PyTorch's default, and unbatched calls).
struct RowLayout {
  bool seq_first = false;
  int64_t B = 0;
  // The row of (b, pos) among B*L rows.
  int64_t row(int64_t b, int64_t pos, int64_t L) const { return seq_first ? pos * B + b : b * L + pos; }
  // A buffer of B*L rows (row stride ld) whose columns [0, heads*d) are seen
  // as (B, heads, L, d).
  TensorView heads(float* data, int64_t L, int64_t heads, int64_t d, int64_t ld) const;
  // True when each batch row's positions are consecutive rows.
  bool batch_major() const { return !seq_first || B == 1; }
};

struct Projected {
  std::vector<Tensor> buffers;  // owners of the views below
  TensorView q, k, v;           // (B, H, Q, d), (B, Hkv, Kt, d), (B, Hkv, Kt, d)
};

struct RowNeeds {
  std::vector<int64_t> k_rows;  // [B], empty: all K rows
  std::vector<int64_t> v_rows;  // [B], empty: all K rows
};

struct ProjectionShape {
  RowLayout layout;
  int64_t Q = 0, K = 0, Kt = 0;  // query positions, given key positions, key rows per batch row
  int64_t H = 0, Hkv = 0, d = 0;
  Precision precision = Precision::Float32;  // of the products (mha/precision.h)
  // A decode step: products of very few rows run as dot products against
  // the weights in place (cpu/gemm/few_rows.h), faster there; off, every
  // row gets the packed product's bits whatever the rows around it.
  bool few_rows_as_dots = false;
  // Rotary position embeddings on q and k (off by default): row (b, i) of
  // either at position i, or rotary_first[b] + i where rotary_first ([B])
  // is given (a cached call's new positions follow each row's cached ones).
  Rotary rotary = {};
  const int64_t* rotary_first = nullptr;
};

// The layers must be initialised with the inputs' widths. Buffers are taken
// from `reuse` where one has the shape wanted (see take_buffer). Needs are
// honoured only in batch-major layouts (else all rows are projected).
Projected project_qkv(const Tensor& queries, const Tensor& keys, const Tensor& values,
                      const LayerRef& W_q, const LayerRef& W_k, const LayerRef& W_v,
                      const ProjectionShape& shape, const RowNeeds& needs,
                      std::vector<Tensor>* reuse = nullptr);

// Every element of proj's buffers (q, k, v and any appended rows) rounded to
// bfloat16 in place: what attention multiplies in bfloat16 mode
// (mha/precision.h).
void round_to_bf16(Projected& proj);

// A tensor of `shape`: one from `reuse` with that many elements if there is
// one, reshaped (its contents are stale, for buffers that are fully written or whose stale rows
// are never read), else a new zeroed one. Reusing the last call's buffers
// saves the page faults and zeroing of fresh memory: ~10% of a B8 L512
// forward.
Tensor take_buffer(const Shape& shape, std::vector<Tensor>* reuse);

// Positions [p0, p1) of batch row b of x (batch-major, L positions per batch
// row) through `layer`, written to the same positions of dst, a head view
// (B, heads, Kt, d) of the layer's whole output.
void project_rows(const Tensor& x, int64_t L, const LayerRef& layer, int64_t b, int64_t p0, int64_t p1,
                  const TensorView& dst, Precision precision = Precision::Float32);

}  // namespace mha::nn
