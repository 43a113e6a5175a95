// TorchMultiheadAttention::forward: nn.MultiheadAttention's forward on mha's
// kernels. The projections read and write rows in the caller's layout
// (batch- or sequence-first), and the kernel sees heads through strides, so
// neither layout costs a transpose. bias_k/bias_v and add_zero_attn append
// key/value rows after projection, as PyTorch does, and every mask gets a
// "takes part" column for each appended key.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/finite.h"
#include "kernels/attention_params.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "mha/torch_mha.h"
#include "nn/torch_mha_impl.h"

namespace mha {

namespace nn {

TensorView head_view(float* data, const TorchMhaGeometry& g, int64_t L, int64_t heads, int64_t d) {
  const int64_t width = heads * d;
  TensorView v;
  v.data = data;
  v.rank = 4;
  v.shape[0] = g.B; v.stride[0] = g.seq_first ? width : L * width;
  v.shape[1] = heads; v.stride[1] = d;
  v.shape[2] = L; v.stride[2] = g.seq_first ? g.B * width : width;
  v.shape[3] = d; v.stride[3] = 1;
  return v;
}

kernels::MaskOptions TorchMhaMasks::options() const {
  kernels::MaskOptions m;
  m.key_keep = key_keep.empty() ? nullptr : key_keep.data();
  m.key_bias = key_bias.empty() ? nullptr : key_bias.data();
  m.pair_keep = pair_keep.empty() ? nullptr : pair_keep.data();
  m.pair_bias = pair_bias.empty() ? nullptr : pair_bias.data();
  m.pair_stride_b = pair_stride_b;
  m.pair_stride_h = pair_stride_h;
  m.causal = causal;
  m.fill = neg_inf_fill ? kernels::MaskFill::NegInf : kernels::MaskFill::Seed;
  m.fully_masked = fully_masked;
  return m;
}

}  // namespace nn

namespace {

const char* kForward = "TorchMultiheadAttention.forward";
using Geometry = nn::TorchMhaGeometry;
using nn::head_view;

// x:[B*K rows, in] -> out:[B*Kt rows, width]: the projection of the K given
// keys, then the bias row (bias_k / bias_v, if any) at position K of every
// batch row; any position after that (add_zero_attn's) stays zero.
// `rows` ([B] or empty: all): project only the first rows[b] positions of
// batch row b (batch-first, no appended rows); the others stay zero.
std::vector<float> project_keys(const LazyLinear& layer, const Tensor& x, const Geometry& g,
                                const Tensor& extra_row, const std::vector<int64_t>& rows = {}) {
  const int64_t width = layer.out_features(), in = layer.in_features();
  std::vector<float> out(static_cast<size_t>(g.B * g.Kt * width), 0.0f);
  if (!rows.empty()) {
    for (int64_t b = 0; b < g.B; ++b)
      if (rows[static_cast<size_t>(b)] > 0)
        layer.forward_rows(x.data() + b * g.K * in, rows[static_cast<size_t>(b)], out.data() + b * g.K * width,
                           width);
  } else if (g.seq_first || g.Kt == g.K) {
    // The K given positions are the first B*K rows in both layouts here.
    layer.forward_rows(x.data(), g.B * g.K, out.data(), width);
  } else {
    for (int64_t b = 0; b < g.B; ++b)
      layer.forward_rows(x.data() + b * g.K * in, g.K, out.data() + b * g.Kt * width, width);
  }
  if (!extra_row.empty())
    for (int64_t b = 0; b < g.B; ++b)
      std::copy(extra_row.data(), extra_row.data() + width, out.data() + g.row(b, g.K, g.Kt) * width);
  return out;
}

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

// [B] or empty (all): the key and value rows of each batch row that the
// fused kernel can read, when a boolean key padding mask lets it skip the
// rest. The kernel reads no key past a row's last kept key; the policy for
// fully masked rows reads every value row only under Uniform, so rows whose
// queries might all be masked (no kept key, or attn_mask / causal in play)
// are projected in full then. A non-finite value input past the limit is
// projected too: PyTorch multiplies it by weight 0, and NaN reaches the
// outputs (nonfinite_value_rows then has the kernel read the row in full).
// Only batch-first rows without appended keys are contiguous per batch row.
std::vector<int64_t> key_rows_read(const Mask& kpm, const Mask& am, Causal causal, FullyMaskedRows policy,
                                   const Tensor& value, const Geometry& g) {
  std::vector<int64_t> rows;
  if (!kpm.is_keep() || g.Kt != g.K || (g.seq_first && g.B > 1)) return rows;
  const bool other_masks = !am.is_none() || causal != Causal::None;
  const int64_t width = value.size(-1);
  const uint8_t* keep = kpm.keep_data();
  bool skips = false;
  rows.assign(static_cast<size_t>(g.B), g.K);
  for (int64_t b = 0; b < g.B; ++b) {
    int64_t n = 0;  // last kept key + 1
    for (int64_t j = g.K - 1; j >= 0; --j)
      if (keep[b * g.K + j]) {
        n = j + 1;
        break;
      }
    if (policy == FullyMaskedRows::Uniform && (n == 0 || other_masks)) continue;
    const float* v = value.data() + (b * g.K + n) * width;
    bool finite = true;
    for (int64_t x = 0; x < (g.K - n) * width; ++x) finite &= std::isfinite(v[x]);
    if (!finite) continue;
    rows[static_cast<size_t>(b)] = n;
    skips |= n < g.K;
  }
  if (!skips) rows.clear();
  return rows;
}

// [B]: 1 for each batch row with a non-finite projected value row, or
// empty when there is none. v: [B*Kt rows, width] in g's row order.
std::vector<uint8_t> nonfinite_value_rows(const std::vector<float>& v, const Geometry& g,
                                          int64_t width) {
  std::vector<uint8_t> flag;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t pos = 0; pos < g.Kt; ++pos) {
      const float* row = v.data() + g.row(b, pos, g.Kt) * width;
      bool finite = true;
      for (int64_t c = 0; c < width; ++c) finite &= std::isfinite(row[c]);
      if (finite) continue;
      if (flag.empty()) flag.assign(static_cast<size_t>(g.B), 0);
      flag[static_cast<size_t>(b)] = 1;
      break;
    }
  return flag;
}

}  // namespace

nn::TorchMhaMasks nn::build_masks(const Mask& kpm, const Mask& am, Causal causal, const Geometry& g,
                                  int64_t H, FullyMaskedRows policy) {
  TorchMhaMasks m;
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
  const int64_t Ekv = Hkv * d;
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

  // --- projections; k and v get their appended rows ---
  Tensor q_proj({g.B * g.Q, E});
  q_proj_.forward_rows(query.data(), g.B * g.Q, q_proj.data(), E);
  const Tensor bk = has_bias_kv() ? bias_k_.reshape({Ekv}) : Tensor();
  const Tensor bv = has_bias_kv() ? bias_v_.reshape({Ekv}) : Tensor();
  // The fused kernel skips keys past a key padding mask's last kept key:
  // their projections are skipped too.
  const bool fused = kernels::runs_fused(kernel_, g.Kt);
  const std::vector<int64_t> rows =
      fused ? key_rows_read(kpm, am, call.causal, fully_masked_, value, g) : std::vector<int64_t>{};
  std::vector<float> k_proj = project_keys(k_proj_, key, g, bk, rows);
  std::vector<float> v_proj = project_keys(v_proj_, value, g, bv, rows);

  kernels::AttentionForward p;
  Tensor concat({g.B * g.Q, E});
  p.q = head_view(q_proj.data(), g, g.Q, H, d);
  p.k = head_view(k_proj.data(), g, g.Kt, Hkv, d);
  p.v = head_view(v_proj.data(), g, g.Kt, Hkv, d);
  p.out = head_view(concat.data(), g, g.Q, H, d);
  // A training-mode forward keeps what backward() needs; the weights only
  // when the caller wants them (else the backward recomputes them).
  const bool keep = training_;
  Tensor weights;
  if (call.need_weights) {
    weights = Tensor({g.B, H, g.Q, g.Kt});
    p.weights = weights.data();
  }
  p.scale_divisor = std::sqrt(static_cast<float>(d));
  if (training_ && dropout_ > 0.0f) p.dropout = {dropout_, gen_.next()};
  nn::TorchMhaMasks masks = nn::build_masks(kpm, am, call.causal, g, H, fully_masked_);
  p.masks = masks.options();

  // The fused kernel keeps the softmax statistics for the backward instead
  // of the weights.
  std::vector<float> stats;
  std::vector<uint8_t> read_all;
  if (fused) {
    const int64_t n = g.B * H * g.Q;
    if (keep) {
      stats.resize(static_cast<size_t>(2 * n));
      p.stats = {stats.data(), stats.data() + n};
    }
    // A value row the kernel would skip (past a row's last live key) still
    // reaches the outputs when it is not finite (0 * NaN), as in PyTorch:
    // such batch rows are read in full.
    read_all = nonfinite_value_rows(v_proj, g, Ekv);
    p.read_all_keys = read_all.empty() ? nullptr : read_all.data();
  }
  if (kernels::attention_forward(kernel_, p).empty()) stats.clear();  // none saved

  TorchMhaResult result;
  result.output = Tensor(query.shape());
  out_proj_.forward_rows(concat.data(), g.B * g.Q, result.output.data(), E);
  // Finite inputs and parameters whose projections or scores overflow
  // float32 (inputs ~1e20) would give NaN: an error instead (NaN or infinite
  // inputs are computed through, as PyTorch does).
  if (!core::all_finite(result.output) && core::all_finite(query) && core::all_finite(key) &&
      core::all_finite(value)) {
    bool finite = true;
    for (const auto& [name, t] : state_dict()) finite = finite && core::all_finite(t);
    if (finite)
      fail(kForward, "finite query, key, value and parameters give a projection or score that overflows float32 "
           "(largest input magnitude ", std::fmax(core::max_abs(query), std::fmax(core::max_abs(key), core::max_abs(value))),
           "); scale the inputs down");
  }
  if (keep) {
    auto saved = std::make_shared<nn::TorchMhaSaved>();
    saved->g = g;
    saved->query = query;
    saved->key = key;
    saved->value = value;
    saved->q = std::move(q_proj);
    saved->k = std::move(k_proj);
    saved->v = std::move(v_proj);
    saved->concat = std::move(concat);
    saved->weights = weights;  // a copy: dropout and averaging change `weights` below
    saved->masks = std::move(masks);
    saved->dropout = p.dropout;
    saved->stats = std::move(stats);
    saved_ = std::move(saved);
  } else {
    saved_.reset();
  }
  if (!call.need_weights) return result;
  // PyTorch returns the weights after dropout; the kernel's are before it,
  // and its counter-based mask is recomputed here from the same key.
  if (p.dropout.active())
    for (int64_t x = 0; x < weights.numel(); ++x)
      weights.data()[x] *= p.dropout.multiplier(static_cast<uint64_t>(x));
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
