// mha/linear.h: PyTorch's nn.LazyLinear, y = x W^T + b.
//
// The output width is fixed at construction, the input width by the first
// call (or by loading a weight). A later call with another input width is an
// error, never a silent re-initialisation. Weights are stored as PyTorch
// stores them, (out_features, in_features), and initialised as PyTorch does:
// weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn weight first.
//
//   mha::Generator gen(0);
//   mha::LazyLinear proj(100, /*bias=*/false);
//   mha::Tensor y = proj.forward(x, gen);   // x:[..., in] -> y:[..., 100]
#pragma once

#include <cstdint>

#include "mha/random.h"
#include "mha/tensor.h"

namespace mha {

class LazyLinear {
 public:
  LazyLinear(int64_t out_features, bool bias);

  int64_t out_features() const { return out_features_; }
  int64_t in_features() const { return in_features_; }  // -1 until initialised
  bool initialized() const { return in_features_ >= 0; }
  bool has_bias() const { return has_bias_; }

  // Fixes the input width and draws the parameters from `gen`. Throws
  // mha::Error (naming `op`) if already initialised with another width.
  void initialize(int64_t in_features, Generator& gen, const char* op = "LazyLinear");

  // x:[..., in] -> y:[..., out]; initialises on the first call.
  Tensor forward(const Tensor& x, Generator& gen, const char* op = "LazyLinear");
  // x:[rows, in] (row stride in) -> y:[rows, out] (row stride ldy >= out).
  // The layer must be initialised.
  void forward_rows(const float* x, int64_t rows, float* y, int64_t ldy) const;

  const Tensor& weight() const { return weight_; }  // [out, in]
  const Tensor& bias() const { return bias_; }      // [out] (empty without bias)
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

  // Replace the parameters; shapes must be (out, in) and (out,). Fixes the
  // input width if the layer is still lazy.
  void set_weight(const Tensor& w, const char* op = "LazyLinear.set_weight");
  void set_bias(const Tensor& b, const char* op = "LazyLinear.set_bias");

 private:
  int64_t out_features_;
  int64_t in_features_ = -1;
  bool has_bias_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace mha
