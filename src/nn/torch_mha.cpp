// TorchMultiheadAttention::forward: nn.MultiheadAttention's forward on the
// module's own layers (nn/module_calls.h runs it).
#include <algorithm>
#include <cmath>
#include <vector>

#include "mha/error.h"
#include "mha/torch_mha.h"
#include "nn/attention_engine.h"
#include "nn/module_calls.h"

namespace mha {

namespace {

const char* kForward = "TorchMultiheadAttention.forward";

}  // namespace

TorchMhaResult TorchMultiheadAttention::operator()(const Tensor& query, const Tensor& key,
                                                   const Tensor& value, const Mask& key_padding_mask,
                                                   bool need_weights, const Mask& attn_mask,
                                                   bool average_attn_weights, bool is_causal) {
  TorchMhaCall call;
  call.key_padding_mask = key_padding_mask;
  call.need_weights = need_weights;
  call.attn_mask = attn_mask;
  call.average_attn_weights = average_attn_weights;
  call.causal = is_causal ? Causal::TopLeft : Causal::None;
  return forward(query, key, value, call);
}

TorchMhaResult TorchMultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                const Tensor& value, const TorchMhaCall& call) {
  // A per-head attn_mask has a slice for every head as built; the call
  // reads those of the kept heads.
  TorchMhaCall kept = call;
  const bool shaped = (query.dim() == 2 || query.dim() == 3) && key.dim() == query.dim();  // else refused below
  if (heads_.pruned() && call.attn_mask.dim() == 3 && shaped) {
    const bool batched = query.dim() == 3;
    const int pax = batched && batch_first_ ? 1 : 0;  // position axis
    const int64_t B = batched ? query.size(batch_first_ ? 0 : 1) : 1;
    check_mask_shape(kForward, "attn_mask", call.attn_mask,
                     {batched ? B * heads_.original : heads_.original, query.size(pax), key.size(pax)});
    kept.attn_mask = kept_head_slices(call.attn_mask, B);
  }
  nn::EngineLayers layers{&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  layers.bias_k = has_bias_kv() ? bias_k_.data() : nullptr;
  layers.bias_v = has_bias_kv() ? bias_v_.data() : nullptr;
  layers.zero_row = add_zero_attn_;
  layers.head_gates = heads_.gates.data();
  nn::CallSettings settings;
  settings.kernel = kernel_;
  settings.precision = precision_;
  settings.rotary = rotary_;
  settings.keep_for_backward = training_;  // a training-mode forward keeps what backward() needs
  settings.keep_for_weights = call.keep_context;
  if (training_ && dropout_ > 0.0f) {
    settings.dropout.p = dropout_;
    settings.dropout_keys = &dropout_keys_;
  }
  const nn::TorchMhaShape shape{embed_dim_, num_heads_, num_kv_heads_, head_dim(), batch_first_, fully_masked_};
  nn::TorchMhaForward f = nn::torch_mha_forward(kForward, shape, layers, query, key, value, kept, settings);
  f.context->owner = id_.value();
  TorchMhaResult result = std::move(f.result);
  if (call.keep_context) result.context = ForwardContext(f.context);
  if (training_) saved_ = std::move(f.context);
  else saved_.reset();
  pruned_last_call_ = false;
  return result;
}

}  // namespace mha
