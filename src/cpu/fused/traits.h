// src/cpu/fused/traits.h: tile sizes of the fused attention kernel, per ISA.
//
// The kernel keeps scores transposed: a tile is (keys x queries) with the
// queries along the vector lanes, so that the row softmax (max, exp, sum per
// query) is plain lane-wise arithmetic and both products read k and v in
// their natural row-major layout, broadcasting one element at a time:
//
//   S^T[key, q-lanes]  += k[key, c]  * Q^T[c, q-lanes]     (c over d)
//   O^T[c, q-lanes]    += v[key, c]  * P^T[key, q-lanes]   (key over the tile)
//
// One micro-kernel call keeps kBlockRows x kQueryVectors accumulators in
// registers (kBlockRows keys of S^T, or kBlockRows columns of O^T), plus the
// kQueryVectors operands it loads and one broadcast.
//
// Per thread, the L1 data cache (48 KiB on the Xeon this was measured on,
// 32 KiB on older cores) holds the score tile (key tile x query tile) and
// most of Q^T (d x query tile) and O^T (dv x query tile). Keys and values
// stream from L2: one (batch, head) of k and v at K = 4096, d = 64 is 2 MiB,
// the L2 size, and consecutive chunks of a thread share it.
//
// None of these depends on the thread count, so the results do not either.
#pragma once

#include "cpu/isa/registers.h"

namespace mha::kernels::fused {

struct Avx512Tiles : cpu::Avx512Registers {
  // 6 x 4 = 24 accumulators + 4 operands + 1 broadcast = 29 of 32 zmm: 64
  // queries per chunk, so each key or value element loaded feeds 64 lanes.
  // Measured (one thread, d = 64, K = 512 / 4096, in % of OpenBLAS sgemm):
  // 6x4 with 48 keys 74/80, 6x4 with 96 keys 72/80, 8x3 with 64 keys 68/76,
  // 12x2 with 96 keys 70/67.
  static constexpr int kQueryVectors = 4;
  static constexpr int kBlockRows = 6;
  // 48 keys per tile (8 blocks of 6): Q^T, the score tile and O^T take
  // 16 + 12 + 16 = 44 KiB at d = 64, and the rescale of O^T is paid once per
  // 48 keys.
  static constexpr int kKeyTile = 48;
};

struct Avx2Tiles : cpu::Avx2Registers {
  // 6 x 2 = 12 accumulators + 2 operands + 1 broadcast = 15 of 16 ymm.
  static constexpr int kQueryVectors = 2;
  static constexpr int kBlockRows = 6;
  static constexpr int kKeyTile = 48;
};

struct Scalar4Tiles : cpu::SseRegisters {
  static constexpr int kQueryVectors = 2;
  static constexpr int kBlockRows = 4;
  static constexpr int kKeyTile = 32;
};

template <class T>
constexpr bool tiles_are_valid() {
  static_assert(cpu::fits_registers<T>(T::kBlockRows, T::kQueryVectors),
                "the micro-kernel's accumulators, operands and broadcast must fit the register file");
  static_assert(T::kKeyTile % T::kBlockRows == 0,
                "a full key tile must split into whole micro-kernel blocks");
  static_assert(T::kKeyTile * T::kQueryVectors * T::kLanes * 4 <= 16 * 1024,
                "the score tile must leave L1 room for Q^T and O^T");
  static_assert(T::kQueryVectors >= 1 && T::kBlockRows >= 1 && T::kKeyTile >= 1, "empty tile");
  return true;
}
static_assert(tiles_are_valid<Avx512Tiles>());
static_assert(tiles_are_valid<Avx2Tiles>());
static_assert(tiles_are_valid<Scalar4Tiles>());

}  // namespace mha::kernels::fused
