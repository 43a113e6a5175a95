// src/cpu/decode/decode.h: the decode kernel, for cached calls
// (kernels/params.h, DecodeParams): a few new queries over many cached keys,
// the key axis split into chunks run on mha's threads and merged in a fixed
// order; and the same call on the fused kernel, for long prefills.
//
// Modules reach both through kernels::decode_forward (kernels/dispatch.h),
// which chooses; tests and `mha bench` call them here by name.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "cpu/fused/isa.h"
#include "cpu/fused/limits.h"
#include "kernels/params.h"

namespace mha::kernels {

// The fast kernel: the key axis of each (batch row, cache head) split into
// chunks of decode_chunk_keys(p) keys, each chunk one task on the OpenMP
// threads computing all Hq/Hkv x Qn query rows sharing that cache head (so
// each cache row is read once per step), vectorised over the head
// dimension; the chunks' partial results (running max, sum, weighted values)
// merged in chunk order. The chunking depends on the shapes and lengths only,
// so the output is bitwise the same at any thread count. Validates p.
// Uses the instruction set `isa` (default: the fused kernel's, fused_isa()),
// which the CPU must support.
void decode_attention(const DecodeParams& p);
void decode_attention(const DecodeParams& p, FusedIsa isa);

// The same attention on the fused attention kernel (cpu/decode/decode_fused.cpp):
// one call per batch row (for a bfloat16 cache, per batch of cache heads
// widened to float32), faster than decode_attention for long prefills (many new
// queries; kernels::decode_forward chooses). Within 1e-6 of it (both round
// in float32, in different orders). Validates p. Rows need K <= kFusedMaxKeys.
void decode_attention_fused(const DecodeParams& p);
// Bytes decode_attention_fused allocates besides the fused kernel's scratch:
// the widened bfloat16 cache heads of one fused call (at most 64 MiB, or one
// head when a head is larger), 0 for float32 caches.
int64_t decode_fused_working_bytes(const DecodeParams& p);

// The decode kernels' choice for a flat call (kernels::decode_forward
// makes p from a cached AttentionForward and calls these): the fused kernel
// for a prefill of at least decode_fused_min_queries(p.dtype) new queries
// over rows of at most kFusedMaxKeys keys, the decode kernel otherwise.
bool decode_runs_fused(const DecodeParams& p);
void decode_forward(const DecodeParams& p);

// kernels::decode_forward runs decode_attention_fused for calls of at least
// this many new queries (and rows of at most kFusedMaxKeys keys), the decode
// kernel below. Measured with `mha bench --prefill --quick --threads 1`
// (32 query heads of 128 over 32 or 8 cache heads, Qn new queries over K0
// cached keys, one batch row; fused ms / decode ms; the machine's 2 cores
// shared, load average about 7, so single ratios move by +-30%):
//              Qn:    4     8    16    32    64   128   256
//   f32  32/32 K0 0  0.78  1.36  0.73  0.65  0.11  0.24  0.29
//   f32  32/32 4096  1.72  1.62  1.05  0.54  0.59  0.41  0.37
//   f32  32/8  K0 0  3.10  1.60  1.06  0.68  0.15  0.47  0.24
//   f32  32/8  4096  2.66  1.35  0.77  0.56  0.38  0.38  0.32
//   bf16 32/32 K0 0  3.49  2.47  1.38  0.70  0.17  0.34  0.39
//   bf16 32/32 4096  9.81  4.19  2.67  1.32  1.10  0.70  0.39
//   bf16 32/8  K0 0  2.81  2.06  1.28  0.83  0.23  0.26  0.24
//   bf16 32/8  4096  4.49  1.88  1.18  0.71  0.39  0.38  0.38
// float32 caches: the fused kernel wins from 32 queries on. bfloat16 ones
// pay for widening the row's cache to float32 first (the fused kernel reads
// float32), which a long cache makes worth it only from 128 queries on.
inline constexpr int64_t kDecodeFusedMinQueries = 32;
inline constexpr int64_t kDecodeFusedMinQueriesBf16 = 128;
inline int64_t decode_fused_min_queries(CacheDtype dtype) {
  return dtype == CacheDtype::BF16 ? kDecodeFusedMinQueriesBf16 : kDecodeFusedMinQueries;
}

// Keys per chunk: at least kDecodeMinChunk, and large enough that a call
// makes at most about kDecodeMaxChunks chunks (bounding the partials'
// memory); a multiple of kDecodeTile (kernels/params.h). A call that sets
// p.chunk_keys gets that.
inline constexpr int64_t kDecodeMinChunk = 512;
inline constexpr int64_t kDecodeMaxChunks = 512;
int64_t decode_chunk_keys(const DecodeParams& p);

// Bytes of working memory decode_attention allocates for p besides the
// cache and the output: the chunks' partials (at most about
// kDecodeMaxChunks + B*Hkv chunks of group*Qn rows of dv + 2 floats,
// whatever the cache length), per-thread scratch at `threads` threads
// (group*Qn rows of d + kDecodeTile + dv + 2 floats each) and the task list.
int64_t decode_working_bytes(const DecodeParams& p, int threads);

}  // namespace mha::kernels
