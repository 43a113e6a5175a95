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

#include "core/bf16.h"
#include "core/parallel.h"
#include "cpu/gemm/gemm_amx.h"
#include "cpu/gemm/gemm_schedule.h"
#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"

namespace mha::cpu {

void GemmBatch::run_bfloat16(int threads) const {
  if (products_.empty()) return;
  if (amx_usable()) run_bfloat16_amx(threads);
  else run_bfloat16_portable(threads);
}

void GemmBatch::run_bfloat16_amx(int threads) const {
  // As in run_float32; the tiles make a product ~4x faster again, hence 40x
  // (products below 8e6 multiply-adds run on the calling thread).
  constexpr double kAmxSpeed = 40;
  const int team = gemm_team(products_, kAmxSpeed, threads);

  // Each distinct right-hand matrix rounded and packed once (gemm_schedule.h);
  // one that serves at most 32 rows in all (`amx` below) is never packed
  // whole (gemm_amx_unpacked: each job packs its panels into a thread-local
  // buffer as its rows pass them; the same bits). On the loaded machine,
  // best of 10 samples, unpacked against packed: the toy call 27.5 / 23.0
  // GFLOP/s, 8 x 2304 x 768 36.5 / 23.0, 1 x 768 x 768 3.3 / 3.9 at 1 thread
  // and 7.0 / 4.1 at 2 (its panels split over threads): mostly noise, but
  // it never copies a whole weight for one row.
  const GemmBackend<PackedBf16B> amx{32, PackedBf16B::kPanel, gemm_amx_packed, gemm_amx_unpacked};
  run_gemm_schedule(
      amx, products_, rows_, [this](size_t x, size_t y) { return shares_b(x, y); },
      [this](size_t i) { return packed_[i] ? packed_[i]->tiles.get() : nullptr; }, epilogues_, team);
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
    for (int64_t c = 0; c < cols; ++c) dst[c] = core::round_to_bf16(src[c]);
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
    if (packed_[i]) {  // packed once, of rounded values (cpu/gemm/packed_weight.h)
      exact.products_.push_back(g);
      exact.rows_.emplace_back();
      exact.packed_.push_back(packed_[i]);
      exact.epilogues_.push_back(epilogues_[i]);
      continue;
    }
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
    exact.packed_.push_back(nullptr);
    exact.epilogues_.push_back(epilogues_[i]);
  }
  exact.run_float32(threads);
}

}  // namespace mha::cpu
