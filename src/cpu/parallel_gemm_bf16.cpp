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
  // a few panels at a time; one that serves at most kUnpackedMaxRows rows in
  // all is never packed whole (gemm_amx_unpacked: each job packs its panels
  // into a thread-local buffer as its rows pass them; the same bits). On the
  // loaded machine, best of 10 samples, unpacked against packed: the toy
  // call 27.5 / 23.0 GFLOP/s, 8 x 2304 x 768 36.5 / 23.0, 1 x 768 x 768 3.3
  // / 3.9 at 1 thread and 7.0 / 4.1 at 2 (its panels split over threads):
  // mostly noise, but it never copies a whole weight for one row.
  constexpr int64_t kUnpackedMaxRows = 32;
  std::vector<size_t> pack_of(products_.size()), firsts;
  for (size_t i = 0; i < products_.size(); ++i) {
    size_t p = 0;
    while (p < firsts.size() && !shares_b(firsts[p], i)) ++p;
    if (p == firsts.size()) firsts.push_back(i);
    pack_of[i] = p;
  }
  std::vector<int64_t> rows_of(firsts.size(), 0);
  for (size_t i = 0; i < products_.size(); ++i) rows_of[pack_of[i]] += products_[i].M;
  std::vector<std::unique_ptr<PackedBf16B>> packs(firsts.size());
  struct PackJob {
    size_t pack;
    int64_t panel0, panel1;
  };
  std::vector<PackJob> pack_jobs;
  constexpr int64_t kPanelsPerJob = 4;  // 128 columns
  for (size_t p = 0; p < firsts.size(); ++p) {
    if (rows_of[p] <= kUnpackedMaxRows) continue;
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

  // Row blocks fixed by the batch's shapes (gemm_row_block), and the
  // unpacked products' panel ranges; largest first.
  struct Job {
    GemmBlock block;
    const PackedBf16B* b;                 // null: gemm_amx_unpacked over *group
    const std::vector<GemmBlock>* group;  // the products sharing an unpacked B
    const float* const* rows;
    int64_t panel0, panel1;
    double work() const {
      double m = static_cast<double>(block.M);
      if (!b) {
        m = 0;
        for (const GemmBlock& g : *group) m += static_cast<double>(g.M);
      }
      const double cols = b ? static_cast<double>(block.N)
                            : static_cast<double>(std::min(block.N, panel1 * 32) - panel0 * 32);
      return m * cols * static_cast<double>(block.K);
    }
  };
  std::vector<Job> jobs;
  std::vector<std::vector<GemmBlock>> groups(firsts.size());
  for (size_t i = 0; i < products_.size(); ++i)
    if (!packs[pack_of[i]]) groups[pack_of[i]].push_back(products_[i]);
  for (size_t p = 0; p < firsts.size(); ++p) {
    if (packs[p]) continue;
    const GemmBlock& g = products_[firsts[p]];
    const int64_t panels = (g.N + 31) / 32;
    for (int64_t j = 0; j < panels; j += kPanelsPerJob)
      jobs.push_back({g, nullptr, &groups[p], rows_[firsts[p]].empty() ? nullptr : rows_[firsts[p]].data(), j,
                      std::min(j + kPanelsPerJob, panels)});
  }
  const int64_t rows = gemm_row_block(total);
  for (size_t i = 0; i < products_.size(); ++i) {
    const GemmBlock& g = products_[i];
    if (!packs[pack_of[i]]) continue;
    const int64_t a_step = g.trans_a ? 1 : g.lda;  // where row r of op(A) starts: A + r * a_step
    for (int64_t r0 = 0; r0 < g.M; r0 += rows) {
      GemmBlock b = g;
      b.M = std::min(rows, g.M - r0);
      b.A = g.A + r0 * a_step;
      b.C = g.C + r0 * g.ldc;
      jobs.push_back({b, packs[pack_of[i]].get(), nullptr, nullptr, 0, 0});
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.work() > b.work(); });
  const int64_t n = static_cast<int64_t>(jobs.size());
  core::parallel_for(n, static_cast<int>(std::min<int64_t>(team, n)), [&](int64_t i) {
    const Job& j = jobs[static_cast<size_t>(i)];
    if (j.b) gemm_amx_packed(j.block, *j.b);
    else gemm_amx_unpacked(j.group->data(), static_cast<int64_t>(j.group->size()), j.rows, j.panel0, j.panel1);
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
