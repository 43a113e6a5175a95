// src/nn/linear_backward.h: the backward pass of y = x W^T + b (LazyLinear).
#pragma once

#include <cstdint>

#include "nn/layer_ref.h"
#include "mha/precision.h"
#include "mha/tensor.h"

namespace mha::nn {

// x:[rows,in] dy:[rows,out] (both contiguous) -> dx:[rows,in] = dy W.
// Adds dW:[out,in] += dy^T x and, when db is not null, db:[out] += sum_rows dy.
// dx may be null when the input's gradient is not wanted.
// `precision`: of the two products (mha/precision.h).
void linear_backward(const LayerRef& layer, const float* x, const float* dy, int64_t rows,
                     float* dx, Tensor& dW, Tensor* db, Precision precision = Precision::Float32);

}  // namespace mha::nn
