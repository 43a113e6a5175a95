// The decode kernel for AVX-512F (with AVX2 and FMA, which every AVX-512 CPU
// has). bfloat16 cache rows become float32 by a 16-bit shift (exact: a
// bfloat16 is the upper half of a float32), 16 elements per load.
// decode.cpp calls it only on CPUs that support it.
#include <cmath>
#include <cstdint>

#include "cpu/decode/decode_job.h"

#define MHA_ISA_TARGET "avx512f,avx2,fma"
#include "cpu/isa/target_begin.h"
#include "cpu/fused/simd_avx512.h"
#include "cpu/decode/decode_impl.h"

namespace mha::kernels::decode {

struct Avx512Decode : fused::Avx512 {
  static float reduce_add(Reg x) { return _mm512_reduce_add_ps(x); }
  static float reduce_max(Reg x) { return _mm512_reduce_max_ps(x); }
  static Reg load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  // 2 x 16 bfloat16s -> elements 0, 2, .., 30 (even) and 1, 3, .., 31 (odd) as
  // float32: the low half of each 32-bit lane shifted up, the high half
  // masked; no shuffle (vpmovzxwd takes port 5, which the FMAs share).
  static void load_bf16_pair(const uint16_t* p, Reg& even, Reg& odd) {
    const __m512i w = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

const DecodeIsaKernels kAvx512Decode = decode_kernels<Avx512Decode>();

}  // namespace mha::kernels::decode

#include "cpu/isa/target_end.h"
