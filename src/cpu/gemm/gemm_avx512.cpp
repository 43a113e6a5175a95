// mha's product for AVX-512F: a 12 x 32 micro-tile (24 zmm accumulators, two
// B operands, one broadcast). gemm.cpp calls it only on CPUs that have it.
#include <immintrin.h>

#include <cstdint>

#include "cpu/gemm/gemm_traits.h"

#define MHA_ISA_TARGET "avx512f,avx2,fma"
#include "cpu/isa/target_begin.h"
#include "cpu/fused/simd_avx512.h"
#include "cpu/gemm/gemm_impl.h"
#include "cpu/gemm/micro_kernel.h"

namespace mha::cpu::gemm_kernels {
namespace {

struct Avx512Micro : TwoVectorMicro<kernels::fused::Avx512, Avx512Tiles> {
  // An edge tile: rows [0, mr), columns [0, nr) of the micro-tile, through
  // masked loads and stores (the same arithmetic as a whole tile).
  //
  // Edge tiles of few rows (products of a few rows: gemm_unpacked) skip the
  // missing rows' multiply-adds in steps of 4 rows (rows_used), and pack_a
  // zeroes only those.
  static constexpr int rows_used(int mr) { return mr <= 4 ? 4 : mr <= 8 ? 8 : MR; }
  static void edge(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int mr, int nr,
                   float alpha, float beta) {
    __m512 lo[MR], hi[MR];
    if (mr <= 4) accumulate<4>(kc, a, b, lo, hi);
    else if (mr <= 8) accumulate<8>(kc, a, b, lo, hi);
    else accumulate(kc, a, b, lo, hi);
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

  // store(k, column k) for k < 16, column k = (r[0][k], r[1][k], ...,
  // r[15][k]): a 16 x 16 transpose in registers (unpack pairs, then pairs of
  // pairs, then 128-bit lanes). Each column is stored as soon as it is made
  // (holding all 16 spills registers: measured 1.8x slower on the d2l
  // chapter's toy product).
  template <class Store>
  static inline void transpose16(const __m512 (&r)[16], const Store& store) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
    __m512 u[16];
    for (int g = 0; g < 4; ++g) {
      const __m512d a0 = _mm512_castps_pd(t[4 * g]), a1 = _mm512_castps_pd(t[4 * g + 1]);
      const __m512d b0 = _mm512_castps_pd(t[4 * g + 2]), b1 = _mm512_castps_pd(t[4 * g + 3]);
      u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, b0));
      u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, b0));
      u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, b1));
      u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, b1));
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
      const __m512 v1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
      const __m512 w0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
      const __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
      store(c, _mm512_shuffle_f32x4(v0, v1, 0x88));
      store(4 + c, _mm512_shuffle_f32x4(v0, v1, 0xDD));
      store(8 + c, _mm512_shuffle_f32x4(w0, w1, 0x88));
      store(12 + c, _mm512_shuffle_f32x4(w0, w1, 0xDD));
    }
  }

  // Panel rows k = 0..kc of 32 columns: dst[k*32 + j] = src[j][k]; 16 x 16
  // blocks transposed in registers, the last block's k past kc masked off.
  // Rows j >= nr are zeros: a half of them all is stored as zeros.
  static void transpose_rows(const float* const* src, int64_t nr, int64_t kc, float* dst) {
    for (int half = 0; half < 2; ++half) {
      if (16 * half >= nr) {
        const auto z = _mm512_setzero_ps();
        for (int64_t k = 0; k < kc; ++k) _mm512_store_ps(dst + k * 32 + 16 * half, z);
        continue;
      }
      const float* const* s = src + 16 * half;
      for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        const int64_t n = kc - k0 < 16 ? kc - k0 : 16;
        const __mmask16 m = n == 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_ps(m, s[i] + k0);
        transpose16(r, [&](int k, __m512 col) {
          if (k < n) _mm512_store_ps(dst + (k0 + k) * 32 + 16 * half, col);
        });
      }
    }
  }

  // A's whole row panel (gemm_impl.h pack_a): panel[k*MR + i] = src[i][k]
  // for i < MR, k < kc. In registers, 16 k at a time; each k's MR values
  // are one masked store. Measured against the scalar copy (one load and
  // one strided store per element), B8 L512 D768's projection, one thread:
  // that packing of A was 8% of the product's time. (A few rows' panel
  // stays scalar: the transpose's cost is that of 16 rows whatever the
  // count; this path on few rows was not measured on its own.)
  static void pack_rows(const float* const* src, int64_t kc, float* panel) {
    static_assert(MR <= 16, "a panel row is one vector");
    constexpr __mmask16 keep = static_cast<__mmask16>((1u << MR) - 1);
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
      const int64_t n = kc - k0 < 16 ? kc - k0 : 16;
      const __mmask16 m = n == 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = i < MR ? _mm512_maskz_loadu_ps(m, src[i] + k0) : _mm512_setzero_ps();
      transpose16(r, [&](int k, __m512 col) {
        if (k < n) _mm512_mask_storeu_ps(panel + (k0 + k) * MR, keep, col);
      });
    }
  }
};

}  // namespace

const IsaGemm kAvx512Gemm = Driver<Avx512Micro>::table();

}  // namespace mha::cpu::gemm_kernels

#include "cpu/isa/target_end.h"
