// src/cpu/parallel_gemm.h: matrix products whose result does not depend on
// the thread count.
//
// OpenBLAS threads a product by splitting its rows by the number of threads,
// and its kernels round the edge blocks of a split differently from whole
// blocks (measured: with OpenBLAS 0.3.21, 1- and 2-thread products differ in
// the last bit for most shapes on its Haswell kernel, some on SkylakeX). So
// mha does not let OpenBLAS thread: it cuts the rows into blocks fixed by the
// shape alone and runs one single-threaded BLAS call per block on its own
// OpenMP threads. Each block is its own call, so each row sees the same
// kernel path at any thread count. The cost is repacking the right-hand
// matrix once per block: ~3% single-threaded at 8 blocks of 512 rows.
#pragma once

#include <cstdint>

namespace mha::cpu {

// Rows per block for an M-row product: about M/8, a multiple of 64, within
// [128, 1024] (one block when M <= 128). Depends on M only.
int64_t gemm_row_block(int64_t M);

// C:[M,N] = alpha op(A) op(B) + beta C, as cpu::sgemm, rows split into
// gemm_row_block(M) blocks run on mha::num_threads() threads with the BLAS
// held at one thread meanwhile. Not for concurrent use from several threads
// (it sets OpenBLAS's process-wide thread count for its duration).
void parallel_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc);

}  // namespace mha::cpu
