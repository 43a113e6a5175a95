// src/cpu/parallel_gemm.h: matrix products whose result does not depend on
// the thread count.
//
// OpenBLAS threads a product by splitting its rows by the number of threads,
// and its kernels round the edge blocks of a split differently from whole
// blocks (measured: with OpenBLAS 0.3.21, 1- and 2-thread products differ in
// the last bit for most shapes on its Haswell kernel, some on SkylakeX). So
// mha does not let OpenBLAS thread: it cuts the rows of each product into
// blocks fixed by the shape alone and runs one single-threaded BLAS call per
// block on its own OpenMP threads; each row then sees the same kernel path at
// any thread count. Several products (e.g. the projections of every batch
// row's unpadded part) go into one batch of blocks, so the threads share them
// all without a join per product. The cost is repacking the right-hand matrix
// once per block: ~3% single-threaded at 8 blocks of 512 rows.
#pragma once

#include <cstdint>
#include <vector>

namespace mha::cpu {

// Rows per block for a batch of products of M rows in all: about M/8, a
// multiple of 64, within [128, 1024]. Depends on the shapes only.
int64_t gemm_row_block(int64_t M);

// One block: C:[M,N] = alpha op(A) op(B) + beta C (+ bias broadcast over
// rows, then beta = 1), op(A) = A^T if trans_a, op(B) = B^T if trans_b.
struct GemmBlock {
  bool trans_a, trans_b;
  int64_t M, N, K;
  float alpha;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float beta;
  const float* bias;  // [N] or null
  float* C;
  int64_t ldc;
};

class GemmBatch {
 public:
  // Adds C = alpha op(A) op(B) + beta C, to be cut into row blocks of
  // gemm_row_block(total rows of the batch).
  void add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);
  // Adds C = A op(B) + bias (bias:[N] or null) in row blocks.
  void add(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
           int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc);
  // Runs every block on mha::num_threads() threads, after setting OpenBLAS's
  // process-wide thread count to one (and leaving it there).
  void run() const;

 private:
  std::vector<GemmBlock> blocks() const;  // the products cut into row blocks
  std::vector<GemmBlock> products_;
};

// One product through a GemmBatch: C = A op(B) (+ bias). cpu::sgemm
// (blas.h) is the general one, run the same way.
void parallel_sgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc);

}  // namespace mha::cpu
