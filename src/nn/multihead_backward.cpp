// MultiHeadAttention's training half: backward(), gradients, parameters.
//
// The forward (multihead.cpp) is, per row of the batch,
//   q = X_q W_q^T + b_q,  k = X_k W_k^T + b_k,  v = X_v W_v^T + b_v   [L, D]
//   concat = heads(attention(q, k, v)) * head gates                  [Q, D]
//   out = concat W_o^T + b_o                                         [Q, num_hiddens]
// (D = inner_dim(): num_hiddens unless heads were pruned)
// and backward() runs it in reverse: W_o's linear backward, the attention
// kernel's backward on the saved projections (kernels/attention_backward.h),
// then the three projections' linear backwards.
#include <algorithm>
#include <cmath>

#include "kernels/dispatch.h"
#include "mha/error.h"
#include "mha/multihead.h"
#include "nn/attention_state.h"
#include "nn/linear_backward.h"

namespace mha {

namespace {

const char* const kNames[] = {"W_q", "W_k", "W_v", "W_o"};

}  // namespace

void MultiHeadAttention::initialize(int64_t dq, int64_t dk, int64_t dv) {
  static const char* op = "MultiHeadAttention.initialize";
  // Check every width before drawing anything, so a failure changes nothing.
  const std::pair<const LazyLinear*, int64_t> widths[] = {{&W_q_, dq}, {&W_k_, dk}, {&W_v_, dv}};
  const char* what[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    const auto [layer, w] = widths[i];
    if (w <= 0) fail(op, what[i], ": ", w, " is not a positive input width");
    if (layer->initialized() && layer->in_features() != w)
      fail(op, what[i], ": ", w, " differs from the width ", layer->in_features(),
           " this layer was initialised with");
  }
  // The order of a first forward call: W_q, W_k, W_v, then W_o. Locked as
  // the lazy initialisation of forward() is (see multihead.h).
  std::unique_lock params(params_mutex_);
  std::lock_guard state(state_mutex_);
  W_q_.initialize(dq, gen_, op);
  W_k_.initialize(dk, gen_, op);
  W_v_.initialize(dv, gen_, op);
  if (!W_o_.initialized()) W_o_.initialize(inner_dim(), gen_, op);
}

void MultiHeadAttention::ensure_grads() {
  const LazyLinear* layers[] = {&W_q_, &W_k_, &W_v_, &W_o_};
  for (int i = 0; i < 4; ++i) {
    if (!layers[i]->initialized()) continue;
    const std::string n = kNames[i];
    Tensor& gw = grads_[n + ".weight"];
    if (gw.shape() != layers[i]->weight().shape()) gw = Tensor(layers[i]->weight().shape());
    if (bias_) {
      Tensor& gb = grads_[n + ".bias"];
      if (gb.shape() != layers[i]->bias().shape()) gb = Tensor(layers[i]->bias().shape());
    }
  }
}

const StateDict& MultiHeadAttention::grads() {
  ensure_grads();
  return grads_;
}

void MultiHeadAttention::zero_grad() {
  ensure_grads();
  for (auto& [name, g] : grads_) std::fill(g.values().begin(), g.values().end(), 0.0f);
  std::fill(head_gate_grad_.values().begin(), head_gate_grad_.values().end(), 0.0f);
}

void MultiHeadAttention::set_grads(const StateDict& grads) {
  static const char* op = "MultiHeadAttention.set_grads";
  ensure_grads();
  for (const auto& [name, g] : grads) {
    auto it = grads_.find(name);
    if (it == grads_.end()) {
      std::string names;
      for (const auto& [n, t] : grads_) names += (names.empty() ? "" : ", ") + n;
      fail(op, "grads: '", name, "' is not a parameter of this module (its parameters: ",
           names.empty() ? "none before the first call" : names, ")");
    }
    if (g.shape() != it->second.shape())
      fail(op, name, ": shape ", shape_str(g.shape()), " is not the parameter's ",
           shape_str(it->second.shape()));
  }
  for (const auto& [name, g] : grads) grads_[name] = g;
}

ParamList MultiHeadAttention::parameters() {
  ensure_grads();
  ParamList out;
  LazyLinear* layers[] = {&W_q_, &W_k_, &W_v_, &W_o_};
  // The order of the seed module's parameters(): W_q, W_k, W_v, W_o, weight
  // before bias.
  for (int i = 0; i < 4; ++i) {
    if (!layers[i]->initialized()) continue;
    const std::string n = kNames[i];
    out.push_back({n + ".weight", &layers[i]->weight(), &grads_.at(n + ".weight")});
    if (bias_) out.push_back({n + ".bias", &layers[i]->bias(), &grads_.at(n + ".bias")});
  }
  return out;
}

Tensor MultiHeadAttention::last_dropout_mask() const {
  std::lock_guard state(state_mutex_);
  if (!state_)
    fail("MultiHeadAttention.last_dropout_mask", "no forward call yet: there is no mask to show");
  Tensor mask({state_->B, state_->H, state_->Q, state_->K});
  const kernels::Dropout dropout{last_dropout_p_, last_dropout_key_};
  float* m = mask.data();
  for (int64_t i = 0; i < mask.numel(); ++i) m[i] = dropout.multiplier(static_cast<uint64_t>(i));
  return mask;
}

MultiHeadAttention::InputGrads MultiHeadAttention::backward(const Tensor& grad_output) {
  static const char* op = "MultiHeadAttention.backward";
  // Training is one thread's business, but a backward() must not see a
  // forward() of another thread half-stored: hold both locks throughout.
  std::shared_lock params(params_mutex_);
  std::lock_guard state(state_mutex_);
  if (!saved_.valid)
    fail(op, "no training-mode forward to differentiate: call the module in training mode "
             "(train()) before backward()");
  const Tensor& X_q = saved_.queries;
  const Tensor& X_k = saved_.keys;
  const Tensor& X_v = saved_.values;
  const int64_t B = X_q.size(0), Q = X_q.size(1), K = X_k.size(1);
  // D: the inner width (q, k, v, concat); the output is num_hiddens wide.
  const int64_t D = inner_dim(), H = num_heads_;
  if (grad_output.shape() != Shape{B, Q, num_hiddens_})
    fail(op, "grad_output: shape ", shape_str(grad_output.shape()), " is not the output's ",
         shape_str({B, Q, num_hiddens_}));
  ensure_grads();
  auto grad_w = [&](int i) -> Tensor& { return grads_.at(std::string(kNames[i]) + ".weight"); };
  auto grad_b = [&](int i) -> Tensor* {
    return bias_ ? &grads_.at(std::string(kNames[i]) + ".bias") : nullptr;
  };

  // out = concat W_o^T + b_o.
  Tensor d_concat({B, Q, D});
  const nn::AttentionState& st = *state_;  // projections and heads' outputs of that forward
  nn::linear_backward(W_o_, st.concat.data(), grad_output.data(), B * Q, d_concat.data(),
                      grad_w(3), grad_b(3));
  // concat = heads' outputs scaled by the head gates (src/nn/prune.cpp).
  const Tensor& heads_out = saved_.ungated.empty() ? st.concat : saved_.ungated;
  head_gates_backward(heads_out, d_concat);

  // concat = heads(attention(q, k, v)): the kernel sees (B, h, L, d) views.
  Tensor dq({B, Q, D}), dk({B, K, D}), dv({B, K, D});
  kernels::AttentionBackward p;
  p.fwd.q = st.proj.q.split_heads(H);
  p.fwd.k = st.proj.k.split_heads(H);
  p.fwd.v = st.proj.v.split_heads(H);
  p.grad_out = d_concat.view().split_heads(H);
  p.fwd.out = heads_out.view().split_heads(H);
  kernels::set_lengths(p.fwd, st.lens);
  p.fwd.scale_divisor = std::sqrt(static_cast<float>(head_dim()));
  p.fwd.dropout = {last_dropout_p_, last_dropout_key_};
  p.grad_q = dq.view().split_heads(H);
  p.grad_k = dk.view().split_heads(H);
  p.grad_v = dv.view().split_heads(H);
  if (!st.stats.empty()) {
    // The forward saved statistics: the fused backward recomputes the
    // weights tile by tile from them (linear memory), and reads only the key
    // rows that forward projected. The kernels only read them.
    float* stats = const_cast<float*>(st.stats.data());
    p.fwd.stats = {stats, stats + B * H * Q};
    kernels::attention_backward(kernel_, p);
  } else {
    std::lock_guard weights_lock(st.weights_mutex);
    p.fwd.weights = st.have_all ? st.weights.data() : nullptr;  // else recomputed from q and k
    kernels::attention_backward(kernel_, p);
  }

  // q = X_q W_q^T + b_q, and likewise for k and v.
  InputGrads g{Tensor(X_q.shape()), Tensor(X_k.shape()), Tensor(X_v.shape())};
  nn::linear_backward(W_q_, X_q.data(), dq.data(), B * Q, g.queries.data(), grad_w(0), grad_b(0));
  nn::linear_backward(W_k_, X_k.data(), dk.data(), B * K, g.keys.data(), grad_w(1), grad_b(1));
  nn::linear_backward(W_v_, X_v.data(), dv.data(), B * K, g.values.data(), grad_w(2), grad_b(2));
  return g;
}

}  // namespace mha
