// src/cpu/gemm/few_rows.h: products of very few rows against a weight read
// in place, as dot products.
//
//   y:[rows, N] (row stride ldy) = x:[rows, K] (row stride ldx) W^T + bias,
//   W:[N, K] row-major, bias:[N] or null
//
// A decode step projects one row through weights of millions of floats. The
// packed product reads the weight's panels once too, but at one row its
// 12-row micro-kernel idles; dot products over W's rows, four at a time (four
// independent sums in flight hide the add latency), are faster there.
// Measured (one thread, loaded machine, median of 100 steps, B rows of one
// new position, alternating builds): D 1024: 1 row 0.86-0.88 ms dot /
// 0.85-0.96 packed, 2 rows 1.17-1.62 / 1.00-1.10, 4 rows 2.0-2.5 /
// 1.24-1.35, 8 rows 4.5-5.4 / 1.9-2.0; D 4096: 1 row 17-24 / 27-29, 4 rows
// 36-38 / 29-33. Hence kDotProductMaxRows = 1, float32 only (bfloat16 reads
// its packing, half the bytes of the weight). GemmBatch::add_packed takes
// this path by itself when given the unpacked weight (cpu/gemm/parallel_gemm.h).
//
// Each element is summed by one thread in one order: the same bits at any
// thread count (not the packed product's bits: a different order of sums).
#pragma once

#include <cstdint>

namespace mha::cpu {

// Products of at most this many rows (float32) run as dot products.
inline constexpr int64_t kDotProductMaxRows = 1;

// y = x W^T + bias (file comment) on at most `threads` threads.
void dot_product_rows(const float* x, int64_t rows, int64_t ldx, int64_t K, const float* W, int64_t N, const float* bias,
                      float* y, int64_t ldy, int threads);

// Multiply-adds below which dot_product_rows stays on the calling thread
// (waking a team costs more).
inline constexpr double kDotProductMinParallelWork = 2e5;

}  // namespace mha::cpu
