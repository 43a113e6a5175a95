// src/cpu/fused/isa.h: which vector instruction set the fused kernels use.
//
// Chosen once from the CPU (__builtin_cpu_supports); tests force each one
// the CPU supports. The decode kernel (cpu/decode) shares the choice.
#pragma once

namespace mha::kernels {

enum class FusedIsa { Scalar, Avx2, Avx512 };
FusedIsa fused_isa();       // the one in use
FusedIsa fused_best_isa();  // the best one this CPU supports
// Selects `isa` if the CPU supports it; returns whether it did.
bool set_fused_isa(FusedIsa isa);
const char* fused_isa_name(FusedIsa isa);

}  // namespace mha::kernels
