// mha/attention.h: the seed's two helpers, masked_softmax and DotProductAttention.
//
// Both follow d2l's PyTorch code exactly: masked scores are replaced by -1e6
// (not -inf) before an ordinary softmax, so a row whose every key is masked
// (valid length 0) gets uniform weights 1/K.
#pragma once

#include <cstdint>

#include "mha/random.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha {

// Which implementation computes attention. All take the same parameters and
// give the same results within float32 rounding; tests hold them together.
enum class AttentionKernel {
  Reference,  // plain loops, double accumulation: the yardstick
  Blas,       // per-head BLAS products through a (Q, K) score matrix
  Fused,      // online softmax over key tiles: linear memory, padding skipped (default)
};

// X:[N,Q,K], valid_lens none, (N,) or (N,Q) -> softmax over the last axis,
// keys k with float(k) >= length replaced by -1e6 first.
Tensor masked_softmax(const Tensor& X, const ValidLens& valid_lens = {});

// The seed's DotProductAttention: scores = q k^T / sqrt(d), masked softmax,
// dropout on the weights (training mode only), weighted sum of values.
class DotProductAttention {
 public:
  explicit DotProductAttention(float dropout = 0.0f, uint64_t seed = 0);

  // queries:[N,Q,d] keys:[N,K,d] values:[N,K,dv], valid_lens none/(N,)/(N,Q)
  //   -> [N,Q,dv]
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                 const ValidLens& valid_lens = {});

  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  void set_kernel(AttentionKernel k) { kernel_ = k; }
  // [N,Q,K], before dropout, from the last call.
  const Tensor& attention_weights() const { return weights_; }

 private:
  float dropout_;
  bool training_ = true;
  AttentionKernel kernel_ = AttentionKernel::Fused;
  Generator gen_;
  Tensor weights_;
};

}  // namespace mha
