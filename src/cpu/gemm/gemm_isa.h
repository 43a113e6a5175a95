// src/cpu/gemm/gemm_isa.h: the entry points one instruction set's product
// exports (gemm_<isa>.cpp), chosen at run time by gemm.cpp.
#pragma once

#include <cstdint>

#include "cpu/gemm/gemm.h"

namespace mha::cpu::gemm_kernels {

struct IsaGemm {
  const char* name;
  int NR, KC, MC;
  // Floats PackedB needs for op(B):[K,N]: K x N rounded up to whole panels.
  int64_t (*packed_b_floats)(int64_t K, int64_t N);
  // Packs column panels [panel0, panel1) (NR columns each) of op(B) into
  // `out` (packed_b_floats(K, N) floats, 64-byte aligned). With trans_b,
  // `rows` (N pointers, or null) gives where each row of B starts, in place
  // of B + j * ldb.
  void (*pack_b)(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb,
                 const float* const* rows, float* out, int64_t panel0, int64_t panel1);
  // C = alpha op(A) Bp + beta C (+ bias), Bp packed by pack_b, on this thread.
  void (*run)(const GemmBlock& g, const float* packed_b);
  // Columns [panel0 * NR, panel1 * NR) (to N) of products g[0..count) that
  // share op(B), B packed one panel at a time into an L1 buffer (no
  // PackedB); the same bits as run(). `rows`, with trans_b: as in pack_b.
  void (*run_unpacked)(const GemmBlock* g, int64_t count, const float* const* rows, int64_t panel0,
                       int64_t panel1);
};

extern const IsaGemm kAvx512Gemm;
extern const IsaGemm kAvx2Gemm;
extern const IsaGemm kScalarGemm;

}  // namespace mha::cpu::gemm_kernels
