// The fused attention kernel for AVX-512F (with AVX2 and FMA, which every
// AVX-512 CPU has).
// The dispatcher (attention_fused.cpp) calls it only on CPUs that support it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fused/fused_job.h"
#include "cpu/fused/traits.h"
#include "kernels/attention_fused.h"

// Everything below is compiled for AVX-512F (with AVX2 and FMA, which every
// AVX-512 CPU has); the headers above are not (GCC: a target pragma; clang: a
// target attribute on every function).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// GCC 12 reports its own _mm512_undefined_ps() as maybe-uninitialized (GCC
// bug 105593); the intrinsics are fine.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "cpu/fused/simd_avx512.h"
#include "cpu/fused/kernel_impl.h"
#include "cpu/fused/backward_impl.h"

namespace mha::kernels::fused {

namespace {

using K = Kernel<Avx512, Avx512Tiles>;

size_t scratch_floats(int64_t d, int64_t dv, int64_t rows) {
  return K::scratch_floats(d, dv, rows);
}
void forward_chunk(const ForwardJob& job, int64_t chunk, float* scratch) {
  K::forward_chunk(job, chunk, scratch);
}
void weights_chunk(const WeightsJob& job, int64_t chunk, float* scratch) {
  K::weights_chunk(job, chunk, scratch);
}
using KB = BackwardKernel<Avx512, Avx512Tiles>;
size_t backward_scratch_floats(int64_t Q, int64_t d, int64_t dv, int64_t rows) {
  return KB::scratch_floats(KB::shape_of(Q, d, dv, rows));
}
void backward_chunk(const BackwardJob& job, int64_t chunk, float* scratch) {
  KB::chunk(job, chunk, scratch);
}

}  // namespace

const IsaKernels kAvx512Kernels = {Avx512::kName,        K::MQ,
                                  &scratch_floats,        &forward_chunk,
                                  &weights_chunk,         &backward_scratch_floats,
                                  &backward_chunk};

}  // namespace mha::kernels::fused

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
