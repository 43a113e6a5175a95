// src/cpu/fused/simd_avx2.h: the fused kernel's vector type for AVX2 + FMA
// (the decode kernel and the GEMM micro-kernel use it too).
//
// Include only inside a `#pragma GCC target("avx2,fma")` region (see
// fused_avx2.cpp).
#pragma once

#include <immintrin.h>

#include "cpu/isa/registers.h"

namespace mha::kernels::fused {

struct Avx2 : cpu::Avx2Registers {
  using Reg = __m256;
  static constexpr const char* kName = "avx2";

  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  // p 32-byte aligned (the GEMM's packed panels and tiles).
  static Reg load_aligned(const float* p) { return _mm256_load_ps(p); }
  static void store_aligned(float* p, Reg x) { _mm256_store_ps(p, x); }
  static Reg broadcast(const float* p) { return _mm256_broadcast_ss(p); }  // *p in every lane
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  // 1 / x to ~1 ulp for normal x (not 0, inf or denormal): the 12-bit
  // estimate and one Newton step, a tenth of a division's cost.
  static Reg rcp(Reg x) {
    const Reg r = _mm256_rcp_ps(x);
    return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(x, r, _mm256_set1_ps(1.0f)), r);
  }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg select_lt(Reg a, Reg b, Reg x, Reg y) {
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  }

  // 2^x as in Avx512::exp2 (0 below x = -125, never a denormal), with 2^n
  // built in the exponent bits.
  static Reg exp2(Reg x) {
    const Reg lo = _mm256_set1_ps(-125.0f);
    const Reg underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const Reg nan_in = x;
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.0f));
    const Reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = _mm256_sub_ps(x, n);
    Reg p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const Reg r = _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
    return _mm256_blendv_ps(r, nan_in, _mm256_cmp_ps(nan_in, nan_in, _CMP_UNORD_Q));  // NaN stays NaN
  }
};

}  // namespace mha::kernels::fused
