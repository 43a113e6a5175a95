// src/cpu/reference/reference.h: the plain attention kernels, written to be
// obviously right; the tests hold every fast kernel to them.
//
// Modules reach them through kernels::attention_forward / attention_backward
// / decode_forward (kernels/dispatch.h) with AttentionKernel::Reference;
// tests call them here by name.
#pragma once

#include "kernels/params.h"

namespace mha::kernels {

// Plain loops.
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv] (+ weights:[B,h,Q,K])
// Ignores p.stats and p.read_all_keys (it reads every row).
void attention_forward_reference(const AttentionForward& p);

// Plain loops in double, recomputing everything from q, k and v (it ignores
// the forward's saves): the yardstick for the others.
//   grad_out:[B,h,Q,dv] -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
void attention_backward_reference(const AttentionBackward& p);

// A cached call (kernels/params.h, KeyCache) in plain loops in double.
//   q:[B,Hq,Qn,d] over k:[B,Hkv,capacity,d] v:[B,Hkv,capacity,dv] -> out:[B,Hq,Qn,dv]
void decode_attention_reference(const DecodeParams& p);

}  // namespace mha::kernels
