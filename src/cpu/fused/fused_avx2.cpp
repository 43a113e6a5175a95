// The fused attention kernel for AVX2 + FMA.
// The dispatcher (attention_fused.cpp) calls it only on CPUs that support it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fused/fused_job.h"
#include "cpu/fused/traits.h"
#include "kernels/attention_fused.h"

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

namespace mha::kernels::fused {

namespace {

using K = Kernel<Avx2, Avx2Tiles>;

size_t scratch_floats(int64_t d, int64_t dv, int64_t rows) {
  return K::scratch_floats(d, dv, rows);
}
void forward_chunk(const ForwardJob& job, int64_t chunk, float* scratch) {
  K::forward_chunk(job, chunk, scratch);
}
void weights_chunk(const WeightsJob& job, int64_t chunk, float* scratch) {
  K::weights_chunk(job, chunk, scratch);
}
using KB = BackwardKernel<Avx2, Avx2Tiles>;
size_t backward_scratch_floats(int64_t Q, int64_t d, int64_t dv, int64_t rows) {
  return KB::scratch_floats(KB::shape_of(Q, d, dv, rows));
}
void backward_chunk(const BackwardJob& job, int64_t chunk, float* scratch) {
  KB::chunk(job, chunk, scratch);
}

}  // namespace

const IsaKernels kAvx2Kernels = {Avx2::kName,        K::MQ,
                                  &scratch_floats,        &forward_chunk,
                                  &weights_chunk,         &backward_scratch_floats,
                                  &backward_chunk};

}  // namespace mha::kernels::fused

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
