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

void GemmBatch::add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  products_.push_back({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, C, ldc});
}

void GemmBatch::add(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  products_.push_back({false, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, bias, C, ldc});
}

std::vector<GemmBlock> GemmBatch::blocks() const {
  // One block size for the whole batch, from its total rows: a product that
  // padding cut into short pieces then stays one block per piece, instead of
  // many small blocks that each repack the same right-hand matrix.
  int64_t total = 0;
  for (const GemmBlock& g : products_) total += g.M;
  const int64_t rows = gemm_row_block(total);
  std::vector<GemmBlock> out;
  for (const GemmBlock& g : products_) {
    // Row r of op(A) starts at A + r*lda, or at column r (A + r) when transposed.
    const int64_t a_step = g.trans_a ? 1 : g.lda;
    for (int64_t r0 = 0; r0 < g.M; r0 += rows) {
      GemmBlock b = g;
      b.M = std::min(rows, g.M - r0);
      b.A = g.A + r0 * a_step;
      b.C = g.C + r0 * g.ldc;
      out.push_back(b);
    }
  }
  return out;
}

namespace {

void run_block(const GemmBlock& g) {
  float beta = g.beta;
  if (g.bias) {
    for (int64_t r = 0; r < g.M; ++r) std::memcpy(g.C + r * g.ldc, g.bias, sizeof(float) * g.N);
    beta = 1.0f;
  }
  blas_sgemm(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.B, g.ldb, beta, g.C, g.ldc);
}

}  // namespace

void GemmBatch::run() const {
  // Largest blocks first, so that the threads finish together (padding
  // leaves blocks of very different sizes); the order does not change any
  // block's result.
  std::vector<GemmBlock> blocks_ = blocks();
  std::stable_sort(blocks_.begin(), blocks_.end(), [](const GemmBlock& a, const GemmBlock& b) {
    return static_cast<double>(a.M) * a.N * a.K > static_cast<double>(b.M) * b.N * b.K;
  });
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

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  if (omp_in_parallel()) {  // already on one of mha's threads: one block, here
    if (blas_threads() != 1) set_blas_threads(1);
    blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  GemmBatch batch;
  batch.add(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  batch.run();
}

void parallel_sgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc) {
  GemmBatch batch;
  batch.add(M, N, K, A, lda, B, ldb, trans_b, bias, C, ldc);
  batch.run();
}

}  // namespace mha::cpu
