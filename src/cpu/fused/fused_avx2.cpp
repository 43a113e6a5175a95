// The fused attention kernel for AVX2 + FMA.
// The dispatcher (attention_fused.cpp) calls it only on CPUs that support it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fused/fused_job.h"
#include "cpu/fused/traits.h"
#include "cpu/fused/attention_fused.h"

// Everything below is compiled for AVX2 + FMA; the headers above are not
// (GCC: a target pragma; clang: a target attribute on every function).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#include "cpu/fused/simd_avx2.h"
#include "cpu/fused/kernel_impl.h"
#include "cpu/fused/backward_impl.h"
#include "cpu/fused/isa_table.h"

namespace mha::kernels::fused {

const IsaKernels kAvx2Kernels = isa_kernels<Avx2, Avx2Tiles>();

}  // namespace mha::kernels::fused

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
