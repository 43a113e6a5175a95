// src/dist/ring_projections.h: the sequence-parallel modules' projections
// of their own rows (dist/ring_attention.cpp): y = x W^T + b on a weight
// packed once, and its backward, in the module's number format.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/precision.h"
#include "mha/tensor.h"
#include "nn/layer_ref.h"
#include "nn/linear_backward.h"

namespace mha::dist {

// y:[rows, out] = x:[rows, in] W^T + b, W packed once (cpu/gemm/packed_weight.h),
// the bias added in the product's epilogue.
// In bfloat16 (mha/precision.h) the product rounds x and W to bfloat16 and
// sums in float32, and `round_output` rounds y too (the projected q, k, v).
inline void project(const float* x, int64_t rows, const cpu::PackedWeight& W, const Tensor& b, float* y,
             bool round_output = true) {
  if (rows == 0) return;
  cpu::GemmBatch batch(W.precision);
  batch.add_packed(rows, x, W.K, W, b.empty() ? nullptr : b.data(), y, W.N);
  batch.run();
  if (W.precision == Precision::BFloat16 && round_output)
    for (int64_t e = 0; e < rows * W.N; ++e) y[e] = core::round_to_bf16(y[e]);
}

// The gradients of y = x W^T + b from dy:[rows, out] (nn/linear_backward.h):
// dW += dy^T x, db += column sums of dy, dx = dy W (dx null: not wanted).
inline void project_backward(const float* dy, const float* x, int64_t rows, const Tensor& W, Tensor& dW, Tensor* db,
                      float* dx, Precision precision) {
  if (rows == 0) return;
  const nn::LayerRef layer(W.data(), nullptr, W.size(0), W.size(1));
  nn::linear_backward(layer, x, dy, rows, dx, dW, db, precision);
}

}  // namespace mha::dist
