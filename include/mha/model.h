// mha/model.h: a small trainable model built on MultiHeadAttention.
//
//   X_0 = E[token] + P[position]                       E:[V,D], P:[max_len,D]
//   X_l+1 = A_l(X_l, X_l, X_l, valid_lens)              one layer
//   X_l+1 = X_l + A_l(X_l, X_l, X_l, valid_lens)        residual, when num_layers > 1
//   logits = X_L W_r^T + b_r                            W_r:[C,D]
//
// A_l are the d2l chapter's MultiHeadAttention (self-attention), P is learned or
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

// How AttentionModel encodes a token's position.
enum class PositionKind {
  Learned,     // a [max_len, D] table trained with the rest, initialised N(0, 1)
  Sinusoidal,  // d2l's PositionalEncoding: sin / cos at geometric frequencies, fixed
};

// AttentionModel's sizes and settings. The defaults of the sizes that have
// them are the offset-pair task's standard model (mha/trainer.h).
struct ModelConfig {
  int64_t vocab_size = 0;   // input tokens, ids in [0, vocab_size)
  int64_t num_classes = 0;  // read-out width
  int64_t max_len = 0;      // longest sequence the positions cover
  // D: the width of the embeddings, positions and attention layers.
  int64_t num_hiddens = 64;
  // Heads of each attention layer; must divide num_hiddens.
  int64_t num_heads = 4;
  // Attention layers, residual when more than one.
  int64_t num_layers = 1;
  float dropout = 0.0f;     // on the attention weights, in training mode
  bool bias = false;        // biases of the attention projections (the d2l chapter's default: none)
  // Learned positions (a trained table) or d2l's fixed sinusoids.
  PositionKind positions = PositionKind::Learned;
};

// Embedding + positions + num_layers self-attention layers + a linear
// read-out (the formulas at the top of this file), with its backward.
class AttentionModel {
 public:
  // Throws mha::Error on a non-positive size or an invalid attention setting.
  // `seed` draws every initial parameter and the layers' dropout streams.
  AttentionModel(const ModelConfig& config, uint64_t seed = 0);
  // The parameter pointers handed out by parameters() point into the model.
  AttentionModel(const AttentionModel&) = delete;
  AttentionModel& operator=(const AttentionModel&) = delete;

  // tokens:[B,T] row-major in [0, vocab_size), 1 <= T <= max_len;
  // valid_lens none, (B,) or (B,T) -> logits:[B,T,num_classes]. Throws
  // mha::Error for an empty batch, T > max_len, tokens.size() != B*T, an id
  // outside [0, vocab_size) or valid_lens that do not fit (B, T). In
  // training mode, keeps what backward() needs.
  Tensor forward(const std::vector<int32_t>& tokens, int64_t batch, int64_t length,
                 const ValidLens& valid_lens = {});
  // grad_logits:[B,T,C] of the last (training-mode) forward: accumulates
  // every parameter's gradient. Throws mha::Error without a training-mode
  // forward, or when grad_logits is not [B,T,C] of that forward.
  void backward(const Tensor& grad_logits);

  // Training mode (dropout on, forward() keeps what backward() needs) or,
  // with on = false, evaluation mode; every layer follows.
  void train(bool on = true);
  // Evaluation mode: train(false).
  void eval() { train(false); }
  // True in training mode (the mode of a new model).
  bool training() const { return training_; }
  // Sets every accumulated gradient to zero.
  void zero_grad();
  // Re-keys every layer's dropout stream (a training loop does it per step,
  // so that a resumed run draws the same masks).
  void reseed_dropout(uint64_t key);

  // (name, value, gradient) of every parameter, for the optimisers: the
  // embedding, the learned positions, each layer's (as
  // "layers.<l>.W_q.weight", ...) and the read-out's.
  ParamList parameters();
  // Copies of the parameters by name (the names of parameters()).
  StateDict state_dict() const;
  // Copies of the accumulated gradients by parameter name.
  StateDict grads();
  // Requires exactly the names state_dict() has, with the same shapes;
  // nothing changes if a check fails (mha::Error naming the parameter).
  void load_state_dict(const StateDict& state);

  // The config the model was built with.
  const ModelConfig& config() const { return config_; }
  // The number of attention layers, config().num_layers.
  int64_t num_layers() const { return config_.num_layers; }
  // Attention layer i, 0 <= i < num_layers() (mha::Error otherwise); its
  // attention_weights() are those of the last forward.
  MultiHeadAttention& layer(int64_t i) { return *layers_[checked_layer(i)]; }
  // Attention layer i, read-only.
  const MultiHeadAttention& layer(int64_t i) const { return *layers_[checked_layer(i)]; }
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
  size_t checked_layer(int64_t i) const;
};

// d2l's PositionalEncoding table: P[t, 2j] = sin(t / 10000^(2j/D)),
// P[t, 2j+1] = cos(t / 10000^(2j/D)) -> [max_len, D] (empty for a size of
// 0; a negative size throws Tensor's mha::Error).
Tensor sinusoidal_positions(int64_t max_len, int64_t num_hiddens);

}  // namespace mha
