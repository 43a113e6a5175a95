// mha/multihead.h: the seed's MultiHeadAttention.
//
//   mha::MultiHeadAttention attention(/*num_hiddens=*/100, /*num_heads=*/5,
//                                     /*dropout=*/0.5f);
//   mha::Tensor X({2, 4, 100}, 1.0f), Y({2, 6, 100}, 1.0f);
//   mha::Tensor out = attention.forward(X, Y, Y, mha::ValidLens::per_batch({3, 2}));
//   // out:[2, 4, 100]; attention.attention_weights():[2, 5, 4, 6]
//
// queries, keys and values go through lazy projections W_q, W_k, W_v
// (num_hiddens outputs each; input widths fixed by the first call), are split
// into num_heads heads of width d = num_hiddens / num_heads (head i owns
// features [i*d, (i+1)*d)), attend with scaled dot products and the seed's
// masked softmax, are concatenated in head order and projected by W_o.
//
// Like a torch.nn.Module, a new module is in training mode: dropout acts on
// the attention weights until eval() is called.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mha/attention.h"
#include "mha/linear.h"
#include "mha/random.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha {

namespace nn {
struct AttentionState;  // what a call keeps for attention_weights()
}

// Parameters by the seed's state-dict names: "W_q.weight", ..., "W_o.bias".
using StateDict = std::map<std::string, Tensor>;

class MultiHeadAttention {
 public:
  // num_hiddens must be a positive multiple of num_heads; 0 <= dropout <= 1.
  // `seed` drives the lazy initialisation and the dropout masks.
  MultiHeadAttention(int64_t num_hiddens, int64_t num_heads, float dropout = 0.0f,
                     bool bias = false, uint64_t seed = 0);

  // queries:[B,Q,Dq] keys:[B,K,Dk] values:[B,K,Dv]; valid_lens none, (B,) or
  // (B,Q) -> [B,Q,num_hiddens]. Throws mha::Error on mismatched shapes, bad
  // lengths, or input widths that differ from the first call's.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                 const ValidLens& valid_lens = {});
  Tensor operator()(const Tensor& queries, const Tensor& keys, const Tensor& values,
                    const ValidLens& valid_lens = {}) {
    return forward(queries, keys, values, valid_lens);
  }

  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }

  // [B,h,Q,K]: the softmax weights (before dropout) of the last call; empty
  // before the first call. With the fused kernel (the default) they are
  // computed on first access, not by forward(): forward() keeps the projected
  // q and k and two floats per (b, head, query) instead, and the first access
  // costs about half of the call's attention work plus the B*h*Q*K floats of
  // the result. Other kernels form them during forward(). The reference is
  // valid until the next forward() call.
  const Tensor& attention_weights() const;
  // [rows, heads, Q, K]: the weights of some batch rows and heads only, in the
  // order given, without forming the others.
  Tensor attention_weights(const std::vector<int64_t>& batch_rows,
                           const std::vector<int64_t>& heads) const;
  // B of the last call (0 before the first).
  int64_t last_batch_size() const;

  // The parameters by the seed's names; weights are (out, in) as in PyTorch.
  // Only initialised layers appear (a lazy layer has no weight yet).
  StateDict state_dict() const;
  // Requires exactly the names this module has (biases iff bias=true), with
  // W_q/W_k/W_v weights (num_hiddens, in) and W_o (num_hiddens, num_hiddens);
  // fixes the lazy input widths. Nothing changes if any check fails.
  void load_state_dict(const StateDict& state);

  void set_kernel(AttentionKernel k) { kernel_ = k; }
  AttentionKernel kernel() const { return kernel_; }
  void seed(uint64_t s) { gen_.seed(s); }

  int64_t num_hiddens() const { return num_hiddens_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t head_dim() const { return num_hiddens_ / num_heads_; }
  float dropout() const { return dropout_; }
  bool has_bias() const { return bias_; }

  LazyLinear& W_q() { return W_q_; }
  LazyLinear& W_k() { return W_k_; }
  LazyLinear& W_v() { return W_v_; }
  LazyLinear& W_o() { return W_o_; }
  const LazyLinear& W_q() const { return W_q_; }
  const LazyLinear& W_k() const { return W_k_; }
  const LazyLinear& W_v() const { return W_v_; }
  const LazyLinear& W_o() const { return W_o_; }

 private:
  int64_t num_hiddens_;
  int64_t num_heads_;
  float dropout_;
  bool bias_;
  bool training_ = true;
  AttentionKernel kernel_ = AttentionKernel::Fused;
  Generator gen_;
  LazyLinear W_q_, W_k_, W_v_, W_o_;
  std::shared_ptr<nn::AttentionState> state_;  // of the last call
};

}  // namespace mha
