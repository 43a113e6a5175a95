// GemmBatch in bfloat16 (Precision::BFloat16): on AMX tiles where the CPU
// and the OS allow them (cpu/gemm/gemm_amx.h), else the portable path.
//
// Either way each product's rows are computed independently of which block
// or thread computes them, so the results are the same at any thread count.
// The choice between the two paths depends on the machine (and on
// set_amx_enabled), never on the shapes: a row's bits do not change with the
// batch it is in. Measured on products of few rows too (the d2l chapter's
// toy 10 x 100 x 100, decode steps 1 x 768 x 768 and 8 x 2304 x 768, one
// thread), the AMX path is the faster one there as well: 28 / 4.8 / 23
// GFLOP/s against 15 / 2.0 / 15 (gemm_amx.h).
#include <algorithm>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "cpu/bf16.h"
#include "cpu/gemm/gemm_amx.h"
#include "cpu/parallel_gemm.h"

namespace mha::cpu {

void GemmBatch::run_bfloat16(int threads) const {
  if (products_.empty()) return;
  if (amx_usable()) run_bfloat16_amx(threads);
  else run_bfloat16_portable(threads);
}

void GemmBatch::run_bfloat16_amx(int threads) const {
  // Products smaller than this (multiply-adds) run on the calling thread:
  // waking a team costs more than they take (as in run_float32; the tiles
  // make a product ~4x faster, hence 4x the float32 switch).
  constexpr double kMinParallelWork = 8e6;
  double work = 0;
  int64_t total = 0;
  for (const GemmBlock& g : products_) {
    work += static_cast<double>(g.M) * static_cast<double>(g.N) * static_cast<double>(g.K);
    total += g.M;
  }
  const int team = work < kMinParallelWork ? 1 : threads;

  // Each distinct right-hand matrix rounded and packed once, on every thread
  // a few panels at a time.
  std::vector<size_t> pack_of(products_.size()), firsts;
  for (size_t i = 0; i < products_.size(); ++i) {
    size_t p = 0;
    while (p < firsts.size() && !shares_b(firsts[p], i)) ++p;
    if (p == firsts.size()) firsts.push_back(i);
    pack_of[i] = p;
  }
  std::vector<std::unique_ptr<PackedBf16B>> packs(firsts.size());
  struct PackJob {
    size_t pack;
    int64_t panel0, panel1;
  };
  std::vector<PackJob> pack_jobs;
  constexpr int64_t kPanelsPerJob = 4;  // 128 columns
  for (size_t p = 0; p < firsts.size(); ++p) {
    const GemmBlock& g = products_[firsts[p]];
    packs[p] = std::make_unique<PackedBf16B>(g.K, g.N);
    for (int64_t j = 0; j < packs[p]->panels(); j += kPanelsPerJob)
      pack_jobs.push_back({p, j, std::min(j + kPanelsPerJob, packs[p]->panels())});
  }
  core::parallel_for(static_cast<int64_t>(pack_jobs.size()), team, [&](int64_t i) {
    const PackJob& j = pack_jobs[static_cast<size_t>(i)];
    const size_t first = firsts[j.pack];
    const GemmBlock& g = products_[first];
    packs[j.pack]->pack(g.trans_b, g.B, g.ldb, j.panel0, j.panel1, rows_[first].empty() ? nullptr : rows_[first].data());
  });

  // Row blocks fixed by the batch's shapes (gemm_row_block), largest first.
  struct Job {
    GemmBlock block;
    const PackedBf16B* b;
    double work() const {
      return static_cast<double>(block.M) * static_cast<double>(block.N) * static_cast<double>(block.K);
    }
  };
  std::vector<Job> jobs;
  const int64_t rows = gemm_row_block(total);
  for (size_t i = 0; i < products_.size(); ++i) {
    const GemmBlock& g = products_[i];
    const int64_t a_step = g.trans_a ? 1 : g.lda;  // where row r of op(A) starts: A + r * a_step
    for (int64_t r0 = 0; r0 < g.M; r0 += rows) {
      GemmBlock b = g;
      b.M = std::min(rows, g.M - r0);
      b.A = g.A + r0 * a_step;
      b.C = g.C + r0 * g.ldc;
      jobs.push_back({b, packs[pack_of[i]].get()});
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.work() > b.work(); });
  const int64_t n = static_cast<int64_t>(jobs.size());
  core::parallel_for(n, static_cast<int>(std::min<int64_t>(team, n)), [&](int64_t i) {
    const Job& j = jobs[static_cast<size_t>(i)];
    gemm_amx_packed(j.block, *j.b);
  });
}

namespace {

// rows x cols floats, `ld` apart (or at row_starts[r]), rounded to bfloat16
// into a packed copy.
std::vector<float> rounded_copy(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                const float* const* row_starts) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = row_starts ? row_starts[r] : x + r * ld;
    float* dst = out.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) dst[c] = round_to_bf16(src[c]);
  }
  return out;
}

}  // namespace

// The portable bfloat16 product: op(A) and op(B) rounded into copies (each
// distinct right-hand matrix once), then the float32 product on them. The
// products of two bfloat16 values are exact in float32, so this differs from
// a bfloat16 unit's only in the order of the float32 sums.
void GemmBatch::run_bfloat16_portable(int threads) const {
  GemmBatch exact(Precision::Float32);
  std::vector<std::vector<float>> copies;
  std::vector<std::pair<size_t, size_t>> b_copies;  // (product whose B it is, copy)
  for (size_t i = 0; i < products_.size(); ++i) {
    GemmBlock g = products_[i];
    const int64_t a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
    copies.push_back(rounded_copy(g.A, a_rows, a_cols, g.lda, nullptr));
    g.A = copies.back().data();
    g.lda = a_cols;
    size_t b = copies.size();
    for (const auto& [j, c] : b_copies)
      if (shares_b(j, i)) b = c;
    if (b == copies.size()) {
      const int64_t b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
      copies.push_back(rounded_copy(g.B, b_rows, b_cols, g.ldb, rows_[i].empty() ? nullptr : rows_[i].data()));
      b_copies.emplace_back(i, b);
    }
    g.B = copies[b].data();
    g.ldb = g.trans_b ? g.K : g.N;
    exact.products_.push_back(g);
    exact.rows_.emplace_back();
  }
  exact.run_float32(threads);
}

}  // namespace mha::cpu
