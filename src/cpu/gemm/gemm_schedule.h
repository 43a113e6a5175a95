// src/cpu/gemm/gemm_schedule.h: how GemmBatch runs its products on mha's threads,
// written once for either packed right-hand matrix: float32 (PackedB,
// cpu/gemm/gemm.h) and bfloat16 on AMX tiles (PackedBf16B,
// cpu/gemm/gemm_amx.h).
//
// 0. A product whose right-hand matrix comes packed (given(i), a weight
//    packed once per version: cpu/gemm/packed_weight.h) reads that packing.
// 1. Products that read the same right-hand matrix share one packing (the
//    projections of padded batch rows are one product per row, all reading
//    the same weight); each packing is made on every thread, a few column
//    panels at a time (packing reads the whole matrix from memory).
// 2. A right-hand matrix that serves at most backend.max_unpacked_rows
//    rows in all is never packed whole: its products run a few panels per
//    job, each job passing all their rows (backend.run_unpacked; the same
//    bits as the packed path).
// 3. The other products are cut into row blocks of gemm_row_block(total
//    rows of the batch): fixed by the shapes, so a product that padding cut
//    into short pieces stays one block per piece, and the results do not
//    depend on the thread count.
// 4. Jobs run largest first on `team` threads, so that the threads finish
//    together; the order changes no block's result.
// 5. A product's row epilogue (RowEpilogue, parallel_gemm.h) runs on each
//    piece of kEpiloguePiece rows of its row blocks right after the piece,
//    in the same job. Only products with a given packing (step 0, never run
//    unpacked) carry one.
//
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "cpu/gemm/gemm.h"
#include "cpu/gemm/parallel_gemm.h"

namespace mha::cpu {

// The team for `products`: the one rule (core/parallel.h) on their
// multiply-adds scaled down by `speed`, how many times a plain loop's work
// the backend's kernels do in the same time.
inline int gemm_team(const std::vector<GemmBlock>& products, double speed, int threads) {
  double work = 0;
  for (const GemmBlock& g : products)
    work += static_cast<double>(g.M) * static_cast<double>(g.N) * static_cast<double>(g.K);
  return core::worth_a_team(work / speed) ? threads : 1;
}

// Rows per epilogue call (step 5): a row block of a product with an epilogue
// runs as pieces of this many rows, each followed by its epilogue. 192 rows
// of a 768-wide q projection are 576 KiB, within L2; a whole row block
// (up to 1152 rows, 3.5 MiB) is not. Measured on rotary q and k (one
// thread, the 2-core development machine under load 3-8): self-attention
// project_qkv alone, then with apply_rotary over q and k afterwards, with
// the epilogue per row block and per 192-row piece, 31 rounds alternating
// the four; rotary's cost over the projections alone, median of the
// per-round differences: B8 L512 E768 h12 (projections ~85 ms unloaded):
// separate pass +11.0 ms, epilogue per row block +12.1, per 192-row piece
// +5.6; B1 L4096 E512 h8 (~37 ms): +13.3, +7.2, +3.0.
inline constexpr int64_t kEpiloguePiece = 192;

// A backend: its kernels and the shape of its packing. Pack is its packed
// op(B): Pack(K, N), panels(), and pack(trans_b, B, ldb, panel0, panel1,
// rows) packing panels [panel0, panel1).
template <class Pack>
struct GemmBackend {
  int64_t max_unpacked_rows;  // step 2
  int64_t panel_width;        // columns per panel
  void (*run_packed)(const GemmBlock& block, const Pack& b);
  void (*run_unpacked)(const GemmBlock* g, int64_t count, const float* const* rows, int64_t panel0,
                       int64_t panel1);
};

// products[i] reads B rows at b_rows[i] (stacked weights) or as its B, ldb,
// or, where given(i) is not null, the packing given(i); shares_b(x, y):
// products x and y read the same right-hand matrix; epilogues[i]: product
// i's row epilogue (or none).
template <class Pack, class SharesB, class Given>
void run_gemm_schedule(const GemmBackend<Pack>& backend, const std::vector<GemmBlock>& products,
                       const std::vector<std::vector<const float*>>& b_rows, const SharesB& shares_b,
                       const Given& given, const std::vector<RowEpilogue>& epilogues, int team) {
  const auto rows_ptr = [&](size_t i) { return b_rows[i].empty() ? nullptr : b_rows[i].data(); };
  std::vector<size_t> pack_of(products.size());
  std::vector<size_t> firsts;  // the product each packing is made from
  for (size_t i = 0; i < products.size(); ++i) {
    size_t p = 0;
    while (p < firsts.size() && !shares_b(firsts[p], i)) ++p;
    if (p == firsts.size()) firsts.push_back(i);
    pack_of[i] = p;
  }
  std::vector<int64_t> rows_of(firsts.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < products.size(); ++i) {
    rows_of[pack_of[i]] += products[i].M;
    total += products[i].M;
  }

  std::vector<const Pack*> packs(firsts.size(), nullptr);  // null: runs unpacked
  std::vector<std::unique_ptr<Pack>> made(firsts.size());   // the packings made here
  struct PackJob {
    size_t pack;
    int64_t panel0, panel1;
  };
  std::vector<PackJob> pack_jobs;
  constexpr int64_t kPanelsPerJob = 4;
  for (size_t p = 0; p < firsts.size(); ++p) {
    if ((packs[p] = given(firsts[p]))) continue;
    if (rows_of[p] <= backend.max_unpacked_rows) continue;
    const GemmBlock& g = products[firsts[p]];
    made[p] = std::make_unique<Pack>(g.K, g.N);
    packs[p] = made[p].get();
    for (int64_t j = 0; j < made[p]->panels(); j += kPanelsPerJob)
      pack_jobs.push_back({p, j, std::min(j + kPanelsPerJob, made[p]->panels())});
  }
  core::parallel_for(static_cast<int64_t>(pack_jobs.size()), team, [&](int64_t i) {
    const PackJob& j = pack_jobs[static_cast<size_t>(i)];
    const GemmBlock& g = products[firsts[j.pack]];
    made[j.pack]->pack(g.trans_b, g.B, g.ldb, j.panel0, j.panel1, rows_ptr(firsts[j.pack]));
  });

  // A row block against a packed B, or (b null) the columns [panel0, panel1)
  // of the products that share an unpacked B.
  struct Job {
    GemmBlock block;
    const Pack* b;
    const std::vector<GemmBlock>* group;
    const float* const* rows;
    int64_t panel0, panel1;
    const RowEpilogue* epilogue;  // a row block's (null: none)
    int64_t r0;                   // the block's first row in its product
    double work(int64_t w) const {  // w: the backend's panel width
      if (b) return static_cast<double>(block.M) * static_cast<double>(block.N) * static_cast<double>(block.K);
      const int64_t cols = std::min(block.N, panel1 * w) - panel0 * w;
      double rows = 0;
      for (const GemmBlock& g : *group) rows += static_cast<double>(g.M);
      return rows * static_cast<double>(cols) * static_cast<double>(block.K);
    }
  };
  std::vector<Job> jobs;
  std::vector<std::vector<GemmBlock>> groups(firsts.size());  // products of each unpacked B, in batch order
  for (size_t i = 0; i < products.size(); ++i)
    if (!packs[pack_of[i]]) groups[pack_of[i]].push_back(products[i]);
  const int64_t w = backend.panel_width;
  for (size_t p = 0; p < firsts.size(); ++p) {
    if (packs[p]) continue;
    const GemmBlock& g = products[firsts[p]];
    const int64_t panels = (g.N + w - 1) / w;
    for (int64_t j = 0; j < panels; j += kPanelsPerJob)
      jobs.push_back({g, nullptr, &groups[p], rows_ptr(firsts[p]), j, std::min(j + kPanelsPerJob, panels), nullptr, 0});
  }
  const int64_t rows = gemm_row_block(total);
  for (size_t i = 0; i < products.size(); ++i) {
    const GemmBlock& g = products[i];
    if (!packs[pack_of[i]]) continue;
    const int64_t a_step = g.trans_a ? 1 : g.lda;  // row r of op(A) starts at A + r * a_step
    const RowEpilogue* epilogue = epilogues[i] ? &epilogues[i] : nullptr;  // only given packings have one
    for (int64_t r0 = 0; r0 < g.M; r0 += rows) {
      GemmBlock b = g;
      b.M = std::min(rows, g.M - r0);
      b.A = g.A + r0 * a_step;
      b.C = g.C + r0 * g.ldc;
      jobs.push_back({b, packs[pack_of[i]], nullptr, nullptr, 0, 0, epilogue, r0});
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [w](const Job& a, const Job& b) { return a.work(w) > b.work(w); });
  const int64_t n = static_cast<int64_t>(jobs.size());
  core::parallel_for(n, static_cast<int>(std::min<int64_t>(team, n)), [&](int64_t i) {
    const Job& j = jobs[static_cast<size_t>(i)];
    if (j.b && j.epilogue) {
      // The block in pieces of kEpiloguePiece rows, each followed by the
      // epilogue while still in L2 (the kernels finish MC <= 192 rows at a
      // time; a row's bits do not depend on where its block starts).
      const int64_t a_step = j.block.trans_a ? 1 : j.block.lda;
      for (int64_t s = 0; s < j.block.M; s += kEpiloguePiece) {
        GemmBlock sub = j.block;
        sub.M = std::min(kEpiloguePiece, j.block.M - s);
        sub.A = j.block.A + s * a_step;
        sub.C = j.block.C + s * j.block.ldc;
        backend.run_packed(sub, *j.b);
        (*j.epilogue)(sub.C, sub.ldc, j.r0 + s, sub.M);
      }
    } else if (j.b) {
      backend.run_packed(j.block, *j.b);
    } else {
      backend.run_unpacked(j.group->data(), static_cast<int64_t>(j.group->size()), j.rows, j.panel0, j.panel1);
    }
  });
}

}  // namespace mha::cpu
