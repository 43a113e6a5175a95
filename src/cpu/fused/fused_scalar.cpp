// The fused attention kernel for the baseline x86-64 target (no pragma: plain loops).
// The dispatcher (attention_fused.cpp) calls it only on CPUs that support it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fused/fused_job.h"
#include "cpu/fused/traits.h"
#include "kernels/attention_fused.h"

// Compiled for the baseline x86-64 target (no pragma: plain loops).
#include "cpu/fused/simd_scalar.h"
#include "cpu/fused/kernel_impl.h"
#include "cpu/fused/backward_impl.h"

namespace mha::kernels::fused {

namespace {

using K = Kernel<Scalar4, Scalar4Tiles>;

size_t scratch_floats(int64_t d, int64_t dv, int64_t rows) {
  return K::scratch_floats(d, dv, rows);
}
void forward_chunk(const ForwardJob& job, int64_t chunk, float* scratch) {
  K::forward_chunk(job, chunk, scratch);
}
void weights_chunk(const WeightsJob& job, int64_t chunk, float* scratch) {
  K::weights_chunk(job, chunk, scratch);
}
using KB = BackwardKernel<Scalar4, Scalar4Tiles>;
size_t backward_scratch_floats(int64_t Q, int64_t d, int64_t dv, int64_t rows) {
  return KB::scratch_floats(KB::shape_of(Q, d, dv, rows));
}
void backward_chunk(const BackwardJob& job, int64_t chunk, float* scratch) {
  KB::chunk(job, chunk, scratch);
}

}  // namespace

const IsaKernels kScalarKernels = {Scalar4::kName,        K::MQ,
                                  &scratch_floats,        &forward_chunk,
                                  &weights_chunk,         &backward_scratch_floats,
                                  &backward_chunk};

}  // namespace mha::kernels::fused

