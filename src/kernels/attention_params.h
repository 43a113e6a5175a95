// src/kernels/attention_params.h: the one interface every attention kernel takes.
//
// A plain struct of strided views, shapes and options. The module validates
// its inputs once, then fills this struct and calls kernels::attention_forward
// (kernels/dispatch.h), which checks the struct in debug builds
// (kernels/validate.h) and runs the kernel.
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv]
//     (+ weights:[B,h,Q,K], + stats:[B,h,Q] twice)
//
// Scores are (q . k) / sqrt(d); key k of query q in row b is masked when
// float(k) >= length(b, q) and its score then becomes -1e6, the d2l
// chapter's fill, so a row with every key masked gets uniform weights 1/K.
//
// Options beyond the chapter (all additive; their defaults are the chapter's
// behaviour; every kernel honours every option; docs/masks.md has the table
// of fields):
// - grouped heads: k and v may have Hkv = k.shape[1] heads, Hkv dividing H;
//   query head h reads kv head h / (H / Hkv) (Hkv = 1: multi-query);
// - in `masks` (MaskOptions): boolean masks (1 = the key takes part) and
//   additive masks per key [B,K] or per (query, key) pair, causal masking,
//   a sliding window,
//   the fill of masked scores (the chapter's -1e6, or -inf: the key drops out)
//   and the policy for rows in which no key is live (uniform or zeros).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/softmax_stats.h"
#include "mha/masks.h"
#include "mha/precision.h"
#include "mha/tensor.h"

namespace mha::kernels {

enum class LengthKind { None, PerBatch, PerQuery };

// The chapter's masked_softmax replaces masked scores by this value.
inline constexpr float kMaskFill = -1e6f;

// What a masked score becomes before the softmax.
enum class MaskFill {
  Seed,    // -1e6, as masked_softmax: the d2l chapter's API
  NegInf,  // -inf: the key drops out (PyTorch's nn.MultiheadAttention)
};

// The masks beyond valid_lens, for key j of query i in batch row b, head h.
// One struct so that the forward and backward parameter structs carry the
// same thing. The defaults are the d2l chapter's behaviour (no mask, -1e6, uniform).
//
// Every kernel reads it (reference, BLAS, fused, AMX, decode, and the ring's
// blocks through the fused one), and asks it, not its own copy of the rule,
// for the range of keys a query may see (first_key, last_key) and a
// row's key masks (keep_row, bias_row).
struct MaskOptions {
  // Boolean masks read 1 = takes part; additive masks add to the scaled score.
  const uint8_t* key_keep = nullptr;   // [B,K], rows key_stride_b apart
  const float* key_bias = nullptr;     // [B,K], rows key_stride_b apart
  // Elements between the batch rows of key_keep / key_bias; 0: K (contiguous).
  // A cached call's rows have different K, so its masks cover the longest.
  int64_t key_stride_b = 0;
  // Per (query, key) pair: element b*pair_stride_b + h*pair_stride_h + i*K + j
  // (stride 0 broadcasts: a (Q,K) mask has both 0, a (B*h,Q,K) one has
  // pair_stride_h = Q*K, pair_stride_b = H*Q*K). Shared by keep and bias.
  const uint8_t* pair_keep = nullptr;
  const float* pair_bias = nullptr;
  int64_t pair_stride_b = 0, pair_stride_h = 0;
  Causal causal = Causal::None;
  // A sliding window (FlashAttention's window_size), aligned to the bottom
  // right as its causal is: query i sees key j iff
  //   i + K - Q - window_left <= j <= i + K - Q + window_right,
  // -1 leaving that side unbounded (>= -1, kernels/validate.h). It
  // intersects causal and the other masks; (-1, 0) is BottomRight causal.
  int64_t window_left = -1, window_right = -1;
  MaskFill fill = MaskFill::Seed;
  // A row is fully masked when no key takes part, or when every score of
  // the row is -inf (kept keys scoring -inf and no masked key holding the
  // d2l chapter's finite fill); it then gets this policy instead of a softmax.
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

  float fill_value() const { return fill == MaskFill::Seed ? kMaskFill : -__builtin_inff(); }
  // The keys query i (of Q, among K keys) may see: [first_key, last_key].
  // Every kernel masks a key outside it exactly as a key past the causal
  // limit (the fill, or dropped under -inf); the fused kernels skip key
  // tiles wholly outside it, so a narrow range costs little whatever K is.
  // first_key may be below 0 (from the first key) and above last_key (none).
  // (A side of at least K (left) or Q (right) bounds nothing: compared
  // first, so that no sum overflows.)
  int64_t first_key(int64_t i, int64_t Q, int64_t K) const {
    return window_left >= 0 && window_left < K ? i + K - Q - window_left : 0;
  }
  int64_t last_key(int64_t i, int64_t Q, int64_t K) const {
    const int64_t last = causal_last_key(i, Q, K);
    if (window_right < 0 || window_right >= Q) return last;
    return i + K - Q + window_right < last ? i + K - Q + window_right : last;
  }
  // Whether first_key or last_key bound any query's keys.
  bool bounds_keys() const { return causal != Causal::None || window_left >= 0 || window_right >= 0; }
  // The last key query i of Q may see among K under `causal` alone (K-1: all).
  int64_t causal_last_key(int64_t i, int64_t Q, int64_t K) const {
    switch (causal) {
      case Causal::None: return K - 1;
      case Causal::TopLeft: return i;
      case Causal::BottomRight: return i + K - Q;
    }
    return K - 1;
  }
  // Row b's key_keep / key_bias over its K keys, or null.
  const uint8_t* keep_row(int64_t b, int64_t K) const {
    return key_keep ? key_keep + b * (key_stride_b ? key_stride_b : K) : nullptr;
  }
  const float* bias_row(int64_t b, int64_t K) const {
    return key_bias ? key_bias + b * (key_stride_b ? key_stride_b : K) : nullptr;
  }
  bool has_key_mask() const { return key_keep != nullptr || key_bias != nullptr; }
  // Offset of (b, h, i, key 0) in pair_keep / pair_bias.
  int64_t pair_offset(int64_t b, int64_t h, int64_t i, int64_t K) const {
    return b * pair_stride_b + h * pair_stride_h + i * K;
  }
};

struct AttentionForward {
  TensorView q, k, v;   // [B,h,Q,d], [B,hkv,K,d], [B,hkv,K,dv] (hkv = h: the d2l chapter)
  TensorView out;       // [B,h,Q,dv], may be a view into a (B, Q, h*d) buffer
  // Optional [B,h,Q,K] contiguous: the softmax weights before dropout.
  float* weights = nullptr;
  // Optional: where the fused kernel writes its softmax statistics
  // (kernels/softmax_stats.h). Only the fused kernel writes them, so
  // kernels::attention_forward returns them when it did and an empty
  // SoftmaxStats otherwise: what a backward may then be given.
  SoftmaxStats stats;
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;  // [B] or [B,Q]
  float scale_divisor = 1.0f;   // sqrt(d), applied as the chapter does: scores / sqrt(d)
  Dropout dropout;

  MaskOptions masks;  // beyond the chapter (all off by default)

  // [B] or null: batch rows whose every key the fused kernel must read,
  // masked or not, because some value row past the lengths is not finite:
  // the chapter multiplies it by weight 0, and 0 * NaN reaches the row's
  // outputs. All their k and v rows must be valid. (The other kernels read
  // every row anyway.)
  const uint8_t* read_all_keys = nullptr;

  // BFloat16: q, k and v hold bfloat16 values (the engine rounds the
  // projections, mha/precision.h), so a kernel may form q k^T on bfloat16
  // units (the Blas kernel does) with the same result as in float32 but for
  // the order of the float32 sums. The fused forward on AMX
  // (cpu/fused/attention_amx.h) also forms P v there, P split into two
  // bfloat16 parts (2^-16 relative). The weights, their statistics and the
  // backward's gradients stay float32.
  Precision precision = Precision::Float32;

  int64_t B() const { return q.shape[0]; }
  int64_t H() const { return q.shape[1]; }
  int64_t Q() const { return q.shape[2]; }
  int64_t K() const { return k.shape[2]; }
  int64_t d() const { return q.shape[3]; }
  int64_t dv() const { return v.shape[3]; }  // value width (= d inside the module)
  int64_t Hkv() const { return k.shape[1]; }   // kv heads, dividing H()
  int64_t kv_head(int64_t h) const { return h / (H() / Hkv()); }
  // The length seen by query i of batch row b; +inf when unmasked.
  float length(int64_t b, int64_t i) const {
    switch (length_kind) {
      case LengthKind::None: return __builtin_inff();
      case LengthKind::PerBatch: return lens[b];
      case LengthKind::PerQuery: return lens[b * Q() + i];
    }
    return __builtin_inff();
  }
};

// n[b*Q + q] = #{k < K : float(k) < length(b, q)}: how many keys query q of
// row b sees (K when unmasked). K must be at most 2^24.
std::vector<int32_t> valid_key_counts(LengthKind kind, const float* lens, int64_t B, int64_t Q,
                                      int64_t K);

}  // namespace mha::kernels
