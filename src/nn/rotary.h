// src/nn/rotary.h: rotary position embeddings applied in place (mha/rotary.h).
//
//   x:[B, heads, L, d] (a TensorView into a projection buffer), row (b, i) at
//   position first[b] + i (first null: i)  ->  x rotated (or rotated back)
//
// The projections rotate q and k in their product's epilogue (each row block
// right after it is computed: nn/projections.h, ProjectionShape::rotary),
// before bfloat16 rounding, so the kernels see the rounded rotated values;
// the engine rotates their gradients back after the attention backward
// (apply_rotary, a separate pass: the first product that reads them,
// dW_q += dq^T X, sums over all their rows, so no row block of them is
// consumed alone before the whole is; the kernels write them).
#pragma once

#include <cstdint>
#include <vector>

#include "mha/rotary.h"
#include "mha/tensor.h"

namespace mha::nn {

// theta_m for m in [0, dims/2), as mha/rotary.h defines it (float32).
void rotary_frequencies(const Rotary& r, float* theta);

// The cosines and sines of positions [p_lo, p_hi) for r: computed once per
// call (each entry alone, as rotate_row_reference computes it, so a row
// rotated through the table has the reference's bits), then shared by every
// row and head at those positions.
class RotaryTable {
 public:
  RotaryTable() = default;
  RotaryTable(const Rotary& r, int64_t p_lo, int64_t p_hi);
  bool enabled() const { return r_.enabled(); }
  const Rotary& rotary() const { return r_; }
  // Rotates the first `dims` entries of each of `heads` heads (d floats
  // apart, starting at row) by the angles of `position` (in [p_lo, p_hi)).
  void rotate_heads(float* row, int64_t heads, int64_t d, int64_t position, bool inverse) const;

 private:
  Rotary r_;
  int64_t p_lo_ = 0, half_ = 0, P_ = 0;
  std::vector<float> cs_;  // cos [P, half] then sin [P, half]
};

// The positions a call's rows take: [min first, max first + rows) (first
// null: [0, rows)).
void rotary_positions(const int64_t* first, int64_t B, int64_t rows, int64_t& p_lo, int64_t& p_hi);

// Rotates rows [0, rows) of every (b, head) of x by their positions' angles;
// `inverse` rotates by minus the angle (the backward). rows <= x.shape[2].
void apply_rotary(const TensorView& x, int64_t rows, const Rotary& r, const int64_t* first, bool inverse);
// The same with the angles of `table` (which must cover the rows' positions).
void apply_rotary(const TensorView& x, int64_t rows, const RotaryTable& table, const int64_t* first, bool inverse);

// The plain loop of one row (the reference the tests hold apply_rotary and
// the projections' epilogue to).
void rotate_row_reference(float* row, int64_t position, const Rotary& r, bool inverse);

}  // namespace mha::nn
