// The fused attention kernel for AVX-512F (with AVX2 and FMA, which every
// AVX-512 CPU has).
// The dispatcher (attention_fused.cpp) calls it only on CPUs that support it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fused/fused_job.h"
#include "cpu/fused/traits.h"
#include "cpu/fused/attention_fused.h"

// Everything below is compiled for AVX-512F (with AVX2 and FMA, which every
// AVX-512 CPU has); the headers above are not (GCC: a target pragma; clang: a
// target attribute on every function).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// GCC 12 reports its own _mm512_undefined_ps() (inside _mm512_max_ps and
// others) as uninitialized or maybe-uninitialized (GCC bug 105593); the
// intrinsics are fine.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "cpu/fused/simd_avx512.h"
#include "cpu/fused/kernel_impl.h"
#include "cpu/fused/backward_impl.h"
#include "cpu/fused/isa_table.h"

namespace mha::kernels::fused {

const IsaKernels kAvx512Kernels = isa_kernels<Avx512, Avx512Tiles>();

}  // namespace mha::kernels::fused

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
