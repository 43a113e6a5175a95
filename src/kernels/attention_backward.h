// src/kernels/attention_backward.h: the interface every attention backward takes.
//
// The gradient of the forward in attention_params.h with respect to its three
// inputs, given the gradient of its output:
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] grad_out:[B,h,Q,dv]
//     -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
//
// (hkv = h: the d2l chapter; with grouped heads, hkv dividing h, query head h reads
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
// A masked score was *replaced* by -1e6 (the d2l chapter's masked_softmax assigns
// it), so no gradient flows through it: its dS is exactly 0. A masked key
// whose weight underflowed to 0 in every row therefore gets exactly zero
// grad_k and grad_v.
//
// `fwd.masks` carries the forward's MaskOptions (kernels/attention_params.h):
// dS is 0 on every pair that does not take part, and on every fully masked
// row (its weights are the policy's constant, not a function of the scores),
// so such a row passes gradient to v alone (uniform) or nowhere (zeros), and
// never NaN. kernels/attention_backward_masked.h writes the formulas out.
//
// The dropout mask is not stored: `fwd.dropout` carries the forward call's key and
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
  // The forward call being differentiated, as it was made: q, k, v, lengths,
  // scale, dropout (p and key), masks, and its results, now read-only inputs:
  //   fwd.out     [B,h,Q,dv] the forward's output (gives rowsum(dP * P));
  //               the fused backward needs it
  //   fwd.weights [B,h,Q,K] or null: the saved weights before dropout (the
  //               BLAS backward uses them instead of recomputing)
  //   fwd.stats   the statistics kernels::attention_forward returned, or
  //               empty: given, the fused backward runs from them
  // The reference backward recomputes everything from q, k and v.
  AttentionForward fwd;
  TensorView grad_out;  // [B,h,Q,dv]: dL/d(out), may be a view into a (B, Q, h*dv) buffer

  // Outputs, overwritten.
  TensorView grad_q, grad_k, grad_v;  // [B,h,Q,d], [B,hkv,K,d], [B,hkv,K,dv]

  // fwd.stats (and fwd.out) are those of a softmax over more keys than this
  // call's: one key block of several, merged by kernels/softmax_merge.h (the
  // ring over ranks). The gradients are then this block's share of the
  // whole softmax's; a row's single live key here need not carry weight 1.
  bool stats_span_more_keys = false;

  // The forward's shapes (methods, not copies).
  int64_t B() const { return fwd.B(); }
  int64_t H() const { return fwd.H(); }
  int64_t Q() const { return fwd.Q(); }
  int64_t K() const { return fwd.K(); }
  int64_t d() const { return fwd.d(); }
  int64_t dv() const { return fwd.dv(); }
  int64_t Hkv() const { return fwd.Hkv(); }
  int64_t kv_head(int64_t h) const { return fwd.kv_head(h); }
  float length(int64_t b, int64_t i) const { return fwd.length(b, i); }
};

}  // namespace mha::kernels
