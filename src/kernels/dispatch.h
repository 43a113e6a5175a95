// src/kernels/dispatch.h: the only way into the attention kernels.
//
// A module fills a parameter struct (kernels/params.h) and calls one of
// the functions below with the kernel its user chose. Each decides in one place
// which code runs: the fused kernel takes key axes up to its limit (longer
// ones run the BLAS kernel), saves softmax statistics when asked, and its
// backward runs iff the statistics are given. Each checks its struct first,
// in every build (kernels/validate.h), and throws mha::Error naming the
// problem.
#pragma once

#include <cstdint>

#include "kernels/params.h"
#include "mha/kernel.h"
#include "mha/valid_lens.h"

namespace mha::kernels {

// Whether attention_forward(kernel, p) with p.K() == keys runs the fused
// kernel: the one that saves statistics when p.stats asks, and that reads key
// and value rows only up to each batch row's last live key (plus the rows
// p.read_all_keys flags). A module that skips projecting the other rows
// (nn/row_plan.h), or plans memory for statistics instead of weights, asks
// this first.
bool runs_fused(AttentionKernel kernel, int64_t keys);

// q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv] (+ p.weights
// [B,h,Q,K]). A fused call in bfloat16 mode (p.precision) without dropout
// runs its products on AMX tiles where they are usable and the AVX-512
// kernel is selected (cpu/fused/attention_amx.h), with the same statistics. Returns p.stats when the kernel wrote the statistics there,
// else an empty SoftmaxStats (p.stats unset, or a kernel other than the
// fused one ran): exactly what the backward and attention_weights may be
// given later, so a module keeps the result, not p.stats.
[[nodiscard]] SoftmaxStats attention_forward(AttentionKernel kernel, const AttentionForward& p);

// grad_out:[B,h,Q,dv] -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv].
// With p.fwd.stats given (what attention_forward returned) the fused
// backward runs from them, whatever `kernel`; without, the Reference kernel
// runs its own backward and the others the BLAS one (all kernels compute the
// same function, so any backward differentiates any forward).
void attention_backward(AttentionKernel kernel, const AttentionBackward& p);

// out:[rows, heads, Q, K] <- the weights of the requested (batch row, head)
// pairs, from the statistics in p.fwd.stats (required).
void attention_weights(const AttentionWeightsParams& p);

// A cached call: p.cache set (kernels/params.h, KeyCache),
// q:[B,Hq,Qn,d] over the cache k:[B,Hkv,capacity,d] v:[B,Hkv,capacity,dv]
// with cache.lengths:[B] -> out:[B,Hq,Qn,dv]: the decode kernel at the
// fused kernel's instruction set, or, for long prefills (decode_runs_fused),
// the fused kernel on the cache, whatever AttentionKernel a module has
// chosen (the others have no cached form). Checks p first (decode_params,
// every build; `op` names the caller in its errors). The modules' cached
// calls (nn/cached_attention.h) come this way.
void decode_forward(const AttentionForward& p, const char* op = "kernels::decode_forward");
// Whether decode_forward(p) runs the fused kernel (decode_attention_fused):
// a prefill of at least decode_fused_min_queries(p.cache.dtype) new queries
// over rows of at most kFusedMaxKeys keys. Reads shapes and lengths only.
bool decode_runs_fused(const AttentionForward& p);
// Bytes of working memory decode_forward(p) allocates at `threads` threads
// (for the kernel it chooses). Reads the views' shapes and strides, the
// cache's lengths and dtype only: the pointers may be unset.
int64_t decode_forward_working_bytes(const AttentionForward& p, int threads);

// Fills p.length_kind / p.lens from a validated ValidLens.
inline void set_lengths(AttentionForward& p, const ValidLens& lens) {
  switch (lens.kind()) {
    case ValidLens::Kind::None: p.length_kind = LengthKind::None; break;
    case ValidLens::Kind::PerBatch: p.length_kind = LengthKind::PerBatch; break;
    case ValidLens::Kind::PerQuery: p.length_kind = LengthKind::PerQuery; break;
  }
  p.lens = lens.data();
}

}  // namespace mha::kernels
