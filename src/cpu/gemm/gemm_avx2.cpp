// mha's product for AVX2 with FMA: a 6 x 16 micro-tile (12 ymm accumulators,
// two B operands, one broadcast). gemm.cpp calls it only on CPUs that have it.
#include <immintrin.h>

#include <cstdint>

#include "cpu/gemm/gemm_traits.h"

#define MHA_ISA_TARGET "avx2,fma"
#include "cpu/isa/target_begin.h"
#include "cpu/fused/simd_avx2.h"
#include "cpu/gemm/gemm_impl.h"
#include "cpu/gemm/micro_kernel.h"

namespace mha::cpu::gemm_kernels {
namespace {

struct Avx2Micro : TwoVectorMicro<kernels::fused::Avx2, Avx2Tiles> {
  // Panel rows k = 0..kc of 16 columns: dst[k*16 + j] = src[j][k]; 8 x 8
  // blocks transposed in registers, the last block's k past kc masked off.
  // Rows j >= nr are zeros: a half of them all is stored as zeros.
  static void transpose_rows(const float* const* src, int64_t nr, int64_t kc, float* dst) {
    for (int half = 0; half < 2; ++half) {
      if (8 * half >= nr) {
        const auto z = _mm256_setzero_ps();
        for (int64_t k = 0; k < kc; ++k) _mm256_store_ps(dst + k * 16 + 8 * half, z);
        continue;
      }
      const float* const* s = src + 8 * half;
      for (int64_t k0 = 0; k0 < kc; k0 += 8) {
        const int64_t n = kc - k0 < 8 ? kc - k0 : 8;
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 r[8], t[8], u[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_maskload_ps(s[i] + k0, m);
        for (int i = 0; i < 4; ++i) {
          t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
          t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
        for (int g = 0; g < 2; ++g) {
          u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
          u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
          u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
          u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
        }
        for (int c = 0; c < 4; ++c) {
          if (c < n) _mm256_store_ps(dst + (k0 + c) * 16 + 8 * half, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
          if (4 + c < n)
            _mm256_store_ps(dst + (k0 + 4 + c) * 16 + 8 * half, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
        }
      }
    }
  }
};

}  // namespace

const IsaGemm kAvx2Gemm = Driver<Avx2Micro>::table();

}  // namespace mha::cpu::gemm_kernels

#include "cpu/isa/target_end.h"
