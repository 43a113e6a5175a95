// src/cpu/fused/attention_amx.h: the fused forward's chunk on AMX tiles, for
// bfloat16 mode (mha/precision.h).
//
// Why it exists: in bfloat16 mode the four projections run on AMX, but at
// B1 L4096 D512 h8 (head dim 64) attention is ~80% of the flops, and on the
// float32 AVX-512 fused kernel the module was only 1.13x its float32 self.
// Here the two products of each (query tile, key tile), S^T = k q^T and
// O^T += v^T P^T, run on tdpbf16ps; the online softmax between them stays
// the fused kernel's (kernel_impl.h), in float32 on AVX-512: the same
// masking, the same statistics (kernels/params.h), so the fused
// backward and attention_weights read them as the float32 forward's.
//
// Numbers: q, k and v hold bfloat16 values in bfloat16 mode (the engine
// rounds the projections), so rounding them for the tiles is exact, and the
// products sum in float32. The weights P (float32 from the softmax) are
// split into two bfloat16 parts, P = hi + lo (hi = P truncated to bfloat16,
// lo = bf16(P - hi)), each multiplied by v: P is then carried to 2^-16
// relative, against 2^-9 if rounded once (attention_amx.cpp, kSplitWeights,
// says what was measured). So the output differs from the reference on the
// same rounded inputs by 6.8e-6 of its scale at most over the tests' cases
// (tests/cpp/kernels/test_attention_amx.cpp holds it to 2e-5).
//
// Chunks are the fused forward's job (fused_job.h, ForwardJob) over query
// tiles of kAmxQueryTile; the tiling depends on the shapes only and each
// chunk runs on one thread, so the result is bitwise the same at any thread
// count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/fused/fused_job.h"
#include "kernels/params.h"

namespace mha::kernels::fused {

// Queries per chunk of the AMX forward (two 16-query tiles).
inline constexpr int64_t kAmxQueryTile = 32;

// Whether the fused forward runs p's chunks on AMX: p.precision is
// BFloat16, cpu::amx_usable(), and no dropout (training with dropout keeps
// the float32 kernel). Every mask option, grouped heads and any head width
// are supported. The caller also requires the AVX-512 fused kernel to be the
// one selected (tests that force another instruction set get that one).
bool amx_forward_supports(const AttentionForward& p);

// Calls with fewer queries or keys than these run the float32 kernel even
// where amx_forward_supports: their tiles would be mostly padding.
inline constexpr int64_t kAmxMinQueries = 16;
inline constexpr int64_t kAmxMinKeys = 64;
// Whether p is large enough for the AMX forward to pay (p.Q() >=
// kAmxMinQueries and p.K() >= kAmxMinKeys; measured in attention_amx.cpp).
// Depends on the shapes alone, so results stay the same at any thread count.
bool amx_forward_pays(const AttentionForward& p);

// Per-thread scratch of the AMX forward, in floats, for head widths d, dv
// and `rows` packed key rows (ForwardJob::pack_rows); its first 64 bytes
// must be zero before a thread's first chunk (the packed-slice tag).
size_t amx_forward_scratch_floats(int64_t d, int64_t dv, int64_t rows);

// Chunk c of job (c = (b*H + h) * q_tiles + query tile, job.tiles of
// kAmxQueryTile): q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> its rows of
// out:[B,h,Q,dv] (+ row_max2, row_sum:[B,h,Q] when the job has them). Only
// when amx_forward_supports(*job.p).
void amx_forward_chunk(const ForwardJob& job, int64_t chunk, float* scratch);

}  // namespace mha::kernels::fused
