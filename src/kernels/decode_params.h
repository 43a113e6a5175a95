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
// of the Qn queries over those K keys, with, when `causal` is set, the
// chapter's valid lengths per query (shape (B, Q)): query i keeps keys
// j < K - Qn + i + 1 (itself and everything before it) and the others get
// the chapter's -1e6 score, so a query whose valid length is <= 0 gets
// uniform weights over the row's K keys, as masked_softmax gives. Without
// `causal` every query sees all K keys.
//   lengths[b] = 0: row b has no keys at all (an idle slot of a ragged
// batch); the chapter's softmax over an empty axis is undefined, and its
// output is 0 here (nothing is read). With `causal`, a row with keys must
// hold the new block: lengths[b] >= Qn (checked).
//
// Grouped heads: query head h reads cache head h / (Hq / Hkv).
// Storage: the cache is float32 or bfloat16 (the upper 16 bits of a float32,
// rounded to nearest even by to_bf16); the math is float32 either way.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/fused/isa.h"
#include "cpu/fused/limits.h"

namespace mha::kernels {

enum class CacheDtype { F32, BF16 };

// A float32 rounded to bfloat16 (nearest, ties to even); NaN stays NaN.
inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
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
  bool causal = true;          // causal within the new block of Qn queries
  float scale_divisor = 1.0f;  // sqrt(d): scores are (q . k) / scale_divisor

  int64_t group() const { return Hq / Hkv; }  // query heads per cache head
  // The chapter's valid length of query i in a row of K keys.
  int64_t valid_len(int64_t K, int64_t i) const { return causal ? K - Qn + i + 1 : K; }

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

// Keys per chunk: at least kDecodeMinChunk, and large enough that a call
// makes at most about kDecodeMaxChunks chunks (bounding the partials'
// memory); a multiple of kDecodeTile.
inline constexpr int64_t kDecodeTile = 32;
inline constexpr int64_t kDecodeMinChunk = 512;
inline constexpr int64_t kDecodeMaxChunks = 512;
int64_t decode_chunk_keys(const DecodeParams& p);

// Bytes of working memory decode_attention allocates for p (partials and
// per-thread scratch at `threads` threads).
int64_t decode_working_bytes(const DecodeParams& p, int threads);

}  // namespace mha::kernels
