// src/cpu/reference/attention_backward_masked.h: the gradient of the forward with
// every MaskOptions field and grouped heads, as a plain reference.
//
//   fwd.q:[B,h,Q,d] fwd.k:[B,hkv,K,d] fwd.v:[B,hkv,K,dv] grad_out:[B,h,Q,dv]
//     -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
//
// `fwd` is the forward call's parameter struct (q, k, v, lengths, scale,
// dropout key, masks); its out and weights are not read. With P the weights,
// M the dropout multipliers and dO = grad_out, per (b, h), kv head hk:
//
//   grad_v[hk] += (P*M)^T dO        (summed over the query heads of hk)
//   dP          = (dO v[hk]^T) * M
//   dS          = P * (dP - rowsum(dP * P)) / sqrt(d) on pairs that take part,
//                 times 1 - tanh^2(q.k / sqrt(d) / softcap) with a softcap,
//                 0 on masked pairs (their score was *replaced* by the fill)
//                 and 0 on fully masked rows (their weights are a constant)
//   grad_sinks[h] = -sum_{b,i} exp(sink_h - logsumexp_i) * rowsum(dP * P)
//                 (with fwd.masks.sinks; grad_sinks:[h] then required)
//   grad_q      = dS k[hk],   grad_k[hk] += dS^T q
//
// So a fully masked row passes gradient only to v (uniform: 1/K each; zeros:
// none), and never NaN. attention_backward_reference (AttentionBackward)
// runs this whenever the call uses a mask option or grouped heads.
#pragma once

#include "kernels/params.h"
#include "mha/tensor.h"

namespace mha::kernels {

// Plain loops in double; outputs are overwritten.
void attention_backward_masked_reference(const AttentionForward& fwd, const TensorView& grad_out,
                                         const TensorView& grad_q, const TensorView& grad_k,
                                         const TensorView& grad_v, float* grad_sinks = nullptr);

}  // namespace mha::kernels
