// src/cpu/gemm/gemm_amx.h: the bfloat16 product on AMX tiles (AMX-TILE +
// AMX-BF16): C:[M,N] = alpha sum_k bf16(op(A)[i,k]) bf16(op(B)[k,j]) + beta C
// (+ bias), sums in float32 (mha/precision.h, Precision::BFloat16).
//
// Why AMX: one tdpbf16ps multiplies a 16 x 32 bfloat16 tile by a 32 x 16 one
// into 16 x 16 float32 sums (16384 flops); a loop of them ran at ~760
// GFLOP/s on one thread of the Xeon (family 6 model 207) mha is measured on,
// against ~125 for the float32 AVX-512 product (gemm.h) and ~75 for a
// vdpbf16ps kernel.
//
// Measured (build/mha_bench_gemm_bf16 5, built by `cmake --build build
// --target mha_bench_gemm_bf16`; GemmBatch GFLOP/s, packing and rounding
// included, best of two runs of 5 samples; the 2-core machine was NOT idle:
// load 4-9 from another build throughout, so these are lower bounds):
//   M x N x K (op)          1 thread: AMX / bf16 portable / float32   2 threads: AMX / f32
//   4096 x 768 x 768 (A W^T)     451 / 109 / 120  (3.8x)               463 / 101
//   768 x 768 x 4096 (A^T G)     402 /  93 / 100  (4.0x)               170 /  90
//   4096 x 512 x 512 (A W^T)     523 /  86 /  97  (5.4x)               133 /  93
//   16384 x 256 x 256 (A W^T)    276 /  92 / 117  (2.4x)               134 /  77
//   512 x 512 x 64 (Q K^T)       384 / 123 / 144  (2.7x)                 2 /   3 *
//   512 x 64 x 512 (P V)         228 /  64 / 104  (2.2x)                 4 /   5 *
//   10 x 100 x 100 (the toy)      28 /  15 /  43  (0.65x)               38 /  51
//   1 x 768 x 768 (decode)       4.8 / 2.0 / 7.9 (0.61x)               5.3 / 8.1
//   8 x 2304 x 768 (decode QKV)   23 /  15 /  48  (0.48x)              3.5 / 3.8 *
// (* every path alike: the second thread waited for a core held by the
// other build; the 2-thread column is scheduler noise on this machine.)
// With op(B) already packed, one thread, best thread CPU time, the tiles
// ran at 555-771 GFLOP/s on the first four shapes (the loop's rate), 515 on
// Q K^T, 280 on P V (N = 64: rounding op(A), 512 x 512, per 2 column
// panels), 110 on the toy call. So the large products reach 2.2-5.4x the
// float32 product; what limits them is the rounding and packing of op(B)
// per call (768 x 768 B^T: ~240 us, bound by reading B; 768 x 4096 B:
// ~1.7 ms) and of op(A) per row block. Products of few rows lose to
// float32 (0.5-0.65x) because rounding all of B each call costs more than
// the product; still faster than the portable bfloat16 path, which
// GemmBatch therefore never takes where AMX is usable. (These rows were
// measured with op(B) packed whole; GemmBatch now takes gemm_amx_unpacked
// for up to 32 rows per weight, see parallel_gemm_bf16.cpp.) The next step
// for them: bfloat16 weights packed once per parameter version.
//
// Layout. op(B) is packed (PackedBf16B) into column panels of 32 (two tiles
// of 16 columns), K padded with zeros to a multiple of 32, each 32-deep step
// of a tile 16 rows of 16 column pairs (k, k+1) -- the "VNNI" order
// tdpbf16ps reads. op(A) rows are rounded per 32-row group into a
// thread-local buffer of 16 x 32 tiles, rows past M zero.
//
// Bits: each C tile accumulates all of K, in 32-deep steps from zero, in the
// same order wherever its rows lie, and a row of a tile never mixes with
// another row, so C[i,j] depends on the shapes, alpha, beta, bias and the
// inputs alone, never on the row block or thread (tested). Rounding to
// bfloat16 is core::to_bf16's (nearest, ties to even, denormals kept), but
// tdpbf16ps treats denormal inputs as zero and flushes denormal sums: values
// below 2^-126 count as zero, unlike the portable path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "cpu/gemm/gemm.h"

namespace mha::cpu {

// The CPU has AMX-TILE, AMX-BF16 and AVX-512F, the OS saves tile state
// (XCR0) and grants this process the tile data (ARCH_REQ_XCOMP_PERM, asked
// once per process), and no test has switched AMX off. Always false where
// mha is built without its x86 kernels.
bool amx_usable();
// Switches the AMX path off (false) or back on where usable (true), for
// tests. Not thread-safe against running products, like set_gemm_isa.
void set_amx_enabled(bool enabled);

// op(B):[K,N] rounded to bfloat16 in the tile layout above; read-only once
// packed, so one packing serves every row block on every thread.
class PackedBf16B {
 public:
  static constexpr int64_t kPanel = 32;  // columns per panel (two tiles)
  static constexpr int64_t kStep = 32;   // K per tile step
  // Room for op(B):[K,N]; pack() fills it panel range by panel range.
  PackedBf16B(int64_t K, int64_t N);
  int64_t panels() const { return (N_ + kPanel - 1) / kPanel; }
  int64_t steps() const { return (K_ + kStep - 1) / kStep; }
  // Panels [panel0, panel1) of op(B) = B^T (trans_b) or B, B's rows ldb
  // apart; with trans_b, `rows` (N pointers, or null) gives where each row
  // of B starts, in place of B + j * ldb (stacked weights), as PackedB::pack.
  void pack(bool trans_b, const float* B, int64_t ldb, int64_t panel0, int64_t panel1,
            const float* const* rows = nullptr);
  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  // Panel p: steps() x 2 tiles of 16 x 32 bfloat16 (1 KB each), step-major.
  const uint16_t* panel(int64_t p) const { return data_.get() + p * steps() * 2 * 512; }
  // Bytes held.
  int64_t bytes() const { return std::max<int64_t>(panels() * steps(), 1) * 2 * 512 * 2; }

 private:
  struct Free {
    void operator()(uint16_t* p) const;
  };
  int64_t K_, N_;
  std::unique_ptr<uint16_t[], Free> data_;
};

// C = alpha op(A) op(B) + beta C (+ bias) on the calling thread with AMX, B
// packed (g.B, g.ldb, g.trans_b are not read); b.K() == g.K, b.N() == g.N.
// Only when amx_usable().
void gemm_amx_packed(const GemmBlock& g, const PackedBf16B& b);

// Columns of panels [panel0, panel1) (32 columns each, to N) of products
// g[0..count) that share op(B) (B, ldb, trans_b, K, N; with trans_b, `rows`
// as in PackedBf16B::pack), on the calling thread, each B panel packed into
// a thread-local buffer just before the rows pass it (no PackedBf16B: for
// products of few rows, which would not reuse a whole packing). The same
// bits as gemm_amx_packed. Only when amx_usable().
void gemm_amx_unpacked(const GemmBlock* g, int64_t count, const float* const* rows, int64_t panel0,
                       int64_t panel1);

}  // namespace mha::cpu
