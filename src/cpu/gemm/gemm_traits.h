// src/cpu/gemm/gemm_traits.h: block sizes of mha's matrix product, per ISA.
//
// A micro-kernel keeps an MR x NR tile of C in registers over KC steps: per
// step it loads NR values of packed B (NR / lanes vectors), broadcasts MR
// values of packed A, and issues MR * NR / lanes fused multiply-adds. The
// driver (gemm_impl.h) walks, for each block of MC rows and each KC-chunk of
// the sum, the NR-column panels of B (one KC x NR panel stays in L1 while the
// MC / MR row panels of A stream from L2 past it).
//
// AVX-512, measured on a Xeon (family 6 model 207, 48 KiB L1d, 2 MiB L2), one
// thread, B already packed, GFLOP/s for (M x N x K) = 1152 x 2304 x 768 /
// 1152 x 512 x 512 / 2048 x 256 x 256 (the projections of the benchmark
// shapes), best of 15 in thread CPU time on a loaded machine:
//   MR 12, KC 256, MC 192: 143 / 146 / 150   <- chosen
//   MR 12, KC 384, MC  96: 134 / 151 / 150
//   MR 12, KC 128, MC 384:  96 / 108 / 118   (C re-read every 128 steps)
//   MR 14, KC 256, MC 196: 120 / 131 /  89   (28 accumulators: spills)
//   MR  8, KC 256, MC 192: 126 / 139 / 143   (fewer FMAs per B load)
// OpenBLAS 0.3.21's SkylakeX kernel, same conditions, packing included:
// 149 / 149 / 123; mha with its packing included: 109 / 120 / 111 (packing
// B is a strided gather, ~0.6 ns per element).
#pragma once

#include "cpu/isa/registers.h"

namespace mha::cpu::gemm_kernels {

struct Avx512Tiles : Avx512Registers {
  static constexpr int MR = 12;   // rows of C per micro-tile
  static constexpr int NR = 32;   // columns: two zmm
  static constexpr int KC = 256;  // the KC x NR panel of B: 32 KiB, in L1
  static constexpr int MC = 192;  // the MC x KC block of A: 192 KiB, in L2
};

struct Avx2Tiles : Avx2Registers {
  static constexpr int MR = 6;
  static constexpr int NR = 16;   // two ymm; 12 accumulators
  static constexpr int KC = 256;  // 16 KiB panel of B
  static constexpr int MC = 96;
};

struct ScalarTiles : SseRegisters {
  static constexpr int MR = 4;
  static constexpr int NR = 8;
  static constexpr int KC = 256;
  static constexpr int MC = 64;
};

template <class T>
constexpr bool tiles_are_valid() {
  static_assert(T::NR % T::kLanes == 0, "a micro-tile row is whole vectors");
  static_assert(fits_registers<T>(T::MR, T::NR / T::kLanes),
                "accumulators, B operands and the broadcast must fit the register file");
  static_assert(T::MC % T::MR == 0, "an A block is whole row panels");
  static_assert(T::KC * T::NR * 4 <= 48 * 1024, "a B panel must fit L1");
  return true;
}
static_assert(tiles_are_valid<Avx512Tiles>());
static_assert(tiles_are_valid<Avx2Tiles>());
static_assert(tiles_are_valid<ScalarTiles>());

}  // namespace mha::cpu::gemm_kernels
