// TorchMultiheadAttention::forward: nn.MultiheadAttention's forward on mha's
// kernels. The projections read and write rows in the caller's layout
// (batch- or sequence-first), and the kernel sees heads through strides, so
// neither layout costs a transpose. bias_k/bias_v and add_zero_attn append
// key/value rows after projection, as PyTorch does, and every mask gets a
// "takes part" column for each appended key.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/memory.h"
#include "mha/error.h"
#include "mha/torch_mha.h"
#include "nn/attention_engine.h"
#include "nn/call_masks.h"

namespace mha {

namespace {

const char* kForward = "TorchMultiheadAttention.forward";

// The call's geometry. Rows of every buffer are (b, position) pairs in the
// caller's layout: b-major when batch_first, position-major otherwise (and
// for an unbatched call, B = 1).
struct Geometry {
  bool seq_first = false;
  int64_t B = 0, Q = 0, K = 0, Kt = 0;  // Kt: keys after bias_k/bias_v and the zero key
};

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
  const int64_t E = embed_dim_, H = num_heads_, Hkv = num_kv_heads_, d = head_dim();
  // --- shapes ---
  const bool batched = query.dim() == 3;
  if (query.dim() != 2 && query.dim() != 3)
    fail(kForward, "query: shape ", shape_str(query.shape()), " is neither ",
         batch_first_ ? "(B, L, E)" : "(L, B, E)", " nor unbatched (L, E)");
  if (key.dim() != query.dim() || value.dim() != query.dim())
    fail(kForward, "key/value: shapes ", shape_str(key.shape()), " and ", shape_str(value.shape()),
         " do not have the rank of query ", shape_str(query.shape()));
  Geometry g;
  g.seq_first = !batched || !batch_first_;
  const int bax = batched && batch_first_ ? 0 : 1;  // batch axis when batched
  const int pax = batched && batch_first_ ? 1 : 0;  // position axis
  g.B = batched ? query.size(bax) : 1;
  g.Q = query.size(pax);
  g.K = key.size(pax);
  g.Kt = g.K + (has_bias_kv() ? 1 : 0) + (add_zero_attn_ ? 1 : 0);
  const char* layout = !batched ? "(S, width)" : batch_first_ ? "(B, S, width)" : "(S, B, width)";
  if (query.size(-1) != E)
    fail(kForward, "query: shape ", shape_str(query.shape()), " has width ", query.size(-1),
         "; wanted embed_dim ", E);
  if (key.size(-1) != kdim())
    fail(kForward, "key: shape ", shape_str(key.shape()), " has width ", key.size(-1),
         "; wanted kdim ", kdim());
  if (value.size(-1) != vdim())
    fail(kForward, "value: shape ", shape_str(value.shape()), " has width ", value.size(-1),
         "; wanted vdim ", vdim());
  if (batched && (key.size(bax) != g.B || value.size(bax) != g.B))
    fail(kForward, "key/value: shapes ", shape_str(key.shape()), " and ", shape_str(value.shape()),
         " do not have query's batch size ", g.B, " (layout ", layout, ")");
  if (value.size(pax) != g.K)
    fail(kForward, "value: shape ", shape_str(value.shape()), " has ", value.size(pax),
         " positions but key ", shape_str(key.shape()), " has ", g.K);
  if (g.Kt == 0) fail(kForward, "key: shape ", shape_str(key.shape()), " has no keys to attend to");
  // --- the engine (nn/attention_engine.h) ---
  nn::EngineCall c;
  c.op = kForward;
  c.inputs = "query, key, value";
  c.layout = {g.seq_first, g.B};
  c.Q = g.Q, c.K = g.K;
  c.H = H, c.Hkv = Hkv, c.d = d;
  c.out_shape = query.shape();
  // A per-head attn_mask has a slice for every head as built.
  if (heads_.pruned() && call.attn_mask.dim() == 3)
    check_mask_shape(kForward, "attn_mask", call.attn_mask,
                     {batched ? g.B * heads_.original : heads_.original, g.Q, g.K});
  c.masks = nn::build_masks(kForward, call.key_padding_mask, kept_head_slices(call.attn_mask, g.B), call.causal,
                            fully_masked_, {batched, g.B, g.Q, g.K, g.Kt, H});
  c.kernel = kernel_;
  c.precision = precision_;
  c.need_weights = call.need_weights;
  c.keep_for_backward = training_;  // a training-mode forward keeps what backward() needs
  c.keep_for_weights = call.keep_context;
  nn::EngineLayers layers{&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  layers.bias_k = has_bias_kv() ? bias_k_.data() : nullptr;
  layers.bias_v = has_bias_kv() ? bias_v_.data() : nullptr;
  layers.zero_row = add_zero_attn_;
  layers.head_gates = heads_.gates.data();
  core::MemoryPlan plan(kForward);
  nn::add_call_memory(plan, c, layers, E);
  plan.check();
  if (training_ && dropout_ > 0.0f) c.dropout = {dropout_, dropout_keys_.next()};
  const kernels::Dropout dropout = c.dropout;
  nn::EngineOutput r = nn::attention_forward(query, key, value, layers, std::move(c));
  r.context->owner = id_.value();
  TorchMhaResult result;
  if (call.keep_context) result.context = ForwardContext(r.context);
  if (training_) saved_ = std::move(r.context);
  else saved_.reset();
  result.output = std::move(r.output);
  Tensor weights = std::move(r.weights);
  if (!call.need_weights) return result;
  // PyTorch returns the weights after dropout; the kernel's are before it,
  // and its counter-based mask is recomputed here from the same key.
  if (dropout.active())
    for (int64_t x = 0; x < weights.numel(); ++x)
      weights.data()[x] *= dropout.multiplier(static_cast<uint64_t>(x));
  if (call.average_attn_weights) {
    Tensor avg({g.B, g.Q, g.Kt}, 0.0f);
    const int64_t QK = g.Q * g.Kt;
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < QK; ++x) avg.data()[b * QK + x] += weights.data()[(b * H + h) * QK + x];
    for (float& x : avg.values()) x /= static_cast<float>(H);
    weights = batched ? avg : avg.reshape({g.Q, g.Kt});
  } else if (!batched) {
    weights = weights.reshape({H, g.Q, g.Kt});
  }
  result.weights = std::move(weights);
  return result;
}

}  // namespace mha
