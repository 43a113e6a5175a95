// src/cpu/blas/blas.h: row-major single-precision products, and the one place mha
// calls the BLAS (OpenBLAS, cblas).
//
// sgemm is mha's own product (cpu/gemm/gemm.h) split into row blocks on
// mha's threads (cpu/gemm/parallel_gemm.h, where it is defined), so that its
// result does not depend on the thread count. blas_sgemm is one
// single-threaded OpenBLAS call: the reference the tests and benchmarks hold
// mha's product to; dimensions are checked against the BLAS's 32-bit int.
#pragma once

#include <cstdint>

#include "mha/precision.h"

namespace mha::cpu {

// C:[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(A):[M,K], op(B):[K,N].
// lda, ldb, ldc are row strides in elements of A, B and C as stored.
// Precision::BFloat16 rounds op(A) and op(B) to bfloat16 (GemmBatch).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc, Precision precision = Precision::Float32);

// One BLAS call on the calling thread (OpenBLAS's pool must be at one thread).
void blas_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                int64_t ldc);

// Threads the BLAS uses for one product (OpenBLAS's own pool).
int blas_threads();
void set_blas_threads(int n);

}  // namespace mha::cpu
