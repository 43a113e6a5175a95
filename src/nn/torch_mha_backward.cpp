// TorchMultiheadAttention's training half: backward(), gradients, parameters.
//
// The forward (torch_mha.cpp) is, with rows in the caller's layout,
//   q = query W_q^T + b_q                                  [B*L rows, E]
//   k = key W_k^T + b_k, then bias_k and a zero row        [B*S' rows, E_kv]
//   v = value W_v^T + b_v, then bias_v and a zero row      [B*S' rows, E_kv]
//   concat = heads(attention(q, k, v; masks, dropout))     [B*L rows, E]
//   out = concat W_o^T + b_o                               [B*L rows, E]
// and backward() runs it in reverse on the engine (nn/attention_engine.h):
// out_proj's linear backward, the attention kernel's backward on the saved
// projections with the forward's masks and dropout key, the appended rows'
// gradients (bias_k/bias_v sum theirs over the batch; the zero row's is
// dropped), then the three projections' linear backwards.
#include <algorithm>
#include <cmath>
#include <string>

#include "mha/error.h"
#include "mha/torch_mha.h"
#include "nn/attention_engine.h"

namespace mha {

namespace {

// Layers in the order of PyTorch's parameters(): q, k, v projections, out.
const char* const kLayers[] = {"q_proj", "k_proj", "v_proj", "out_proj"};

}  // namespace

void TorchMultiheadAttention::ensure_grads() {
  const LazyLinear* layers[] = {&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  auto zeros_like = [&](const std::string& name, const Tensor& t) {
    Tensor& g = grads_[name];
    if (g.shape() != t.shape()) g = Tensor(t.shape());
  };
  for (int i = 0; i < 4; ++i) {
    zeros_like(std::string(kLayers[i]) + ".weight", layers[i]->weight());
    if (bias_) zeros_like(std::string(kLayers[i]) + ".bias", layers[i]->bias());
  }
  if (has_bias_kv()) {
    zeros_like("bias_k", bias_k_);
    zeros_like("bias_v", bias_v_);
  }
}

void TorchMultiheadAttention::zero_grad() {
  ensure_grads();
  for (auto& [name, g] : grads_) std::fill(g.values().begin(), g.values().end(), 0.0f);
  std::fill(heads_.gate_grad.values().begin(), heads_.gate_grad.values().end(), 0.0f);
}

ParamList TorchMultiheadAttention::parameters() {
  ensure_grads();
  ParamList out;
  LazyLinear* proj[] = {&q_proj_, &k_proj_, &v_proj_};
  const char* names[] = {"q_proj", "k_proj", "v_proj"};
  // PyTorch's order: in_proj_weight (or q/k/v_proj_weight), in_proj_bias,
  // out_proj.weight, out_proj.bias, then bias_k, bias_v.
  for (int i = 0; i < 3; ++i)
    out.push_back({std::string(names[i]) + "_weight", &proj[i]->weight(),
                   &grads_.at(std::string(kLayers[i]) + ".weight")});
  if (bias_)
    for (int i = 0; i < 3; ++i)
      out.push_back({std::string(names[i]) + "_bias", &proj[i]->bias(),
                     &grads_.at(std::string(kLayers[i]) + ".bias")});
  out.push_back({"out_proj.weight", &out_proj_.weight(), &grads_.at("out_proj.weight")});
  if (bias_) out.push_back({"out_proj.bias", &out_proj_.bias(), &grads_.at("out_proj.bias")});
  if (has_bias_kv()) {
    out.push_back({"bias_k", &bias_k_, &grads_.at("bias_k")});
    out.push_back({"bias_v", &bias_v_, &grads_.at("bias_v")});
  }
  return out;
}

Tensor TorchMultiheadAttention::last_dropout_mask() const {
  if (!saved_)
    fail("TorchMultiheadAttention.last_dropout_mask",
         "no training-mode forward since the last eval-mode one: there is no mask to show");
  return nn::dropout_mask(*saved_);
}

TorchMultiheadAttention::InputGrads TorchMultiheadAttention::backward(const Tensor& grad_output) {
  if (!saved_)
    fail("TorchMultiheadAttention.backward", "no training-mode forward to differentiate: call the module in training mode "
         "(train()) before backward()");
  return backward_of(*saved_, grad_output);
}

TorchMultiheadAttention::InputGrads TorchMultiheadAttention::backward(const ForwardContext& context,
                                                                      const Tensor& grad_output) {
  return backward_of(nn::differentiable_context("TorchMultiheadAttention.backward", context, id_.value(), num_heads_),
                     grad_output);
}

TorchMultiheadAttention::InputGrads TorchMultiheadAttention::backward_of(const nn::AttentionContext& ctx,
                                                                         const Tensor& grad_output) {
  static const char* op = "TorchMultiheadAttention.backward";
  if (grad_output.shape() != ctx.queries.shape())
    fail(op, "grad_output: shape ", shape_str(grad_output.shape()), " is not the output's ",
         shape_str(ctx.queries.shape()));
  ensure_grads();
  auto grads_of = [&](int layer) {
    const std::string n = kLayers[layer];
    return nn::LinearGrads{&grads_.at(n + ".weight"), bias_ ? &grads_.at(n + ".bias") : nullptr};
  };
  nn::EngineLayers layers{&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  nn::EngineGrads grads{grads_of(0), grads_of(1), grads_of(2), grads_of(3)};
  if (has_bias_kv()) {
    layers.bias_k = bias_k_.data();
    layers.bias_v = bias_v_.data();
    grads.bias_k = &grads_.at("bias_k");
    grads.bias_v = &grads_.at("bias_v");
  }
  layers.zero_row = add_zero_attn_;
  layers.head_gates = heads_.gates.data();
  grads.head_gates = &heads_.gate_grad;
  nn::EngineInputGrads g = nn::attention_backward(ctx, layers, grad_output, grads);
  return {std::move(g.queries), std::move(g.keys), std::move(g.values)};
}

}  // namespace mha
