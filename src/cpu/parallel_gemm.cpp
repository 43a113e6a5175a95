#include "cpu/parallel_gemm.h"

#include <omp.h>

#include <algorithm>

#include "cpu/blas.h"
#include "mha/threads.h"

namespace mha::cpu {

int64_t gemm_row_block(int64_t M) {
  const int64_t eighth = (M + 7) / 8;
  return std::clamp<int64_t>((eighth + 63) / 64 * 64, 128, 1024);
}

void parallel_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const int64_t rows = gemm_row_block(M);
  const int64_t blocks = (M + rows - 1) / rows;
  // Row r of op(A) starts at A + r*lda, or at A + r when A is transposed.
  const int64_t a_step = trans_a ? 1 : lda;
  const int saved = blas_threads();
  if (saved != 1) set_blas_threads(1);
  const int threads = blocks > 1 ? std::min<int64_t>(num_threads(), blocks) : 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t r0 = blk * rows, m = std::min(rows, M - r0);
    sgemm(trans_a, trans_b, m, N, K, alpha, A + r0 * a_step, lda, B, ldb, beta, C + r0 * ldc, ldc);
  }
  if (saved != 1) set_blas_threads(saved);
}

}  // namespace mha::cpu
