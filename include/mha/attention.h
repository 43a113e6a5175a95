// mha/attention.h: the d2l chapter's two helpers, masked_softmax and DotProductAttention.
//
// Both follow d2l's PyTorch code exactly: masked scores are replaced by -1e6
// (not -inf) before an ordinary softmax, so a row whose every key is masked
// (valid length 0) gets uniform weights 1/K.
#pragma once

#include <cstdint>
#include <memory>

#include "mha/detail/published.h"
#include "mha/kernel.h"
#include "mha/random.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha {

// X:[N,Q,K], valid_lens none, (N,) or (N,Q) -> softmax over the last axis,
// keys k with float(k) >= length replaced by -1e6 first. Throws mha::Error
// when X is not rank 3 or the lengths do not fit.
Tensor masked_softmax(const Tensor& X, const ValidLens& valid_lens = {});

// The d2l chapter's DotProductAttention: scores = q k^T / sqrt(d), masked softmax,
// dropout on the weights (training mode only), weighted sum of values.
// forward() may run on many threads at once, without locks: each call reads
// the mode and kernel once, draws its dropout key from an atomic stream and
// publishes its weights whole (mha/detail/published.h).
class DotProductAttention {
 public:
  // 0 <= dropout <= 1 (else mha::Error); `seed` drives the dropout masks.
  // Like a torch.nn.Module, a new one is in training mode.
  explicit DotProductAttention(float dropout = 0.0f, uint64_t seed = 0);

  // queries:[N,Q,d] keys:[N,K,d] values:[N,K,dv], valid_lens none/(N,)/(N,Q)
  //   -> [N,Q,dv]
  // Throws mha::Error on a rank other than 3, mismatched N, K or d, K = 0,
  // or bad lengths.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                 const ValidLens& valid_lens = {});

  // Training mode (dropout on) when `on`, else evaluation mode.
  void train(bool on = true) { training_.set(on); }
  // Evaluation mode: dropout off.
  void eval() { train(false); }
  // True in training mode.
  bool training() const { return training_.get(); }
  // The implementation that computes attention (default: Fused, as
  // kernel_ below; Reference and Blas form the (Q, K) weights per head).
  void set_kernel(AttentionKernel k) { kernel_.set(k); }
  // [N,Q,K], before dropout, from the last call to finish, as a copy.
  Tensor attention_weights() const {
    const std::shared_ptr<Tensor> w = weights_.load();
    return w ? *w : Tensor();
  }

 private:
  float dropout_;
  detail::Relaxed<bool> training_{true};
  detail::Relaxed<AttentionKernel> kernel_{AttentionKernel::Fused};
  detail::KeyStream dropout_keys_;  // one key per training-mode call
  detail::Latest<Tensor> weights_;  // the last call's
};

}  // namespace mha
