// src/cpu/fused/isa.h: which instruction set the fused kernels use: the
// one list (cpu/isa/isa.h), chosen from the one detection; tests force each
// level the CPU supports. The decode kernel (cpu/decode) shares the choice.
#pragma once

#include "cpu/isa/isa.h"

namespace mha::kernels {

using FusedIsa = cpu::Isa;
FusedIsa fused_isa();       // the one in use
FusedIsa fused_best_isa();  // the best vector level this CPU supports (cpu::best_vector_isa)
// Selects `isa` if the CPU supports it; returns whether it did.
bool set_fused_isa(FusedIsa isa);
const char* fused_isa_name(FusedIsa isa);

}  // namespace mha::kernels
