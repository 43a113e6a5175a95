#include "nn/linear_backward.h"

#include <vector>

#include "cpu/blas/blas.h"

namespace mha::nn {

void linear_backward(const LayerRef& layer, const float* x, const float* dy, int64_t rows,
                     float* dx, Tensor& dW, Tensor* db, Precision precision) {
  const int64_t in = layer.in_features(), out = layer.out_features();
  // dW:[out,in] += dy^T:[out,rows] @ x:[rows,in]
  cpu::sgemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dW.data(), in, precision);
  if (db) {
    // Column sums in double, in row order: deterministic and accurate.
    std::vector<double> sum(static_cast<size_t>(out), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j) sum[j] += dy[r * out + j];
    float* b = db->data();
    for (int64_t j = 0; j < out; ++j) b[j] += static_cast<float>(sum[j]);
  }
  // dx:[rows,in] = dy:[rows,out] @ W:[out,in]
  if (dx) cpu::sgemm(false, false, rows, in, out, 1.0f, dy, out, layer.weight(), in, 0.0f, dx, in, precision);
}

}  // namespace mha::nn
