// src/kernels/attention_backward.h: the interface every attention backward takes.
//
// The gradient of the forward in attention_params.h with respect to its three
// inputs, given the gradient of its output:
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] grad_out:[B,h,Q,dv]
//     -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
//
// (hkv = h: the seed; with grouped heads, hkv dividing h, query head h reads
// kv head h / (h / hkv), and grad_k, grad_v sum over the query heads of each
// kv head.)
//
// With S = mask(q k^T / sqrt(d)), P = softmax(S) per row, M the dropout
// multipliers (0 or 1/(1-p); all 1 without dropout) and out = (P*M) v:
//
//   grad_v = (P*M)^T grad_out
//   dP     = (grad_out v^T) * M
//   dS     = P * (dP - rowsum(dP * P))   on unmasked entries, 0 on masked ones
//   grad_q = dS k / sqrt(d),  grad_k = dS^T q / sqrt(d)
//
// A masked score was *replaced* by -1e6 (the seed's masked_softmax assigns
// it), so no gradient flows through it: its dS is exactly 0. A masked key
// whose weight underflowed to 0 in every row therefore gets exactly zero
// grad_k and grad_v.
//
// `masks` carries the forward's MaskOptions (kernels/attention_params.h):
// dS is 0 on every pair that does not take part, and on every fully masked
// row (its weights are the policy's constant, not a function of the scores),
// so such a row passes gradient to v alone (uniform) or nowhere (zeros), and
// never NaN. kernels/attention_backward_masked.h writes the formulas out.
// Which kernel honours which option: kernels/features.h.
//
// The dropout mask is not stored: `dropout` carries the forward call's key and
// the kernel recomputes each multiplier from it (kernels/dropout.h).
//
// Outputs are overwritten, not accumulated; the module accumulates parameter
// gradients itself. Every view's innermost dimension is contiguous.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/dropout.h"
#include "mha/tensor.h"

namespace mha::kernels {

struct AttentionBackward {
  // What the forward was called with.
  TensorView q, k, v;   // [B,h,Q,d], [B,hkv,K,d], [B,hkv,K,dv] (hkv = h: the seed)
  TensorView grad_out;  // [B,h,Q,dv]: dL/d(out), may be a view into a (B, Q, h*dv) buffer
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;  // [B] or [B,Q]
  float scale_divisor = 1.0f;   // sqrt(d), as in the forward
  Dropout dropout;              // the forward call's p and key
  MaskOptions masks;            // the forward call's (all off by default: the seed)

  // Optional saves of the forward; a kernel uses those it can and recomputes
  // the rest from q and k. Null (or a view with data == nullptr) when absent.
  const float* weights = nullptr;  // [B,h,Q,K] contiguous softmax weights, before dropout
  TensorView out;                  // [B,h,Q,dv] the forward's output (gives rowsum(dP * P))
  const float* lse = nullptr;      // [B,h,Q] contiguous log-sum-exp of each masked, scaled score row
                                   // (not read when a mask option is set: fully masked rows have none)

  // Outputs, overwritten.
  TensorView grad_q, grad_k, grad_v;  // [B,h,Q,d], [B,hkv,K,d], [B,hkv,K,dv]

  int64_t B() const { return q.shape[0]; }
  int64_t H() const { return q.shape[1]; }
  int64_t Q() const { return q.shape[2]; }
  int64_t K() const { return k.shape[2]; }
  int64_t d() const { return q.shape[3]; }
  int64_t dv() const { return v.shape[3]; }
  int64_t Hkv() const { return k.shape[1]; }  // kv heads, dividing H()
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

// Plain loops in double, recomputing everything from q, k and v (it ignores
// the optional saves): the yardstick for the others.
void attention_backward_reference(const AttentionBackward& p);
// Per (batch row, head): the (Q, K) weights (saved or recomputed) and four
// BLAS products.
void attention_backward_blas(const AttentionBackward& p);

}  // namespace mha::kernels
