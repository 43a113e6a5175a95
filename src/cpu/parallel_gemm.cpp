#include "cpu/parallel_gemm.h"

#include <omp.h>

#include <algorithm>
#include <memory>

#include "core/parallel.h"
#include "cpu/blas.h"
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
}

void GemmBatch::add(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  products_.push_back({false, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, bias, C, ldc});
  rows_.emplace_back();
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
}

namespace {

// A row block against a packed B, or (b null) the columns [panel0, panel1)
// of products that share a B run without a PackedB (gemm_unpacked).
struct Job {
  GemmBlock block;
  const PackedB* b;
  const std::vector<GemmBlock>* group;  // with b null: the products sharing B
  const float* const* rows;
  int64_t panel0, panel1;
  double work() const {
    if (b) return static_cast<double>(block.M) * static_cast<double>(block.N) * static_cast<double>(block.K);
    const int64_t w = gemm_panel_width();
    const int64_t cols = std::min(block.N, panel1 * w) - panel0 * w;
    double rows = 0;
    for (const GemmBlock& g : *group) rows += static_cast<double>(g.M);
    return rows * static_cast<double>(cols) * static_cast<double>(block.K);
  }
};

bool same_b(const GemmBlock& x, const std::vector<const float*>& x_rows, const GemmBlock& y,
            const std::vector<const float*>& y_rows) {
  return x.B == y.B && x.ldb == y.ldb && x.trans_b == y.trans_b && x.K == y.K && x.N == y.N &&
         x_rows == y_rows;
}

}  // namespace

bool GemmBatch::shares_b(size_t x, size_t y) const {
  return same_b(products_[x], rows_[x], products_[y], rows_[y]);
}

void GemmBatch::run() const { run_on(num_threads()); }

void GemmBatch::run_on(int threads) const {
  if (precision_ == Precision::BFloat16) run_bfloat16(threads);
  else run_float32(threads);
}

void GemmBatch::run_float32(int threads) const {
  if (products_.empty()) return;
  // Products smaller than this (multiply-adds) run on the calling thread:
  // waking a team costs more than they take (the d2l chapter's toy shape:
  // 2e5).
  constexpr double kMinParallelWork = 2e6;
  double work = 0;
  for (const GemmBlock& g : products_) work += static_cast<double>(g.M) * g.N * g.K;
  const int team = work < kMinParallelWork ? 1 : threads;

  // Each distinct right-hand matrix packed once (the projections of padded
  // batch rows are one product per row, all reading the same weight).
  std::vector<size_t> pack_of(products_.size());
  std::vector<size_t> firsts;  // the product each packing is made from
  for (size_t i = 0; i < products_.size(); ++i) {
    size_t p = 0;
    while (p < firsts.size() && !same_b(products_[firsts[p]], rows_[firsts[p]], products_[i], rows_[i])) ++p;
    if (p == firsts.size()) firsts.push_back(i);
    pack_of[i] = p;
  }
  // A right-hand matrix that serves few rows in all (gemm_unpacked_max_rows)
  // is never packed whole: its products run panel by panel without a
  // PackedB, split by columns.
  std::vector<int64_t> rows_of(firsts.size(), 0);
  for (size_t i = 0; i < products_.size(); ++i) rows_of[pack_of[i]] += products_[i].M;
  std::vector<bool> unpacked(firsts.size());
  for (size_t p = 0; p < firsts.size(); ++p) unpacked[p] = rows_of[p] <= gemm_unpacked_max_rows();
  // Packed on every thread, a few column panels at a time: packing reads
  // the whole right-hand matrix from memory (~0.5-2 ms for 768 x 768).
  std::vector<std::unique_ptr<PackedB>> packs(firsts.size());
  struct PackJob {
    size_t pack;
    int64_t panel0, panel1;
  };
  std::vector<PackJob> pack_jobs;
  constexpr int64_t kPanelsPerJob = 4;
  for (size_t p = 0; p < firsts.size(); ++p) {
    if (unpacked[p]) continue;
    const GemmBlock& g = products_[firsts[p]];
    packs[p] = std::make_unique<PackedB>(g.K, g.N);
    for (int64_t j = 0; j < packs[p]->panels(); j += kPanelsPerJob)
      pack_jobs.push_back({p, j, std::min(j + kPanelsPerJob, packs[p]->panels())});
  }
  core::parallel_for(static_cast<int64_t>(pack_jobs.size()), team, [&](int64_t i) {
    const PackJob& j = pack_jobs[static_cast<size_t>(i)];
    const size_t first = firsts[j.pack];
    const GemmBlock& g = products_[first];
    packs[j.pack]->pack(g.trans_b, g.B, g.ldb, j.panel0, j.panel1,
                        rows_[first].empty() ? nullptr : rows_[first].data());
  });

  // One block size for the whole batch, from its total rows: a product that
  // padding cut into short pieces then stays one block per piece.
  int64_t total = 0;
  for (const GemmBlock& g : products_) total += g.M;
  const int64_t rows = gemm_row_block(total);
  std::vector<Job> jobs;
  // The products of each B that runs without a PackedB, in batch order: one
  // job per few column panels passes all their rows.
  std::vector<std::vector<GemmBlock>> groups(firsts.size());
  for (size_t i = 0; i < products_.size(); ++i)
    if (unpacked[pack_of[i]]) groups[pack_of[i]].push_back(products_[i]);
  const int64_t nr = gemm_panel_width();
  for (size_t p = 0; p < firsts.size(); ++p) {
    if (!unpacked[p]) continue;
    const GemmBlock& g = products_[firsts[p]];
    const int64_t panels = (g.N + nr - 1) / nr;
    for (int64_t j = 0; j < panels; j += kPanelsPerJob)
      jobs.push_back({g, nullptr, &groups[p], rows_[firsts[p]].empty() ? nullptr : rows_[firsts[p]].data(), j,
                      std::min(j + kPanelsPerJob, panels)});
  }
  for (size_t i = 0; i < products_.size(); ++i) {
    const GemmBlock& g = products_[i];
    if (unpacked[pack_of[i]]) continue;
    // Row r of op(A) starts at A + r*lda, or at column r (A + r) when transposed.
    const int64_t a_step = g.trans_a ? 1 : g.lda;
    for (int64_t r0 = 0; r0 < g.M; r0 += rows) {
      GemmBlock b = g;
      b.M = std::min(rows, g.M - r0);
      b.A = g.A + r0 * a_step;
      b.C = g.C + r0 * g.ldc;
      jobs.push_back({b, packs[pack_of[i]].get(), nullptr, nullptr, 0, 0});
    }
  }
  // Largest blocks first, so that the threads finish together (padding
  // leaves blocks of very different sizes); the order does not change any
  // block's result.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.work() > b.work(); });
  const int64_t n = static_cast<int64_t>(jobs.size());
  core::parallel_for(n, static_cast<int>(std::min<int64_t>(team, n)), [&](int64_t i) {
    const Job& j = jobs[static_cast<size_t>(i)];
    if (j.b) gemm_packed(j.block, *j.b);
    else gemm_unpacked(j.group->data(), static_cast<int64_t>(j.group->size()), j.rows, j.panel0, j.panel1);
  });
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
  batch.add(M, N, K, A, lda, B, ldb, trans_b, bias, C, ldc);
  batch.run();
}

}  // namespace mha::cpu
