// src/kernels/decode_params.h: the decode kernel's interface: a few new
// queries attending over many cached keys (incremental decoding).
//
//   q:[B,Hq,Qn,d] k_cache:[B,Hkv,capacity,d] v_cache:[B,Hkv,capacity,dv]
//   lengths:[B] -> out:[B,Hq,Qn,dv]
//
// A plain struct of pointers and strides (in elements; the innermost axis of
// every view is contiguous), as kernels/attention_params.h.
//
// What a cached length means. lengths[b] is how many keys batch row b has:
// cache slots 0 .. lengths[b]-1, the Qn new keys (of the queries being
// decoded) already written as the last Qn of them. So the key axis of row b
// is K = lengths[b] long; slots from lengths[b] to capacity are unwritten
// storage, not keys, and are never read. That is the d2l chapter's attention
// of the Qn queries over those K keys, with, when `masks.causal` is set, the
// chapter's valid lengths per query (shape (B, Q)): query i keeps keys
// j < K - Qn + i + 1 (itself and everything before it) and the others get
// the chapter's -1e6 score, so a query whose valid length is <= 0 gets
// uniform weights over the row's K keys, as masked_softmax gives. Without
// causality every query sees all K keys.
//   lengths[b] = 0: row b has no keys at all (an idle slot of a ragged
// batch); the chapter's softmax over an empty axis is undefined, and its
// output is 0 here (nothing is read). When causal, a row with keys must
// hold the new block: lengths[b] >= Qn (checked).
//
// Masks beyond causality (both optional, both combine with it):
// - the chapter's valid lengths, (B,) or (B, Qn) (length_kind, lens): query
//   i of row b keeps keys j < min(lens, its causal limit); the others get
//   the -1e6 fill (kernels/attention_params.h, LengthKind; a fractional
//   length keeps the keys below it, as masked_softmax's arange < length);
// - nn.MultiheadAttention's key_padding_mask over each row's K keys
//   (masks.key_keep: 1 = takes part; masks.key_bias: added to the scaled
//   score), rows masks.key_stride_b apart. With fill NegInf a masked key drops out
//   (weight exactly 0) and a query whose every key is masked, or scores
//   -inf, gets `masks.fully_masked`: zeros, or uniform weights 1/K over the row's K
//   keys (the drop-in's policy, mha/masks.h).
//
// Grouped heads: query head h reads cache head h / (Hq / Hkv).
// Storage: the cache is float32 or bfloat16 (the upper 16 bits of a float32,
// rounded to nearest even by to_bf16); the math is float32 either way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/bf16.h"
#include "cpu/fused/isa.h"
#include "cpu/fused/limits.h"
#include "kernels/attention_params.h"
#include "mha/masks.h"

namespace mha::kernels {

enum class CacheDtype { F32, BF16 };

using cpu::from_bf16;
using cpu::to_bf16;

// The default masks of a cached call: causal within the new block.
inline MaskOptions causal_masks() {
  MaskOptions m;
  m.causal = Causal::BottomRight;
  return m;
}

struct DecodeParams {
  const float* q = nullptr;  // [B,Hq,Qn,d]
  int64_t q_stride_b = 0, q_stride_h = 0, q_stride_i = 0;
  // [B,Hkv,capacity,d] and [B,Hkv,capacity,dv], elements of `dtype`
  // (float or uint16_t bfloat16 bits); strides count elements.
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride_b = 0, k_stride_h = 0, k_stride_j = 0;
  int64_t v_stride_b = 0, v_stride_h = 0, v_stride_j = 0;
  CacheDtype dtype = CacheDtype::F32;
  float* out = nullptr;  // [B,Hq,Qn,dv]
  int64_t out_stride_b = 0, out_stride_h = 0, out_stride_i = 0;
  const int64_t* lengths = nullptr;  // [B], each in [0, capacity]
  int64_t B = 0, Hq = 0, Hkv = 0, Qn = 0, capacity = 0, d = 0, dv = 0;
  float scale_divisor = 1.0f;  // sqrt(d): scores are (q . k) / scale_divisor
  // The chapter's valid lengths: [B] (PerBatch) or [B, Qn] (PerQuery), each
  // a number >= 0 (+inf: no limit); null with LengthKind::None.
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;
  // The masks beyond the lengths: the one mask type of every kernel
  // (kernels/attention_params.h). A cached call reads: causal None or
  // BottomRight (the new block is the last Qn of each row's K keys, so
  // BottomRight is "causal within the new block"; the default); key_keep /
  // key_bias, nn.MultiheadAttention's key_padding_mask, [B, key_stride_b]
  // (key_stride_b >= every length), key j of row b at b * key_stride_b + j;
  // fill and fully_masked. Pair masks are not taken (checked).
  MaskOptions masks = causal_masks();

  int64_t group() const { return Hq / Hkv; }  // query heads per cache head
  // Query i's valid length in row b of K keys: keys j < valid_len(b, K, i)
  // take part (before key_keep / key_bias), the causal limit and the
  // chapter's length together.
  int64_t valid_len(int64_t b, int64_t K, int64_t i) const {
    int64_t n = std::min(K, masks.causal_last_key(i, Qn, K) + 1);
    if (length_kind == LengthKind::None) return n;
    const float len = lens[length_kind == LengthKind::PerBatch ? b : b * Qn + i];
    // #{j : float(j) < len}; exact for the capacities a cache can have (< 2^24 keys).
    if (len < static_cast<float>(n)) n = len <= 0.0f ? 0 : static_cast<int64_t>(std::ceil(len));
    return n;
  }
  bool causal() const { return masks.causal != Causal::None; }

  // Contiguous views of contiguous buffers (strides of a row-major layout).
  void set_contiguous_strides() {
    q_stride_i = d, q_stride_h = Qn * d, q_stride_b = Hq * Qn * d;
    k_stride_j = d, k_stride_h = capacity * d, k_stride_b = Hkv * capacity * d;
    v_stride_j = dv, v_stride_h = capacity * dv, v_stride_b = Hkv * capacity * dv;
    out_stride_i = dv, out_stride_h = Qn * dv, out_stride_b = Hq * Qn * dv;
  }
};

// Throws mha::Error naming `op`, the argument, the value seen and the value
// wanted, for any shape, stride, pointer or length the kernels cannot take.
void check_decode_params(const DecodeParams& p, const char* op);

// Plain loops in double, written to be obviously right (the tests' yardstick).
void decode_attention_reference(const DecodeParams& p);

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
// memory); a multiple of kDecodeTile.
inline constexpr int64_t kDecodeTile = 32;
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
