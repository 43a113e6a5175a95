// src/cpu/isa/target_begin.h: the one per-ISA target preamble. Everything
// between this header and cpu/isa/target_end.h is compiled for the
// instruction set named by MHA_ISA_TARGET (a GCC/clang target string, e.g.
// "avx512f,avx2,fma"); headers included before it are not (GCC: a target
// pragma; clang: a target attribute on every function). The dispatcher
// calls such code only on CPUs that have the instruction set (cpu/isa/isa.h).
//
//   #define MHA_ISA_TARGET "avx2,fma"
//   #include "cpu/isa/target_begin.h"
//   #include "cpu/fused/simd_avx2.h"   // intrinsics-using headers after it
//   ... kernels ...
//   #include "cpu/isa/target_end.h"
//
// No include guard: one begin and one end per translation unit.
#ifndef MHA_ISA_TARGET
#error "define MHA_ISA_TARGET (a target string) before including cpu/isa/target_begin.h"
#endif

#define MHA_ISA_PRAGMA_(x) _Pragma(#x)
#if defined(__clang__)
#define MHA_ISA_CLANG_PUSH_(t) MHA_ISA_PRAGMA_(clang attribute push(__attribute__((target(t))), apply_to = function))
MHA_ISA_CLANG_PUSH_(MHA_ISA_TARGET)
#else
#define MHA_ISA_GCC_TARGET_(t) MHA_ISA_PRAGMA_(GCC target(t))
#pragma GCC push_options
MHA_ISA_GCC_TARGET_(MHA_ISA_TARGET)
// GCC 12 reports its own _mm512_undefined_*() (inside intrinsics such as
// _mm512_max_ps) as uninitialized or maybe-uninitialized (GCC bug 105593);
// the intrinsics are fine.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
