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
#define MHA_ISA_TARGET "avx2,fma"
#include "cpu/isa/target_begin.h"
#include "cpu/fused/simd_avx2.h"
#include "cpu/fused/kernel_impl.h"
#include "cpu/fused/backward_impl.h"
#include "cpu/fused/isa_table.h"

namespace mha::kernels::fused {

const IsaKernels kAvx2Kernels = isa_kernels<Avx2, Avx2Tiles>();

}  // namespace mha::kernels::fused

#include "cpu/isa/target_end.h"
