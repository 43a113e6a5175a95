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
#include "nn/module_grads.h"

namespace mha {

namespace {

// Layers in the order of PyTorch's parameters(): q, k, v projections, out.
const char* const kLayers[] = {"q_proj", "k_proj", "v_proj", "out_proj"};

}  // namespace

void TorchMultiheadAttention::ensure_grads() {
  nn::layer_grads(grads_, kLayers, {&q_proj_, &k_proj_, &v_proj_, &out_proj_});
  if (has_bias_kv()) {
    nn::grad_like(grads_, "bias_k", bias_k_.shape());
    nn::grad_like(grads_, "bias_v", bias_v_.shape());
  }
}

void TorchMultiheadAttention::parameters_written() {
  for (LazyLinear* layer : {&q_proj_, &k_proj_, &v_proj_, &out_proj_}) layer->version().bump();
}

void TorchMultiheadAttention::zero_grad() {
  ensure_grads();
  nn::zero_grads(grads_, heads_.gate_grad);
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
                   &grads_.at(std::string(kLayers[i]) + ".weight"), &proj[i]->version()});
  if (bias_)
    for (int i = 0; i < 3; ++i)
      out.push_back({std::string(names[i]) + "_bias", &proj[i]->bias(),
                     &grads_.at(std::string(kLayers[i]) + ".bias"), &proj[i]->version()});
  out.push_back({"out_proj.weight", &out_proj_.weight(), &grads_.at("out_proj.weight"), &out_proj_.version()});
  if (bias_) out.push_back({"out_proj.bias", &out_proj_.bias(), &grads_.at("out_proj.bias"), &out_proj_.version()});
  if (has_bias_kv()) {
    out.push_back({"bias_k", &bias_k_, &grads_.at("bias_k")});
    out.push_back({"bias_v", &bias_v_, &grads_.at("bias_v")});
  }
  return out;
}

Tensor TorchMultiheadAttention::last_dropout_mask() const {
  if (!saved_ && pruned_last_call_)
    fail("TorchMultiheadAttention.last_dropout_mask",
         "prune_heads discarded the last call (it had the removed heads): call the module again");
  if (!saved_)
    fail("TorchMultiheadAttention.last_dropout_mask",
         "no training-mode forward since the last eval-mode one: there is no mask to show");
  return nn::dropout_mask(*saved_);
}

TorchMultiheadAttention::InputGrads TorchMultiheadAttention::backward(const Tensor& grad_output) {
  if (!saved_ && pruned_last_call_)
    fail("TorchMultiheadAttention.backward",
         "prune_heads discarded the last call (it had the removed heads): call the module again");
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
  nn::EngineLayers layers{&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  nn::EngineGrads grads = nn::layer_grads(grads_, kLayers, layers);
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
  return {std::move(g.queries), std::move(g.keys), std::move(g.values), std::move(g.sinks)};
}

}  // namespace mha
