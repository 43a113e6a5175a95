// The decode kernel for AVX2 + FMA; bfloat16 rows widened 8 at a time.
// decode.cpp calls it only on CPUs that support it.
#include <cmath>
#include <cstdint>

#include "cpu/decode/decode_job.h"

#define MHA_ISA_TARGET "avx2,fma"
#include "cpu/isa/target_begin.h"
#include "cpu/fused/simd_avx2.h"
#include "cpu/decode/decode_impl.h"

namespace mha::kernels::decode {

struct Avx2Decode : fused::Avx2 {
  static float reduce_add(Reg x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(Reg x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static Reg load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // 2 x 8 bfloat16s -> even and odd elements as float32 (as Avx512Decode's).
  static void load_bf16_pair(const uint16_t* p, Reg& even, Reg& odd) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

const DecodeIsaKernels kAvx2Decode = decode_kernels<Avx2Decode>();

}  // namespace mha::kernels::decode

#include "cpu/isa/target_end.h"
