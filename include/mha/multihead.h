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
//
// Training: a training-mode forward keeps what the backward pass needs (the
// inputs, their projections, the heads' outputs, the weights and the dropout
// key); backward() then returns the inputs' gradients and adds the
// parameters' gradients into grads(), which accumulate until zero_grad():
//
//   Tensor out = attention(X, Y, Y, lens);            // training mode
//   auto g = attention.backward(grad_out);            // g.queries:[B,Q,Dq] ...
//   attention.grads().at("W_q.weight");               // (num_hiddens, Dq)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mha/attention.h"
#include "mha/linear.h"
#include "mha/parameter.h"
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

  // Fixes the lazy input widths as a first call with queries (., ., dq),
  // keys (., ., dk) and values (., ., dv) would, drawing the same numbers.
  void initialize(int64_t dq, int64_t dk, int64_t dv);

  // --- Training (src/nn/multihead_backward.cpp) ---
  struct InputGrads {
    Tensor queries, keys, values;  // [B,Q,Dq], [B,K,Dk], [B,K,Dv]
  };
  // grad_output:[B,Q,num_hiddens], the gradient of the last forward's output
  // -> the gradients of its queries, keys and values. Adds the parameters'
  // gradients into grads(). The last forward must have run in training mode.
  InputGrads backward(const Tensor& grad_output);
  // Sets every accumulated gradient to zero (PyTorch's zero_grad(set_to_none=False)).
  void zero_grad();
  // Accumulated gradients by state-dict name, shaped like the parameters
  // (zeros before any backward); only initialised layers appear.
  const StateDict& grads();
  // Replaces gradients by name (names and shapes as grads()).
  void set_grads(const StateDict& grads);
  // (name, value, gradient) of every initialised parameter, in the seed's
  // parameters() order: W_q, W_k, W_v, W_o, each weight before its bias.
  ParamList parameters();
  // [B,h,Q,K]: the dropout multipliers of the last forward, 0 or 1/(1-p);
  // all ones when that call had no dropout (evaluation mode or p = 0).
  Tensor last_dropout_mask() const;

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

  // What a training-mode forward keeps for backward() beside state_ (the
  // projections, heads' outputs and lengths); cleared in eval mode.
  struct Saved {
    bool valid = false;
    Tensor queries, keys, values;  // the inputs
  };
  Saved saved_;
  float last_dropout_p_ = 0.0f;  // dropout of the last forward (0 when off)
  uint64_t last_dropout_key_ = 0;
  StateDict grads_;
  void ensure_grads();
};

}  // namespace mha
