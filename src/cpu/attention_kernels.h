// src/cpu/attention_kernels.h: the unfused CPU attention kernels, by name.
//
// Modules reach them through kernels::attention_forward / attention_backward
// (kernels/dispatch.h); tests of one kernel call it here by name.
#pragma once

#include "kernels/attention_backward.h"
#include "kernels/attention_params.h"

namespace mha::kernels {

// Plain loops, written to be obviously right; the tests hold the others to it.
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv] (+ weights:[B,h,Q,K])
// Ignores p.stats and p.read_all_keys (it reads every row).
void attention_forward_reference(const AttentionForward& p);
// Materialises each head's (Q, K) scores with BLAS products; same shapes.
void attention_forward_blas(const AttentionForward& p);

// Plain loops in double, recomputing everything from q, k and v (it ignores
// the forward's saves): the yardstick for the others.
//   grad_out:[B,h,Q,dv] -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
void attention_backward_reference(const AttentionBackward& p);
// Per (batch row, head): the (Q, K) weights (p.fwd.weights, or recomputed)
// and four BLAS products; same shapes.
void attention_backward_blas(const AttentionBackward& p);

}  // namespace mha::kernels
