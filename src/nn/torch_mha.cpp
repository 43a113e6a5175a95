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

// A mask whose last axis has K entries, padded to Kt with `pad` per row.
template <typename T>
std::vector<T> pad_last_axis(const T* data, int64_t rows, int64_t K, int64_t Kt, T pad) {
  std::vector<T> out(static_cast<size_t>(rows * Kt), pad);
  for (int64_t r = 0; r < rows; ++r) std::copy(data + r * K, data + (r + 1) * K, out.data() + r * Kt);
  return out;
}

// Two additive masks are added to the scores: finite entries whose sum is
// +inf (3e38 + 3e38) would turn a row into inf - inf = NaN. Checked per key
// over the largest entries of each mask (exact for a 2-D attn_mask).
void check_mask_sum(const Mask& kpm, const Mask& am, int64_t K) {
  if (!kpm.is_additive() || !am.is_additive() || K == 0) return;
  const std::vector<float>& a = kpm.bias_values();
  const std::vector<float>& b = am.bias_values();
  std::vector<float> ka(static_cast<size_t>(K), -INFINITY), kb(static_cast<size_t>(K), -INFINITY);
  for (size_t i = 0; i < a.size(); ++i) ka[i % K] = std::fmax(ka[i % K], a[i]);
  for (size_t i = 0; i < b.size(); ++i) kb[i % K] = std::fmax(kb[i % K], b[i]);
  for (int64_t j = 0; j < K; ++j)
    if (std::isinf(ka[j] + kb[j]) && ka[j] + kb[j] > 0)
      fail(kForward, "key_padding_mask + attn_mask: key ", j, " has entries ", ka[j], " and ", kb[j],
           " whose sum overflows to +inf; wanted masks whose sums are finite or -inf");
}

bool causally_masked(Causal c, int64_t i, int64_t j, int64_t Q, int64_t K) {
  switch (c) {
    case Causal::None: return false;
    case Causal::TopLeft: return j > i;
    case Causal::BottomRight: return j > i + K - Q;
  }
  return false;
}

// Masks of one call over the Kt keys (appended keys always take part); shapes
// already checked. The fill (-inf) and the policy are set only when something
// masks, so that an unmasked call runs as the d2l chapter's.
nn::AttentionMasks build_masks(const Mask& kpm, const Mask& am, Causal causal, const Geometry& g,
                               int64_t H, FullyMaskedRows policy) {
  nn::AttentionMasks m;
  // The fill and the policy only matter where something masks; leaving them
  // at their defaults otherwise lets a kernel without them run the plain case.
  if (!kpm.is_none() || !am.is_none() || causal != Causal::None) {
    m.neg_inf_fill = true;
    m.fully_masked = policy;
  }
  if (kpm.is_keep()) m.key_keep = pad_last_axis<uint8_t>(kpm.keep_data(), g.B, g.K, g.Kt, 1);
  if (kpm.is_additive()) m.key_bias = pad_last_axis<float>(kpm.bias_data(), g.B, g.K, g.Kt, 0.0f);
  const bool am3 = am.dim() == 3;
  const int64_t slices = am3 ? am.shape()[0] : 1;  // (Q, K) slices of attn_mask
  if (am3) {
    m.pair_stride_h = g.Q * g.Kt;
    m.pair_stride_b = H * g.Q * g.Kt;
  }
  if (am.is_keep()) m.pair_keep = pad_last_axis<uint8_t>(am.keep_data(), slices * g.Q, g.K, g.Kt, 1);
  if (am.is_additive()) m.pair_bias = pad_last_axis<float>(am.bias_data(), slices * g.Q, g.K, g.Kt, 0.0f);
  if (g.Kt == g.K || causal == Causal::None) {
    m.causal = causal;
    return m;
  }
  // The kernel's causal limit would count the appended keys, so the causal
  // pattern over the K given keys joins the pair mask instead.
  if (am.is_none()) m.pair_keep.assign(static_cast<size_t>(g.Q * g.Kt), 1);
  for (int64_t s = 0; s < slices; ++s)
    for (int64_t i = 0; i < g.Q; ++i)
      for (int64_t j = 0; j < g.K; ++j) {
        if (!causally_masked(causal, i, j, g.Q, g.K)) continue;
        const size_t at = static_cast<size_t>((s * g.Q + i) * g.Kt + j);
        if (!m.pair_bias.empty()) m.pair_bias[at] = -INFINITY;  // drops out under the -inf fill
        else m.pair_keep[at] = 0;
      }
  return m;
}

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
  const Mask& kpm = call.key_padding_mask;
  const Mask& am = call.attn_mask;
  check_mask_shape(kForward, "key_padding_mask", kpm, batched ? Shape{g.B, g.K} : Shape{g.K});
  const bool am3 = am.dim() == 3;
  if (!am.is_none() && am.dim() != 2 && !am3)
    fail(kForward, "attn_mask: shape ", shape_str(am.shape()), " is neither ",
         shape_str({g.Q, g.K}), " nor ", shape_str({batched ? g.B * H : H, g.Q, g.K}));
  check_mask_shape(kForward, "attn_mask", am,
                   am3 ? Shape{batched ? g.B * H : H, g.Q, g.K} : Shape{g.Q, g.K});
  check_mask_sum(kpm, am, g.K);

  // --- the engine (nn/attention_engine.h) ---
  nn::EngineCall c;
  c.op = kForward;
  c.inputs = "query, key, value";
  c.layout = {g.seq_first, g.B};
  c.Q = g.Q, c.K = g.K;
  c.H = H, c.Hkv = Hkv, c.d = d;
  c.out_shape = query.shape();
  c.masks = build_masks(kpm, am, call.causal, g, H, fully_masked_);
  c.kernel = kernel_;
  c.need_weights = call.need_weights;
  c.keep_for_backward = training_;  // a training-mode forward keeps what backward() needs
  nn::EngineLayers layers{&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  layers.bias_k = has_bias_kv() ? bias_k_.data() : nullptr;
  layers.bias_v = has_bias_kv() ? bias_v_.data() : nullptr;
  layers.zero_row = add_zero_attn_;
  core::MemoryPlan plan(kForward);
  nn::add_call_memory(plan, c, layers, E);
  plan.check();
  if (training_ && dropout_ > 0.0f) c.dropout = {dropout_, gen_.next()};
  const kernels::Dropout dropout = c.dropout;
  nn::EngineOutput r = nn::attention_forward(query, key, value, layers, std::move(c));
  if (training_) saved_ = std::move(r.context);
  else saved_.reset();
  TorchMhaResult result;
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
