// src/cpu/fused/simd_avx512.h: the fused kernel's vector type for AVX-512F
// (the decode kernel and the GEMM micro-kernel use it too).
//
// Include only inside a `#pragma GCC target` region that enables avx512f (see
// fused_avx512.cpp): these functions use AVX-512 intrinsics and must not be
// compiled, or emitted, for the baseline target.
#pragma once

#include <immintrin.h>

#include "cpu/isa/registers.h"

namespace mha::kernels::fused {

struct Avx512 : cpu::Avx512Registers {
  using Reg = __m512;
  static constexpr const char* kName = "avx512";

  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  // p 64-byte aligned (the GEMM's packed panels and tiles).
  static Reg load_aligned(const float* p) { return _mm512_load_ps(p); }
  static void store_aligned(float* p, Reg x) { _mm512_store_ps(p, x); }
  static Reg broadcast(const float* p) { return _mm512_set1_ps(*p); }  // *p in every lane
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  // 1 / x to ~1 ulp for normal x (not 0, inf or denormal): the 14-bit
  // estimate and one Newton step, a fraction of a division's cost.
  static Reg rcp(Reg x) {
    const Reg r = _mm512_rcp14_ps(x);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(x, r, _mm512_set1_ps(1.0f)), r);
  }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg min(Reg a, Reg b) { return _mm512_min_ps(a, b); }
  // a * b + c, one rounding.
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  // a < b ? x : y, lane by lane (false when either side is NaN).
  static Reg select_lt(Reg a, Reg b, Reg x, Reg y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
  }

  // 2^x for x <= 0 (also correct for moderate x > 0); 0 for x < -125,
  // including -inf. x = n + f with n = round(x), |f| <= 1/2; 2^f by Cephes'
  // exp2f polynomial (relative error ~1e-7 on [-1/2, 1/2]); vscalefps
  // multiplies by 2^n. Results that would be denormal (x < -125) are 0
  // instead: the CPU computes denormals in microcode, ~100x slower, and
  // masked scores (-inf) would hit that path in every padded tile; against a
  // softmax sum >= 1 the difference (< 2^-125) is invisible.
  // NaN stays NaN (a NaN score makes its row NaN, as in the d2l chapter).
  static Reg exp2(Reg x) {
    const Reg lo = _mm512_set1_ps(-125.0f);
    const __mmask16 normal = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    const Reg other = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  // NaN or 0
    x = _mm512_max_ps(x, lo);
    const Reg n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = _mm512_sub_ps(x, n);
    Reg p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_mask_scalef_ps(other, normal, p, n);
  }
};

}  // namespace mha::kernels::fused
