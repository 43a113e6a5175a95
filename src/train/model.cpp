#include "mha/model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/memory.h"
#include "mha/error.h"
#include "nn/linear_backward.h"

namespace mha {

namespace {

const char* const kOp = "AttentionModel";

std::string layer_prefix(int64_t l) { return "layers." + std::to_string(l) + "."; }

}  // namespace

Tensor sinusoidal_positions(int64_t max_len, int64_t D) {
  Tensor P({max_len, D});
  for (int64_t t = 0; t < max_len; ++t)
    for (int64_t c = 0; c < D; ++c) {
      // Columns 2j and 2j+1 share the frequency 1 / 10000^(2j/D), as in d2l.
      const int64_t even = c - c % 2;
      const float x = static_cast<float>(t) /
                      std::pow(10000.0f, static_cast<float>(even) / static_cast<float>(D));
      P.at({t, c}) = c % 2 == 0 ? std::sin(x) : std::cos(x);
    }
  return P;
}

size_t AttentionModel::checked_layer(int64_t i) const {
  if (i < 0 || i >= num_layers())
    fail("AttentionModel.layer", "index: ", i, "; wanted 0 <= index < num_layers ", num_layers());
  return static_cast<size_t>(i);
}

AttentionModel::AttentionModel(const ModelConfig& c, uint64_t seed)
    : config_(c), readout_(c.num_classes > 0 ? c.num_classes : 1, /*bias=*/true) {
  if (c.vocab_size <= 0) fail(kOp, "vocab_size: ", c.vocab_size, " is not positive");
  if (c.num_classes <= 0) fail(kOp, "num_classes: ", c.num_classes, " is not positive");
  if (c.max_len <= 0) fail(kOp, "max_len: ", c.max_len, " is not positive");
  if (c.num_layers <= 0) fail(kOp, "num_layers: ", c.num_layers, " is not positive");
  const int64_t D = c.num_hiddens;
  // MultiHeadAttention checks num_hiddens, num_heads and dropout itself; the
  // first layer is built before anything is drawn, so a bad setting fails first.
  Generator gen(seed);
  layers_.push_back(std::make_unique<MultiHeadAttention>(D, c.num_heads, c.dropout, c.bias, 0));
  // Every parameter and its gradient, planned before any is allocated, so
  // that a huge num_layers or num_hiddens (mha train --layers, --hiddens) is
  // refused with a message instead of an out-of-memory kill.
  core::MemoryPlan plan(kOp);
  plan.add("num_layers x (W_q, W_k, W_v, W_o) and their gradients", {c.num_layers, 8, D, D});
  if (c.bias) plan.add("num_layers x 4 biases and their gradients", {c.num_layers, 8, D});
  plan.add("num_layers x head gates", {c.num_layers, c.num_heads}, 16);
  plan.add("num_layers x the layers' own objects", {c.num_layers, static_cast<int64_t>(sizeof(MultiHeadAttention))}, 1);
  plan.add("embedding (vocab_size, num_hiddens) and its gradient", {2, c.vocab_size, D});
  plan.add("positions (max_len, num_hiddens) and their gradient", {2, c.max_len, D});
  plan.add("read-out (num_classes, num_hiddens) and its gradient", {2, c.num_classes, D + 1});
  plan.check();
  layers_.reserve(static_cast<size_t>(c.num_layers));
  for (int64_t l = 1; l < c.num_layers; ++l)
    layers_.push_back(std::make_unique<MultiHeadAttention>(D, c.num_heads, c.dropout, c.bias, 0));
  // nn.Embedding's initialisation: N(0, 1).
  embedding_ = Tensor({c.vocab_size, D});
  for (float& x : embedding_.values()) x = static_cast<float>(gen.normal());
  if (c.positions == PositionKind::Learned) {
    positions_ = Tensor({c.max_len, D});
    for (float& x : positions_.values()) x = static_cast<float>(gen.normal());
    grad_positions_ = Tensor({c.max_len, D});
  } else {
    positions_ = sinusoidal_positions(c.max_len, D);
  }
  for (auto& layer : layers_) {
    layer->seed(gen.next());
    layer->initialize(D, D, D);
  }
  readout_.initialize(D, gen, kOp);
  grad_embedding_ = Tensor(embedding_.shape());
  grad_readout_w_ = Tensor(readout_.weight().shape());
  grad_readout_b_ = Tensor(readout_.bias().shape());
}

Tensor AttentionModel::forward(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                               const ValidLens& valid_lens) {
  static const char* op = "AttentionModel.forward";
  const ModelConfig& c = config_;
  const int64_t D = c.num_hiddens;
  if (B <= 0 || T <= 0) fail(op, "tokens: shape ", shape_str({B, T}), " is empty");
  if (T > c.max_len) fail(op, "tokens: length ", T, " (shape ", shape_str({B, T}), ") exceeds max_len ", c.max_len);
  if (static_cast<int64_t>(tokens.size()) != B * T)
    fail(op, "tokens: ", tokens.size(), " ids given for shape ", shape_str({B, T}), " which holds ", B * T);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail(op, "tokens: entry ", i, " is ", tokens[i], ", not an id in [0, ", c.vocab_size, ")");
  valid_lens.check(op, B, T);

  // X_0 = E[token] + P[position].
  Tensor X({B, T, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* e = embedding_.data() + tokens[b * T + t] * D;
      const float* p = positions_.data() + t * D;
      float* x = X.data() + (b * T + t) * D;
      for (int64_t j = 0; j < D; ++j) x[j] = e[j] + p[j];
    }
  const bool residual = c.num_layers > 1;
  for (auto& layer : layers_) {
    Tensor Y = layer->forward(X, X, X, valid_lens);
    if (residual)
      for (int64_t i = 0; i < X.numel(); ++i) Y.data()[i] += X.data()[i];
    X = std::move(Y);
  }
  Generator unused;  // the read-out is initialised: forward draws nothing
  Tensor logits = readout_.forward(X, unused, op);
  if (training_) saved_ = {true, tokens, B, T, std::move(X)};
  else saved_ = {};
  return logits;
}

void AttentionModel::backward(const Tensor& grad_logits) {
  static const char* op = "AttentionModel.backward";
  if (!saved_.valid)
    fail(op, "no training-mode forward to differentiate: call forward() in training mode first");
  const int64_t B = saved_.batch, T = saved_.length, D = config_.num_hiddens, C = config_.num_classes;
  if (grad_logits.shape() != Shape{B, T, C})
    fail(op, "grad_logits: shape ", shape_str(grad_logits.shape()), " is not the logits' ", shape_str({B, T, C}));
  // logits = X_L W_r^T + b_r.
  Tensor dX({B, T, D});
  nn::linear_backward(&readout_, saved_.last.data(), grad_logits.data(), B * T, dX.data(),
                      grad_readout_w_, &grad_readout_b_);
  // Self-attention: X feeds queries, keys and values, so its gradient is the sum.
  const bool residual = config_.num_layers > 1;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    MultiHeadAttention::InputGrads g = (*it)->backward(dX);
    float* dx = dX.data();
    for (int64_t i = 0; i < dX.numel(); ++i) {
      const float through = g.queries.data()[i] + g.keys.data()[i] + g.values.data()[i];
      dx[i] = residual ? dx[i] + through : through;
    }
  }
  // X_0 = E[token] + P[position]: scatter-add into the rows used.
  const bool learned = config_.positions == PositionKind::Learned;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* dx = dX.data() + (b * T + t) * D;
      float* ge = grad_embedding_.data() + saved_.tokens[b * T + t] * D;
      for (int64_t j = 0; j < D; ++j) ge[j] += dx[j];
      if (learned) {
        float* gp = grad_positions_.data() + t * D;
        for (int64_t j = 0; j < D; ++j) gp[j] += dx[j];
      }
    }
}

void AttentionModel::train(bool on) {
  training_ = on;
  for (auto& layer : layers_) layer->train(on);
}

void AttentionModel::zero_grad() {
  for (ParamRef& p : parameters()) std::fill(p.grad->values().begin(), p.grad->values().end(), 0.0f);
}

void AttentionModel::reseed_dropout(uint64_t key) {
  // A distinct, well-mixed stream per layer (SplitMix64 of key + layer).
  for (size_t l = 0; l < layers_.size(); ++l) {
    uint64_t z = key + (l + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    layers_[l]->seed(z ^ (z >> 31));
  }
}

ParamList AttentionModel::parameters() {
  ParamList out;
  out.push_back({"embedding.weight", &embedding_, &grad_embedding_});
  if (config_.positions == PositionKind::Learned)
    out.push_back({"positions.weight", &positions_, &grad_positions_});
  for (size_t l = 0; l < layers_.size(); ++l)
    for (ParamRef p : layers_[l]->parameters()) {
      p.name = layer_prefix(static_cast<int64_t>(l)) + p.name;
      out.push_back(p);
    }
  out.push_back({"readout.weight", &readout_.weight(), &grad_readout_w_, &readout_.version()});
  out.push_back({"readout.bias", &readout_.bias(), &grad_readout_b_, &readout_.version()});
  return out;
}

StateDict AttentionModel::state_dict() const {
  StateDict s;
  s["embedding.weight"] = embedding_;
  if (config_.positions == PositionKind::Learned) s["positions.weight"] = positions_;
  for (size_t l = 0; l < layers_.size(); ++l)
    for (const auto& [name, t] : layers_[l]->state_dict()) s[layer_prefix(static_cast<int64_t>(l)) + name] = t;
  s["readout.weight"] = readout_.weight();
  s["readout.bias"] = readout_.bias();
  return s;
}

StateDict AttentionModel::grads() {
  StateDict s;
  for (const ParamRef& p : parameters()) s[p.name] = *p.grad;
  return s;
}

void AttentionModel::load_state_dict(const StateDict& state) {
  static const char* op = "AttentionModel.load_state_dict";
  const StateDict mine = state_dict();
  for (const auto& [name, t] : state) {
    auto it = mine.find(name);
    if (it == mine.end())
      fail(op, "unexpected parameter '", name, "'",
           name == "positions.weight" ? " (this model's positions are sinusoidal)" : "");
    if (t.shape() != it->second.shape())
      fail(op, name, ": shape ", shape_str(t.shape()), " is not ", shape_str(it->second.shape()));
  }
  for (const auto& [name, t] : mine)
    if (!state.count(name)) fail(op, "missing parameter '", name, "'");
  for (ParamRef& p : parameters()) *p.value = state.at(p.name);
}

}  // namespace mha
