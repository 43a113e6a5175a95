#include "cpu/parallel_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "cpu/blas.h"
#include "mha/threads.h"

namespace mha::cpu {

int64_t gemm_row_block(int64_t M) {
  const int64_t eighth = (M + 7) / 8;
  return std::clamp<int64_t>((eighth + 63) / 64 * 64, 128, 1024);
}

void GemmBatch::add(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const int64_t rows = gemm_row_block(M);
  for (int64_t r0 = 0; r0 < M; r0 += rows)
    blocks_.push_back({A + r0 * lda, lda, B, ldb, trans_b, bias, C + r0 * ldc, ldc,
                       std::min(rows, M - r0), N, K});
}

namespace {

void run_block(const GemmBlock& g) {
  if (g.bias)
    for (int64_t r = 0; r < g.M; ++r) std::memcpy(g.C + r * g.ldc, g.bias, sizeof(float) * g.N);
  sgemm(false, g.trans_b, g.M, g.N, g.K, 1.0f, g.A, g.lda, g.B, g.ldb, g.bias ? 1.0f : 0.0f, g.C,
        g.ldc);
}

}  // namespace

void GemmBatch::run() const {
  const int64_t n = static_cast<int64_t>(blocks_.size());
  if (n == 0) return;
  // OpenBLAS must not thread inside our threads. Its count is set to one and
  // left there: switching it back and forth costs ~10 ms per switch once
  // other threads have called it (measured with OpenBLAS 0.3.21, pthreads).
  if (blas_threads() != 1) set_blas_threads(1);
  // Products smaller than this (multiply-adds) run on the calling thread:
  // waking a team costs more than they take (the seed's toy shape: 2e5).
  constexpr double kMinParallelWork = 2e6;
  double work = 0;
  for (const GemmBlock& g : blocks_) work += static_cast<double>(g.M) * g.N * g.K;
  const int threads =
      work < kMinParallelWork ? 1 : static_cast<int>(std::min<int64_t>(num_threads(), n));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
  for (int64_t i = 0; i < n; ++i) run_block(blocks_[static_cast<size_t>(i)]);
}

void parallel_sgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc) {
  GemmBatch batch;
  batch.add(M, N, K, A, lda, B, ldb, trans_b, bias, C, ldc);
  batch.run();
}

}  // namespace mha::cpu
