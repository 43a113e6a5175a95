// src/cpu/gemm/micro_kernel.h: the register tile of mha's vector GEMM
// micro-kernels (gemm_avx2.cpp, gemm_avx512.cpp), written once over the SIMD
// type V (cpu/fused/simd_<isa>.h): an MR x NR tile of C, NR = two vectors,
// accumulated over kc steps of packed A (MR values a step) and packed B (NR
// values a step), then written as C = alpha acc + beta C.
//
// Included by gemm_<isa>.cpp inside its target region, so that the code is
// compiled for that instruction set; the anonymous namespace keeps each
// file's copy its own (one per instruction set).
#pragma once

#include <cstdint>

namespace mha::cpu::gemm_kernels {
namespace {

template <class V, class T>
struct TwoVectorMicro {
  using Tiles = T;  // gemm_traits.h
  static constexpr const char* kName = V::kName;
  using Reg = typename V::Reg;
  static constexpr int MR = Tiles::MR;
  static constexpr int L = V::kLanes;
  static_assert(Tiles::NR == 2 * L, "two vectors per row");

  // lo[i], hi[i] = sum_k a[k*MR + i] * b[k*NR .. k*NR + NR-1], for rows
  // i < R (each row's sums are the same whatever R is). The loops over rows
  // are unrolled whole so that lo and hi are registers, not a stack array
  // (without it GCC 12 zeroed, stored and reloaded them every tile).
  template <int R = MR>
  static inline void accumulate(int64_t kc, const float* a, const float* b, Reg (&lo)[MR], Reg (&hi)[MR]) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) lo[i] = hi[i] = V::zero();
    for (int64_t k = 0; k < kc; ++k) {
      const Reg b0 = V::load_aligned(b);
      const Reg b1 = V::load_aligned(b + L);
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const Reg ai = V::broadcast(a + i);
        lo[i] = V::fmadd(ai, b0, lo[i]);
        hi[i] = V::fmadd(ai, b1, hi[i]);
      }
      a += MR;
      b += 2 * L;
    }
  }

  // alpha acc + beta C, the same operations as update() in gemm_impl.h.
  static inline Reg update(Reg acc, float alpha, float beta, const float* c) {
    const Reg r = alpha == 1.0f ? acc : V::mul(V::set1(alpha), acc);
    if (beta == 0.0f) return r;
    if (beta == 1.0f) return V::add(V::load(c), r);
    return V::fmadd(V::set1(beta), V::load(c), r);
  }

  static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta) {
    Reg lo[MR], hi[MR];
    accumulate(kc, a, b, lo, hi);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* row = c + i * ldc;
      V::store(row, update(lo[i], alpha, beta, row));
      V::store(row + L, update(hi[i], alpha, beta, row + L));
    }
  }

  static void tile_to(int64_t kc, const float* a, const float* b, float* acc) {
    Reg lo[MR], hi[MR];
    accumulate(kc, a, b, lo, hi);
    for (int i = 0; i < MR; ++i) {
      V::store_aligned(acc + i * 2 * L, lo[i]);
      V::store_aligned(acc + i * 2 * L + L, hi[i]);
    }
  }
};

}  // namespace
}  // namespace mha::cpu::gemm_kernels
