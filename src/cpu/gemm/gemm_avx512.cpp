// mha's product for AVX-512F: a 12 x 32 micro-tile (24 zmm accumulators, two
// B operands, one broadcast). gemm.cpp calls it only on CPUs that have it.
#include <immintrin.h>

#include <cstdint>

#include "cpu/gemm/gemm_traits.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// GCC 12 reports its own _mm512_undefined_ps() (inside intrinsics) as
// maybe-uninitialized (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "cpu/gemm/gemm_impl.h"

namespace mha::cpu::gemm_kernels {
namespace {

struct Avx512Micro {
  using Tiles = Avx512Tiles;
  static constexpr const char* kName = "avx512";
  static constexpr int MR = Tiles::MR;
  static_assert(Tiles::NR == 32, "two zmm per row");

  // acc[i] (+)= sum_k a[k*MR + i] * b[k*32 .. k*32+31]
  static inline void accumulate(int64_t kc, const float* a, const float* b, __m512 (&lo)[MR],
                                __m512 (&hi)[MR]) {
    for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; ++k) {
      const __m512 b0 = _mm512_load_ps(b);
      const __m512 b1 = _mm512_load_ps(b + 16);
      for (int i = 0; i < MR; ++i) {
        const __m512 ai = _mm512_set1_ps(a[i]);
        lo[i] = _mm512_fmadd_ps(ai, b0, lo[i]);
        hi[i] = _mm512_fmadd_ps(ai, b1, hi[i]);
      }
      a += MR;
      b += 32;
    }
  }

  static inline __m512 update(__m512 acc, float alpha, float beta, const float* c) {
    const __m512 r = alpha == 1.0f ? acc : _mm512_mul_ps(_mm512_set1_ps(alpha), acc);
    if (beta == 0.0f) return r;
    if (beta == 1.0f) return _mm512_add_ps(_mm512_loadu_ps(c), r);
    return _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(c), r);
  }

  static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                   float beta) {
    __m512 lo[MR], hi[MR];
    accumulate(kc, a, b, lo, hi);
    for (int i = 0; i < MR; ++i) {
      float* row = c + i * ldc;
      _mm512_storeu_ps(row, update(lo[i], alpha, beta, row));
      _mm512_storeu_ps(row + 16, update(hi[i], alpha, beta, row + 16));
    }
  }

  // An edge tile: rows [0, mr), columns [0, nr) of the micro-tile, through
  // masked loads and stores (the same arithmetic as a whole tile).
  static void edge(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int mr, int nr,
                   float alpha, float beta) {
    __m512 lo[MR], hi[MR];
    accumulate(kc, a, b, lo, hi);
    const __mmask16 m0 = nr >= 16 ? 0xffff : static_cast<__mmask16>((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : static_cast<__mmask16>((1u << (nr - 16)) - 1);
    for (int i = 0; i < mr; ++i) {
      float* row = c + i * ldc;
      _mm512_mask_storeu_ps(row, m0, update_masked(lo[i], alpha, beta, row, m0));
      if (m1) _mm512_mask_storeu_ps(row + 16, m1, update_masked(hi[i], alpha, beta, row + 16, m1));
    }
  }

  static inline __m512 update_masked(__m512 acc, float alpha, float beta, const float* c, __mmask16 m) {
    const __m512 r = alpha == 1.0f ? acc : _mm512_mul_ps(_mm512_set1_ps(alpha), acc);
    if (beta == 0.0f) return r;
    if (beta == 1.0f) return _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), r);
    return _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, c), r);
  }

  static void tile_to(int64_t kc, const float* a, const float* b, float* acc) {
    __m512 lo[MR], hi[MR];
    accumulate(kc, a, b, lo, hi);
    for (int i = 0; i < MR; ++i) {
      _mm512_store_ps(acc + i * 32, lo[i]);
      _mm512_store_ps(acc + i * 32 + 16, hi[i]);
    }
  }
};

}  // namespace

const IsaGemm kAvx512Gemm = Driver<Avx512Micro>::table();

}  // namespace mha::cpu::gemm_kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
