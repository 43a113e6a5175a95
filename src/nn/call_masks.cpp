#include "nn/call_masks.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "mha/error.h"

namespace mha::nn {

namespace {

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
void check_mask_sum(const char* op, const Mask& kpm, const Mask& am, int64_t K) {
  if (!kpm.is_additive() || !am.is_additive() || K == 0) return;
  const std::vector<float>& a = kpm.bias_values();
  const std::vector<float>& b = am.bias_values();
  std::vector<float> ka(static_cast<size_t>(K), -INFINITY), kb(static_cast<size_t>(K), -INFINITY);
  for (size_t i = 0; i < a.size(); ++i) ka[i % K] = std::fmax(ka[i % K], a[i]);
  for (size_t i = 0; i < b.size(); ++i) kb[i % K] = std::fmax(kb[i % K], b[i]);
  for (int64_t j = 0; j < K; ++j)
    if (std::isinf(ka[j] + kb[j]) && ka[j] + kb[j] > 0)
      fail(op, "key_padding_mask + attn_mask: key ", j, " has entries ", ka[j], " and ", kb[j],
           " whose sum overflows to +inf; wanted masks whose sums are finite or -inf");
}

}  // namespace

void check_window(const char* op, const Window& window) {
  if (window.left < -1 || window.right < -1)
    fail(op, "window: (", window.left, ", ", window.right,
         ") has a side below -1; wanted each side >= 0 keys, or -1 for unbounded");
}

void add_score_options(const char* op, const ScoreOptions& scores, const MaskGeometry& g, AttentionMasks& masks) {
  if (!(std::isfinite(scores.softcap) && scores.softcap >= 0.0f))
    fail(op, "softcap: ", scores.softcap, "; wanted a finite cap >= 0 (0: no softcapping)");
  masks.softcap = scores.softcap;
  if (!scores.sinks.empty()) {
    // Sinks are per head, not per key: appended keys change nothing.
    if (static_cast<int64_t>(scores.sinks.size()) != g.H)
      fail(op, "sinks: ", scores.sinks.size(), " logits for ", g.H, " heads; wanted one per query head");
    for (size_t h = 0; h < scores.sinks.size(); ++h)
      if (!std::isfinite(scores.sinks[h])) fail(op, "sinks[", h, "]: ", scores.sinks[h], "; wanted a finite logit");
    masks.sinks = scores.sinks;
  }
  if (scores.alibi_slopes.empty()) return;
  if (static_cast<int64_t>(scores.alibi_slopes.size()) != g.H)
    fail(op, "alibi_slopes: ", scores.alibi_slopes.size(), " slopes for ", g.H,
         " heads; wanted one per query head");
  for (size_t h = 0; h < scores.alibi_slopes.size(); ++h)
    if (!std::isfinite(scores.alibi_slopes[h]))
      fail(op, "alibi_slopes[", h, "]: ", scores.alibi_slopes[h], "; wanted a finite slope");
  // Appended keys (bias_k, add_zero_attn) have no position to measure a
  // distance from.
  if (g.Kt != g.K)
    fail(op, "alibi_slopes: given with ", g.Kt - g.K, " appended key(s) (bias_k / add_zero_attn), which have no ",
         "position; wanted ALiBi on the given keys only (a module without add_bias_kv and add_zero_attn)");
  masks.alibi_slopes = scores.alibi_slopes;
}

AttentionMasks build_masks(const char* op, const Mask& key_padding_mask, const Mask& attn_mask, Causal causal,
                           const Window& window, FullyMaskedRows policy, const MaskGeometry& g) {
  const Mask& kpm = key_padding_mask;
  const Mask& am = attn_mask;
  check_window(op, window);
  check_mask_shape(op, "key_padding_mask", kpm, g.batched ? Shape{g.B, g.K} : Shape{g.K});
  const bool am3 = am.dim() == 3;
  if (!am.is_none() && am.dim() != 2 && !am3)
    fail(op, "attn_mask: shape ", shape_str(am.shape()), " is neither ",
         shape_str({g.Q, g.K}), " nor ", shape_str({g.batched ? g.B * g.H : g.H, g.Q, g.K}));
  check_mask_shape(op, "attn_mask", am, am3 ? Shape{g.batched ? g.B * g.H : g.H, g.Q, g.K} : Shape{g.Q, g.K});
  check_mask_sum(op, kpm, am, g.K);

  AttentionMasks m;
  // The fill and the policy only matter where something masks; leaving them
  // at their defaults otherwise lets a kernel without them run the plain case.
  if (!kpm.is_none() || !am.is_none() || causal != Causal::None || window.any()) {
    m.neg_inf_fill = true;
    m.fully_masked = policy;
  }
  if (kpm.is_keep()) m.key_keep = pad_last_axis<uint8_t>(kpm.keep_data(), g.B, g.K, g.Kt, 1);
  if (kpm.is_additive()) m.key_bias = pad_last_axis<float>(kpm.bias_data(), g.B, g.K, g.Kt, 0.0f);
  const int64_t slices = am3 ? am.shape()[0] : 1;  // (Q, K) slices of attn_mask
  if (am3) {
    m.pair_stride_h = g.Q * g.Kt;
    m.pair_stride_b = g.H * g.Q * g.Kt;
  }
  if (am.is_keep()) m.pair_keep = pad_last_axis<uint8_t>(am.keep_data(), slices * g.Q, g.K, g.Kt, 1);
  if (am.is_additive()) m.pair_bias = pad_last_axis<float>(am.bias_data(), slices * g.Q, g.K, g.Kt, 0.0f);
  if (g.Kt == g.K || (causal == Causal::None && !window.any())) {
    m.causal = causal;
    m.window = window;
    return m;
  }
  // The kernel's causal limit and window would count the appended keys, so
  // the pattern over the K given keys joins the pair mask instead.
  if (am.is_none()) m.pair_keep.assign(static_cast<size_t>(g.Q * g.Kt), 1);
  kernels::MaskOptions rule;  // the key range over the K given keys, as every kernel computes it
  rule.causal = causal;
  rule.window_left = window.left;
  rule.window_right = window.right;
  for (int64_t s = 0; s < slices; ++s)
    for (int64_t i = 0; i < g.Q; ++i) {
      const int64_t first = rule.first_key(i, g.Q, g.K), last = rule.last_key(i, g.Q, g.K);
      for (int64_t j = 0; j < g.K; ++j) {
        if (j >= first && j <= last) continue;
        const size_t at = static_cast<size_t>((s * g.Q + i) * g.Kt + j);
        if (!m.pair_bias.empty()) m.pair_bias[at] = -INFINITY;  // drops out under the -inf fill
        else m.pair_keep[at] = 0;
      }
    }
  return m;
}

}  // namespace mha::nn
