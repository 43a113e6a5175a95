// mha/model.h: a small trainable model built on MultiHeadAttention.
//
//   X_0 = E[token] + P[position]                       E:[V,D], P:[max_len,D]
//   X_l+1 = A_l(X_l, X_l, X_l, valid_lens)              one layer
//   X_l+1 = X_l + A_l(X_l, X_l, X_l, valid_lens)        residual, when num_layers > 1
//   logits = X_L W_r^T + b_r                            W_r:[C,D]
//
// A_l are the seed's MultiHeadAttention (self-attention), P is learned or
// d2l's sinusoidal encoding. Each piece has its backward; gradients
// accumulate until zero_grad(), as in the modules.
//
// Parameter names: "embedding.weight", "positions.weight" (learned positions
// only), "layers.<l>.W_q.weight" ... (each layer's state-dict names),
// "readout.weight", "readout.bias".
//
//   mha::AttentionModel model({.vocab_size = 9, .num_classes = 64, .max_len = 32}, /*seed=*/0);
//   mha::Tensor logits = model.forward(batch.tokens, B, T, batch.valid_lens());  // [B,T,64]
//   mha::CrossEntropy ce = mha::cross_entropy(logits, batch.targets);
//   model.backward(ce.grad.reshape(logits.shape()));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mha/linear.h"
#include "mha/multihead.h"
#include "mha/parameter.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha {

enum class PositionKind {
  Learned,     // a [max_len, D] table trained with the rest, initialised N(0, 1)
  Sinusoidal,  // d2l's PositionalEncoding: sin / cos at geometric frequencies, fixed
};

struct ModelConfig {
  int64_t vocab_size = 0;   // input tokens, ids in [0, vocab_size)
  int64_t num_classes = 0;  // read-out width
  int64_t max_len = 0;      // longest sequence the positions cover
  int64_t num_hiddens = 64;
  int64_t num_heads = 4;
  int64_t num_layers = 1;
  float dropout = 0.0f;     // on the attention weights, in training mode
  bool bias = false;        // biases of the attention projections (the seed's default: none)
  PositionKind positions = PositionKind::Learned;
};

class AttentionModel {
 public:
  // Throws mha::Error on a non-positive size or an invalid attention setting.
  // `seed` draws every initial parameter and the layers' dropout streams.
  AttentionModel(const ModelConfig& config, uint64_t seed = 0);
  // The parameter pointers handed out by parameters() point into the model.
  AttentionModel(const AttentionModel&) = delete;
  AttentionModel& operator=(const AttentionModel&) = delete;

  // tokens:[B,T] row-major in [0, vocab_size), 1 <= T <= max_len;
  // valid_lens none, (B,) or (B,T) -> logits:[B,T,num_classes].
  Tensor forward(const std::vector<int32_t>& tokens, int64_t batch, int64_t length,
                 const ValidLens& valid_lens = {});
  // grad_logits:[B,T,C] of the last (training-mode) forward: accumulates
  // every parameter's gradient.
  void backward(const Tensor& grad_logits);

  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  void zero_grad();
  // Re-keys every layer's dropout stream (a training loop does it per step,
  // so that a resumed run draws the same masks).
  void reseed_dropout(uint64_t key);

  ParamList parameters();
  StateDict state_dict() const;
  StateDict grads();
  // Requires exactly the names state_dict() has, with the same shapes;
  // nothing changes if a check fails.
  void load_state_dict(const StateDict& state);

  const ModelConfig& config() const { return config_; }
  int64_t num_layers() const { return config_.num_layers; }
  MultiHeadAttention& layer(int64_t i) { return *layers_.at(static_cast<size_t>(i)); }
  const MultiHeadAttention& layer(int64_t i) const { return *layers_.at(static_cast<size_t>(i)); }
  const Tensor& embedding() const { return embedding_; }   // [V,D]
  const Tensor& positions() const { return positions_; }   // [max_len,D]

 private:
  ModelConfig config_;
  bool training_ = true;
  Tensor embedding_, positions_;
  Tensor grad_embedding_, grad_positions_;
  std::vector<std::unique_ptr<MultiHeadAttention>> layers_;
  LazyLinear readout_;
  Tensor grad_readout_w_, grad_readout_b_;

  // Kept by a training-mode forward for backward().
  struct Saved {
    bool valid = false;
    std::vector<int32_t> tokens;
    int64_t batch = 0, length = 0;
    Tensor last;  // X_L:[B,T,D], the read-out's input
  };
  Saved saved_;
};

// d2l's PositionalEncoding table: P[t, 2j] = sin(t / 10000^(2j/D)),
// P[t, 2j+1] = cos(t / 10000^(2j/D)) -> [max_len, D].
Tensor sinusoidal_positions(int64_t max_len, int64_t num_hiddens);

}  // namespace mha
