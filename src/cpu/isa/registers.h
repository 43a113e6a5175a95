// src/cpu/isa/registers.h: the vector register file of each instruction set
// mha's kernels are written for, as their tile sizes count it. The fused
// kernel's SIMD types and tile sizes (cpu/fused/) and the GEMM's block sizes
// (cpu/gemm/gemm_traits.h) take their lanes and register counts from here.
#pragma once

namespace mha::cpu {

struct Avx512Registers {
  static constexpr int kLanes = 16;      // floats per zmm
  static constexpr int kRegisters = 32;  // zmm0..zmm31
};

struct Avx2Registers {
  static constexpr int kLanes = 8;       // floats per ymm
  static constexpr int kRegisters = 16;  // ymm0..ymm15
};

// The portable kernels: what the compiler makes of their loops (SSE).
struct SseRegisters {
  static constexpr int kLanes = 4;       // floats per xmm
  static constexpr int kRegisters = 16;  // xmm0..xmm15
};

// Whether a micro-kernel that keeps rows x vectors accumulators, loads
// `vectors` operands and broadcasts one value fits R's register file (the
// budget every kernel's tile sizes are chosen against).
template <class R>
constexpr bool fits_registers(int rows, int vectors) {
  return rows * vectors + vectors + 1 <= R::kRegisters;
}

}  // namespace mha::cpu
