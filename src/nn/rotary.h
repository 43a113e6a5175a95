// src/nn/rotary.h: rotary position embeddings applied in place (mha/rotary.h).
//
//   x:[B, heads, L, d] (a TensorView into a projection buffer), row (b, i) at
//   position first[b] + i (first null: i)  ->  x rotated (or rotated back)
//
// The engine rotates the projected q and k after their products (and before
// bfloat16 rounding, so the kernels see the rounded rotated values), and
// rotates their gradients back after the attention backward.
#pragma once

#include <cstdint>

#include "mha/rotary.h"
#include "mha/tensor.h"

namespace mha::nn {

// theta_m for m in [0, dims/2), as mha/rotary.h defines it (float32).
void rotary_frequencies(const Rotary& r, float* theta);

// Rotates rows [0, rows) of every (b, head) of x by their positions' angles;
// `inverse` rotates by minus the angle (the backward). rows <= x.shape[2].
void apply_rotary(const TensorView& x, int64_t rows, const Rotary& r, const int64_t* first, bool inverse);

// The plain loop of one row (the reference the tests hold apply_rotary to).
void rotate_row_reference(float* row, int64_t position, const Rotary& r, bool inverse);

}  // namespace mha::nn
