// MultiHeadAttention's training half: backward(), gradients, parameters.
//
// The forward (multihead.cpp) is, per row of the batch,
//   q = X_q W_q^T + b_q,  k = X_k W_k^T + b_k,  v = X_v W_v^T + b_v   [L, D]
//   concat = heads(attention(q, k, v)) * head gates                  [Q, D]
//   out = concat W_o^T + b_o                                         [Q, num_hiddens]
// (D = inner_dim(): num_hiddens unless heads were pruned)
// and backward() runs it in reverse on the engine (nn/attention_engine.h):
// W_o's linear backward, the head gates', the attention kernel's backward on
// the saved projections, then the three projections' linear backwards.
#include <algorithm>
#include <cmath>

#include "mha/error.h"
#include "mha/multihead.h"
#include "nn/attention_engine.h"
#include "nn/module_grads.h"

namespace mha {

namespace {

const char* const kNames[] = {"W_q", "W_k", "W_v", "W_o"};

}  // namespace

void MultiHeadAttention::initialize(int64_t dq, int64_t dk, int64_t dv) {
  static const char* op = "MultiHeadAttention.initialize";
  // The order of a first forward call: W_q, W_k, W_v, then W_o; like the
  // lazy initialisation of forward(), running calls finish first.
  params_.update([&](Params& live) {
    // Check every width before drawing anything, so a failure changes nothing.
    const std::pair<const LazyLinear*, int64_t> widths[] = {{&live.W_q, dq}, {&live.W_k, dk}, {&live.W_v, dv}};
    const char* what[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i) {
      const auto [layer, w] = widths[i];
      if (w <= 0) fail(op, what[i], ": ", w, " is not a positive input width");
      if (layer->initialized() && layer->in_features() != w)
        fail(op, what[i], ": ", w, " differs from the width ", layer->in_features(),
             " this layer was initialised with");
    }
    live.W_q.initialize(dq, gen_, op);
    live.W_k.initialize(dk, gen_, op);
    live.W_v.initialize(dv, gen_, op);
    if (!live.W_o.initialized()) live.W_o.initialize(live.inner_dim(), gen_, op);
  });
}

void MultiHeadAttention::ensure_grads() {
  const Params& p = params_.live();
  nn::layer_grads(grads_, kNames, {&p.W_q, &p.W_k, &p.W_v, &p.W_o});
}

const StateDict& MultiHeadAttention::grads() {
  ensure_grads();
  return grads_;
}

void MultiHeadAttention::parameters_written() {
  Params& p = params_.live();
  for (LazyLinear* layer : {&p.W_q, &p.W_k, &p.W_v, &p.W_o}) layer->version().bump();
}

void MultiHeadAttention::zero_grad() {
  ensure_grads();
  nn::zero_grads(grads_, params_.live().heads.gate_grad);
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
  Params& p = params_.live();
  LazyLinear* layers[] = {&p.W_q, &p.W_k, &p.W_v, &p.W_o};
  // The order of the d2l chapter module's parameters(): W_q, W_k, W_v, W_o, weight
  // before bias.
  for (int i = 0; i < 4; ++i) {
    if (!layers[i]->initialized()) continue;
    const std::string n = kNames[i];
    out.push_back({n + ".weight", &layers[i]->weight(), &grads_.at(n + ".weight"), &layers[i]->version()});
    if (bias_) out.push_back({n + ".bias", &layers[i]->bias(), &grads_.at(n + ".bias"), &layers[i]->version()});
  }
  return out;
}

Tensor MultiHeadAttention::last_dropout_mask() const {
  const std::shared_ptr<nn::AttentionContext> st = state_.load();
  if (!st && pruned_last_call_.get())
    fail("MultiHeadAttention.last_dropout_mask",
         "prune_heads discarded the last call (it had the removed heads): call the module again");
  if (!st) fail("MultiHeadAttention.last_dropout_mask", "no forward call yet: there is no mask to show");
  return nn::dropout_mask(*st);
}

MultiHeadAttention::InputGrads MultiHeadAttention::backward(const Tensor& grad_output) {
  static const char* op = "MultiHeadAttention.backward";
  // Training is one thread's business; a forward() of another thread
  // replaces the last call whole, never half.
  const std::shared_ptr<nn::AttentionContext> st = state_.load();
  if (!st && pruned_last_call_.get())
    fail(op, "prune_heads discarded the last call (it had the removed heads): call the module again");
  if (!st || !st->for_backward)
    fail(op, "no training-mode forward to differentiate: call the module in training mode "
             "(train()) before backward()");
  return backward_of(*st, *params_.pin(), grad_output);
}

MultiHeadAttention::InputGrads MultiHeadAttention::backward(const ForwardContext& context,
                                                            const Tensor& grad_output) {
  const Pinned p = params_.pin();
  return backward_of(nn::differentiable_context("MultiHeadAttention.backward", context, id_.value(), p->num_heads),
                     *p, grad_output);
}

MultiHeadAttention::InputGrads MultiHeadAttention::backward_of(const nn::AttentionContext& ctx, const Params& p,
                                                               const Tensor& grad_output) {
  static const char* op = "MultiHeadAttention.backward";
  const int64_t B = ctx.B(), Q = ctx.Q;
  if (grad_output.shape() != Shape{B, Q, num_hiddens_})
    fail(op, "grad_output: shape ", shape_str(grad_output.shape()), " is not the output's ",
         shape_str({B, Q, num_hiddens_}));
  nn::EngineLayers layers{&p.W_q, &p.W_k, &p.W_v, &p.W_o};
  layers.head_gates = p.heads.gates.data();
  nn::EngineGrads grads = nn::layer_grads(grads_, kNames, layers);
  grads.head_gates = &params_.live().heads.gate_grad;
  // The backward's scratch (the heads' gradients: four of the output's size)
  // and the input gradients from the buffers a replaced call left, and the
  // scratch back to them for the next forward: fewer fresh pages per step
  // (page faults and zeroing). At B8 L512 D768 h12, one thread, a step
  // allocates 4 buffers of 12 MiB instead of 8; the time it saves was
  // within the noise (2%) of the 2-core VM's measurements.
  std::shared_ptr<std::vector<Tensor>> spare = spare_.exchange(nullptr);
  if (!spare) spare = std::make_shared<std::vector<Tensor>>();
  nn::EngineInputGrads g = nn::attention_backward(ctx, layers, grad_output, grads, spare.get());
  spare_.store(std::move(spare));
  return {std::move(g.queries), std::move(g.keys), std::move(g.values), std::move(g.sinks)};
}

}  // namespace mha
