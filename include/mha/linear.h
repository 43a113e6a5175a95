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
#include <memory>

#include "mha/detail/published.h"
#include "mha/parameter.h"
#include "mha/random.h"
#include "mha/precision.h"
#include "mha/tensor.h"

namespace mha {

namespace cpu {
struct PackedWeight;  // src/cpu/gemm/packed_weight.h
}

// PyTorch's nn.LazyLinear (see the file comment). Not thread-safe by itself:
// MultiHeadAttention serialises its layers' initialisation.
class LazyLinear {
 public:
  // A lazy layer with `out_features` outputs (> 0, else mha::Error) and a
  // bias iff `bias`.
  LazyLinear(int64_t out_features, bool bias);

  // Output width, fixed at construction.
  int64_t out_features() const { return out_features_; }
  // Input width; -1 until initialised.
  int64_t in_features() const { return in_features_; }
  // True once the input width is fixed and the parameters exist.
  bool initialized() const { return in_features_ >= 0; }
  // True when the layer adds a bias.
  bool has_bias() const { return has_bias_; }

  // Fixes the input width and draws the parameters from `gen`. Throws
  // mha::Error (naming `op`) if already initialised with another width.
  void initialize(int64_t in_features, Generator& gen, const char* op = "LazyLinear");

  // x:[..., in] -> y:[..., out]; initialises on the first call.
  Tensor forward(const Tensor& x, Generator& gen, const char* op = "LazyLinear");
  // x:[rows, in] (row stride in) -> y:[rows, out] (row stride ldy >= out),
  // the product in `precision` (mha/precision.h), against the weight packed
  // once per version (packed_weight()). The layer must be initialised.
  void forward_rows(const float* x, int64_t rows, float* y, int64_t ldy,
                    Precision precision = Precision::Float32) const;

  const Tensor& weight() const { return weight_; }  // [out, in]
  const Tensor& bias() const { return bias_; }      // [out] (empty without bias)
  // [out, in], writable (e.g. by an optimiser); keep the shape. Marks the
  // parameters written (a new version()): write through the reference before
  // the next call, or call version().bump() after writing through a pointer
  // kept from earlier.
  Tensor& weight() {
    version_.bump();
    return weight_;
  }
  // [out], writable; keep the shape. Marks the parameters written, as weight().
  Tensor& bias() {
    version_.bump();
    return bias_;
  }
  // The parameters' version: changed by initialize(), set_weight(),
  // set_bias(), the non-const weight() and bias(), and ParamRef::written()
  // (optimisers). What is derived from the weight is remade when it changes.
  const ParamVersion& version() const { return version_; }
  // Writable, for ParamRef (mha/parameter.h).
  ParamVersion& version() { return version_; }

  // The weight as forward_rows multiplies it in `precision`: packed on the
  // first call after each change of version() and shared by the calls after
  // it (src/cpu/gemm/packed_weight.h), so no call copies the weight. Calls may
  // ask from many threads at once. The layer must be initialised.
  std::shared_ptr<const cpu::PackedWeight> packed_weight(Precision precision) const;

  // Replace the parameters; shapes must be (out, in) and (out,). Fixes the
  // input width if the layer is still lazy.
  // Throws mha::Error naming `op` for a weight that is not (out, in>0), or
  // whose in differs from an initialised layer's.
  void set_weight(const Tensor& w, const char* op = "LazyLinear.set_weight");
  // Throws mha::Error naming `op` for a layer without bias or a bias that
  // is not (out,).
  void set_bias(const Tensor& b, const char* op = "LazyLinear.set_bias");

 private:
  int64_t out_features_;
  int64_t in_features_ = -1;
  bool has_bias_;
  Tensor weight_;
  Tensor bias_;
  ParamVersion version_;
  // The last packing of the weight for each precision (Float32, BFloat16);
  // valid while its version is version_'s. A copied layer shares it.
  mutable detail::Latest<const cpu::PackedWeight> packed_[2];
};

}  // namespace mha
