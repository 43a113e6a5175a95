// src/cpu/blas/attention_blas.h: attention on BLAS products, one (batch row,
// head) at a time, materialising its (Q, K) scores: the kernel for key axes
// past the fused kernel's limit, and AttentionKernel::Blas.
//
// Modules reach it through kernels::attention_forward / attention_backward
// (kernels/dispatch.h); tests call it here by name.
#pragma once

#include "kernels/params.h"

namespace mha::kernels {

// q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv] (+ weights:[B,h,Q,K])
void attention_forward_blas(const AttentionForward& p);
// Per (batch row, head): the (Q, K) weights (p.fwd.weights, or recomputed)
// and four BLAS products.
//   grad_out:[B,h,Q,dv] -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
void attention_backward_blas(const AttentionBackward& p);

}  // namespace mha::kernels
