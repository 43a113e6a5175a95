// src/kernels/attention_params.h: the one interface every attention kernel takes.
//
// A plain struct of strided views, shapes and options. The module validates
// its inputs once, then fills this struct; kernels assume it is valid (the
// innermost dimension of every view is contiguous, shapes agree).
//
//   q:[B,h,Q,d] k:[B,h,K,d] v:[B,h,K,dv] -> out:[B,h,Q,dv]   (+ weights:[B,h,Q,K])
//
// Scores are (q . k) / sqrt(d); key k of query q in row b is masked when
// float(k) >= length(b, q) and its score then becomes -1e6, the seed's fill,
// so a row with every key masked gets uniform weights 1/K.
#pragma once

#include <cstdint>

#include "kernels/dropout.h"
#include "mha/tensor.h"

namespace mha::kernels {

enum class LengthKind { None, PerBatch, PerQuery };

// The seed's masked_softmax replaces masked scores by this value.
inline constexpr float kMaskFill = -1e6f;

struct AttentionForward {
  TensorView q, k, v;   // [B,h,Q,d], [B,h,K,d], [B,h,K,dv]
  TensorView out;       // [B,h,Q,dv], may be a view into a (B, Q, h*d) buffer
  // Optional [B,h,Q,K] contiguous: the softmax weights before dropout.
  float* weights = nullptr;
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;  // [B] or [B,Q]
  float scale_divisor = 1.0f;   // sqrt(d), applied as the seed does: scores / sqrt(d)
  Dropout dropout;

  int64_t B() const { return q.shape[0]; }
  int64_t H() const { return q.shape[1]; }
  int64_t Q() const { return q.shape[2]; }
  int64_t K() const { return k.shape[2]; }
  int64_t d() const { return q.shape[3]; }
  int64_t dv() const { return v.shape[3]; }  // value width (= d inside the module)
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
