#include "cpu/gemm/parallel_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <memory>

#include "core/parallel.h"
#include "cpu/blas/blas.h"
#include "cpu/gemm/few_rows.h"
#include "cpu/gemm/gemm_schedule.h"
#include "cpu/gemm/packed_weight.h"
#include "mha/threads.h"

namespace mha::cpu {

int64_t gemm_row_block(int64_t M) {
  constexpr int64_t kUnit = 192;
  const int64_t eighth = (M + 7) / 8;
  return std::clamp<int64_t>((eighth + kUnit - 1) / kUnit * kUnit, kUnit, 6 * kUnit);
}

void GemmBatch::add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  products_.push_back({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, C, ldc});
  rows_.emplace_back();
  packed_.push_back(nullptr);
  epilogues_.emplace_back();
}

void GemmBatch::add(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  products_.push_back({false, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, bias, C, ldc});
  rows_.emplace_back();
  packed_.push_back(nullptr);
  epilogues_.emplace_back();
}

bool dot_products_serve(int64_t M, Precision precision) {
  return M <= kDotProductMaxRows && precision == Precision::Float32;
}

void GemmBatch::add_dot_products(int64_t M, const float* A, int64_t lda, const float* W, int64_t N, int64_t K,
                                 const float* bias, float* C, int64_t ldc, RowEpilogue epilogue) {
  if (M <= 0 || N <= 0) return;
  assert(dot_products_serve(M, precision_));
  dots_.push_back({M, N, K, A, W, bias, lda, C, ldc, epilogue});
}

void GemmBatch::add_packed(int64_t M, const float* A, int64_t lda, const PackedWeight& w, const float* bias,
                           float* C, int64_t ldc, RowEpilogue epilogue) {
  if (M <= 0) return;
  assert(w.precision == precision_ && w.current());
  // B is not read (the packing is); it stays null, so no other product
  // shares this one's B by address.
  products_.push_back({false, true, M, w.N, w.K, 1.0f, A, lda, nullptr, w.K, 0.0f, bias, C, ldc});
  rows_.emplace_back();
  packed_.push_back(&w);
  epilogues_.push_back(epilogue);
}

void GemmBatch::add_stacked(int64_t M, int64_t K, const float* A, int64_t lda,
                            const std::vector<std::pair<const float*, int64_t>>& weights,
                            const float* bias, float* C, int64_t ldc) {
  std::vector<const float*> rows;
  for (const auto& [w, n] : weights)
    for (int64_t j = 0; j < n; ++j) rows.push_back(w + j * K);
  const int64_t N = static_cast<int64_t>(rows.size());
  if (M <= 0 || N <= 0) return;
  products_.push_back({false, true, M, N, K, 1.0f, A, lda, rows[0], K, 0.0f, bias, C, ldc});
  rows_.push_back(std::move(rows));
  packed_.push_back(nullptr);
  epilogues_.emplace_back();
}

namespace {

bool same_b(const GemmBlock& x, const std::vector<const float*>& x_rows, const GemmBlock& y,
            const std::vector<const float*>& y_rows) {
  return x.B == y.B && x.ldb == y.ldb && x.trans_b == y.trans_b && x.K == y.K && x.N == y.N &&
         x_rows == y_rows;
}

}  // namespace

bool GemmBatch::shares_b(size_t x, size_t y) const {
  if (packed_[x] || packed_[y]) return packed_[x] == packed_[y];
  return same_b(products_[x], rows_[x], products_[y], rows_[y]);
}

void GemmBatch::run() const { run_on(num_threads()); }

void GemmBatch::run_on(int threads) const {
  run_dots(threads);
  if (precision_ == Precision::BFloat16) run_bfloat16(threads);
  else run_float32(threads);
}

void GemmBatch::run_dots(int threads) const {
  for (const DotProduct& p : dots_) {
    const double work = static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K);
    dot_product_rows(p.A, p.M, p.lda, p.K, p.W, p.N, p.bias, p.C, p.ldc,
                     work < kDotProductMinParallelWork ? 1 : threads);
    if (p.epilogue) p.epilogue(p.C, p.ldc, 0, p.M);  // a few rows (a decode step's), just written
  }
}

void GemmBatch::run_float32(int threads) const {
  if (products_.empty()) return;
  // The micro-kernels do ~10x the work of a plain loop in the same time, so
  // products below 2e6 multiply-adds run on the calling thread (the d2l
  // chapter's toy shape: 2e5).
  constexpr double kFloat32Speed = 10;
  const int team = gemm_team(products_, kFloat32Speed, threads);
  if (team == 1 && products_.size() == 1 && rows_[0].empty() && !packed_[0]) {
    // One small product: straight to the kernels, without the schedule's
    // bookkeeping (the same kernels and blocking, so the same bits; the d2l
    // chapter's toy product, 8 x 100 x 100: ~1 us of its ~3).
    gemm(products_[0]);
    return;
  }
  const GemmBackend<PackedB> float32{gemm_unpacked_max_rows(), gemm_panel_width(), gemm_packed, gemm_unpacked};
  run_gemm_schedule(
      float32, products_, rows_, [this](size_t x, size_t y) { return shares_b(x, y); },
      [this](size_t i) { return packed_[i] ? packed_[i]->panels.get() : nullptr; }, epilogues_, team);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc, Precision precision) {
  if (omp_in_parallel() && precision == Precision::Float32) {  // already on one of mha's threads: here
    gemm({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, C, ldc});
    return;
  }
  GemmBatch batch(precision);
  batch.add(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  // Inside a parallel region (one of mha's threads): on this thread alone,
  // no nested team.
  batch.run_on(omp_in_parallel() ? 1 : num_threads());
}

void parallel_sgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc, Precision precision) {
  GemmBatch batch(precision);
  // A row or so against a weight: dot products over its rows, as a decode
  // step's projections run (few_rows.h; a packing per call would read the
  // weight twice).
  if (trans_b && ldb == K && dot_products_serve(M, precision))
    batch.add_dot_products(M, A, lda, B, N, K, bias, C, ldc, {});
  else
    batch.add(M, N, K, A, lda, B, ldb, trans_b, bias, C, ldc);
  batch.run();
}

}  // namespace mha::cpu
