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
//
// NC and KA (the driver's order for sums of at most KA): each MC-row block
// of A is packed once for all its KC-chunks (MC x KA floats, 768 KiB at
// most), then C is written in slices of NC columns, every chunk adding to a
// slice while its MC x NC floats (192 KiB) are in L2. Before, every chunk
// swept the whole MC x N block of C, which for N 2304 (the stacked q, k, v
// projection: 1.7 MiB) left L2 between chunks. Measured with
// bench/gemm_libraries.sh build 1 7 on the 2-core AMD EPYC (48 KiB L1d,
// 1 MiB L2), against oneDNN 2.6 in the same process, together with A's
// panels packed in registers (gemm_avx512.cpp pack_rows) and the tile's
// accumulators kept out of memory (micro_kernel.h): time/oneDNN's on the
// projections 4096x768x768, 768x768x4096 (a weight gradient), 4096x512x512,
// 16384x256x256, stacked 4096x2304x768 went from 1.11 / 1.11 / 1.09 / 1.05 /
// 1.18 to 1.03 / 1.05 / 1.07 / 1.07 / 1.06 (NC 512 measured the same as
// 256). Tried and dropped: prefetching the next A block during this one (no
// change beyond noise), prefetching the next B panel (0.65x: that CPU's
// prefetch hints all fill L1, evicting the panel in use), prefetching each
// C tile before its sum (+4% on the stacked product, -2% on 16384x256x256).
#pragma once

#include "cpu/isa/registers.h"

namespace mha::cpu::gemm_kernels {

struct Avx512Tiles : Avx512Registers {
  static constexpr int MR = 12;   // rows of C per micro-tile
  static constexpr int NR = 32;   // columns: two zmm
  static constexpr int KC = 256;  // the KC x NR panel of B: 32 KiB, in L1
  static constexpr int MC = 192;  // the MC x KC block of A: 192 KiB, in L2
  static constexpr int NC = 256;  // columns of C per slice (sums of at most KA)
  static constexpr int KA = 1024;
};

struct Avx2Tiles : Avx2Registers {
  static constexpr int MR = 6;
  static constexpr int NR = 16;   // two ymm; 12 accumulators
  static constexpr int KC = 256;  // 16 KiB panel of B
  static constexpr int MC = 96;
  static constexpr int NC = 256;
  static constexpr int KA = 1024;
};

struct ScalarTiles : SseRegisters {
  static constexpr int MR = 4;
  static constexpr int NR = 8;
  static constexpr int KC = 256;
  static constexpr int MC = 64;
  static constexpr int NC = 256;
  static constexpr int KA = 1024;
};

template <class T>
constexpr bool tiles_are_valid() {
  static_assert(T::NR % T::kLanes == 0, "a micro-tile row is whole vectors");
  static_assert(fits_registers<T>(T::MR, T::NR / T::kLanes),
                "accumulators, B operands and the broadcast must fit the register file");
  static_assert(T::MC % T::MR == 0, "an A block is whole row panels");
  static_assert(T::NC % T::NR == 0, "a slice of C is whole column panels");
  static_assert(T::KC * T::NR * 4 <= 48 * 1024, "a B panel must fit L1");
  return true;
}
static_assert(tiles_are_valid<Avx512Tiles>());
static_assert(tiles_are_valid<Avx2Tiles>());
static_assert(tiles_are_valid<ScalarTiles>());

}  // namespace mha::cpu::gemm_kernels
