// The fused attention kernel for the baseline x86-64 target (no pragma: plain loops).
// The dispatcher (attention_fused.cpp) calls it only on CPUs that support it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fused/fused_job.h"
#include "cpu/fused/traits.h"
#include "cpu/fused/attention_fused.h"

// Compiled for the baseline x86-64 target (no pragma: plain loops).
#include "cpu/fused/simd_scalar.h"
#include "cpu/fused/kernel_impl.h"
#include "cpu/fused/backward_impl.h"
#include "cpu/fused/isa_table.h"

namespace mha::kernels::fused {

const IsaKernels kScalarKernels = isa_kernels<Scalar4, Scalar4Tiles>();

}  // namespace mha::kernels::fused

