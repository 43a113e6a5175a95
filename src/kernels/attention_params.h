// src/kernels/attention_params.h: the one interface every attention kernel takes.
//
// A plain struct of strided views, shapes and options. The module validates
// its inputs once, then fills this struct; kernels assume it is valid (the
// innermost dimension of every view is contiguous, shapes agree).
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv]   (+ weights:[B,h,Q,K])
//
// Scores are (q . k) / sqrt(d); key k of query q in row b is masked when
// float(k) >= length(b, q) and its score then becomes -1e6, the seed's fill,
// so a row with every key masked gets uniform weights 1/K.
//
// Options beyond the seed (all additive; their defaults are the seed's
// behaviour, so a kernel that ignores them is right whenever they are unset;
// kernels/features.h tells which kernel honours which; docs/masks.md has the
// table of fields):
// - grouped heads: k and v may have Hkv = k.shape[1] heads, Hkv dividing H;
//   query head h reads kv head h / (H / Hkv) (Hkv = 1: multi-query);
// - in `masks` (MaskOptions): boolean masks (1 = the key takes part) and
//   additive masks per key [B,K] or per (query, key) pair, causal masking,
//   the fill of masked scores (the seed's -1e6, or -inf: the key drops out)
//   and the policy for rows in which no key is live (uniform or zeros).
#pragma once

#include <cstdint>

#include "kernels/dropout.h"
#include "mha/masks.h"
#include "mha/tensor.h"

namespace mha::kernels {

enum class LengthKind { None, PerBatch, PerQuery };

// The seed's masked_softmax replaces masked scores by this value.
inline constexpr float kMaskFill = -1e6f;

// What a masked score becomes before the softmax.
enum class MaskFill {
  Seed,    // -1e6, as masked_softmax: the seed's API
  NegInf,  // -inf: the key drops out (PyTorch's nn.MultiheadAttention)
};

// The masks beyond valid_lens, for key j of query i in batch row b, head h.
// One struct so that the forward and backward parameter structs carry the
// same thing. The defaults are the seed's behaviour (no mask, -1e6, uniform).
struct MaskOptions {
  // Boolean masks read 1 = takes part; additive masks add to the scaled score.
  const uint8_t* key_keep = nullptr;   // [B,K] contiguous
  const float* key_bias = nullptr;     // [B,K] contiguous
  // Per (query, key) pair: element b*pair_stride_b + h*pair_stride_h + i*K + j
  // (stride 0 broadcasts: a (Q,K) mask has both 0, a (B*h,Q,K) one has
  // pair_stride_h = Q*K, pair_stride_b = H*Q*K). Shared by keep and bias.
  const uint8_t* pair_keep = nullptr;
  const float* pair_bias = nullptr;
  int64_t pair_stride_b = 0, pair_stride_h = 0;
  Causal causal = Causal::None;
  MaskFill fill = MaskFill::Seed;
  // A row is fully masked when no key takes part, or when every score of
  // the row is -inf (kept keys scoring -inf and no masked key holding the
  // seed's finite fill); it then gets this policy instead of a softmax.
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

  float fill_value() const { return fill == MaskFill::Seed ? kMaskFill : -__builtin_inff(); }
  // The last key query i of Q may see among K under `causal` (K-1: all).
  int64_t causal_last_key(int64_t i, int64_t Q, int64_t K) const {
    switch (causal) {
      case Causal::None: return K - 1;
      case Causal::TopLeft: return i;
      case Causal::BottomRight: return i + K - Q;
    }
    return K - 1;
  }
  // Offset of (b, h, i, key 0) in pair_keep / pair_bias.
  int64_t pair_offset(int64_t b, int64_t h, int64_t i, int64_t K) const {
    return b * pair_stride_b + h * pair_stride_h + i * K;
  }
};

struct AttentionForward {
  TensorView q, k, v;   // [B,h,Q,d], [B,hkv,K,d], [B,hkv,K,dv] (hkv = h: the seed)
  TensorView out;       // [B,h,Q,dv], may be a view into a (B, Q, h*d) buffer
  // Optional [B,h,Q,K] contiguous: the softmax weights before dropout.
  float* weights = nullptr;
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;  // [B] or [B,Q]
  float scale_divisor = 1.0f;   // sqrt(d), applied as the seed does: scores / sqrt(d)
  Dropout dropout;

  MaskOptions masks;  // beyond the seed (all off by default)

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

// Plain loops, written to be obviously right; the tests hold the others to it.
void attention_forward_reference(const AttentionForward& p);
// Materialises each head's (Q, K) scores with BLAS products.
void attention_forward_blas(const AttentionForward& p);

}  // namespace mha::kernels
