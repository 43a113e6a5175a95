// src/cpu/gemm/gemm_impl.h: the blocked driver and the packing of mha's
// product, written once over a micro-kernel type M (gemm_<isa>.cpp):
//
//   struct M {
//     using Tiles = ...;           // gemm_traits.h
//     static constexpr const char* kName;
//     // acc:[MR,NR] = sum over kc steps of a[k*MR + i] * b[k*NR + j]
//     static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
//                      float alpha, float beta);           // full MR x NR tile
//     static void tile_to(int64_t kc, const float* a, const float* b, float* acc);  // acc:[MR*NR]
//     // optional: an edge tile (rows < mr, columns < nr) written directly
//     static void edge(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
//                      int mr, int nr, float alpha, float beta);
//   };
//
// Included by gemm_<isa>.cpp inside its target region, so that the code is
// compiled for that instruction set.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/gemm/gemm_isa.h"

namespace mha::cpu::gemm_kernels {

// C = alpha acc + beta C for one element, the same operations as a full
// vector tile performs (so an element's value does not depend on whether its
// tile is whole): alpha * acc is exact for alpha = 1; beta = 0 never reads C.
inline float update(float acc, float alpha, float beta, const float* c) {
  const float r = alpha == 1.0f ? acc : alpha * acc;
  if (beta == 0.0f) return r;
  if (beta == 1.0f) return *c + r;
  return std::fma(beta, *c, r);
}

template <class M>
struct Driver {
  using T = typename M::Tiles;
  static constexpr int MR = T::MR, NR = T::NR, KC = T::KC, MC = T::MC, NC = T::NC, KA = T::KA;

  static int64_t padded_n(int64_t N) { return (N + NR - 1) / NR * NR; }
  static int64_t packed_b_floats(int64_t K, int64_t N) { return std::max<int64_t>(K, 1) * padded_n(N); }

  // One KC x NR panel of op(B): rows p0..p0+kc, columns j0..j0+NR (zero
  // past N), k-major, at `panel`.
  static void pack_panel(bool trans_b, int64_t N, const float* B, int64_t ldb, const float* const* rows,
                         int64_t p0, int64_t kc, int64_t j0, float* panel) {
    const int64_t nr = std::min<int64_t>(NR, N - j0);
    if (!trans_b) {  // op(B)(k, j) = B[k*ldb + j]: rows copy
      for (int64_t k = 0; k < kc; ++k) {
        const float* src = B + (p0 + k) * ldb + j0;
        float* dst = panel + k * NR;
        std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(nr));
        for (int64_t j = nr; j < NR; ++j) dst[j] = 0.0f;
      }
      return;
    }
    // op(B)(k, j) = B[j*ldb + k]: NR source rows read in step, each panel
    // row written whole (measured 1.1 ns per element from memory, against
    // 1.7 reading one source row at a time).
    const float* src[NR];
    if constexpr (requires { &M::transpose_rows; }) {
      // In registers, 16 x 16 (8 x 8) blocks at a time; columns past N read
      // a row of zeros. Measured on the d2l chapter's toy shape (100 x 100
      // weights, in cache): ~6 instructions per element in the loop below,
      // under one here.
      alignas(64) static const float kZeros[KC] = {};
      for (int64_t j = 0; j < NR; ++j) src[j] = j < nr ? (rows ? rows[j0 + j] : B + (j0 + j) * ldb) + p0 : kZeros;
      M::transpose_rows(src, nr, kc, panel);
      return;
    }
    for (int64_t j = 0; j < NR; ++j) {
      const int64_t row = j0 + std::min<int64_t>(j, nr - 1);
      src[j] = (rows ? rows[row] : B + row * ldb) + p0;
    }
    for (int64_t k = 0; k < kc; ++k) {
      float* dst = panel + k * NR;
      for (int64_t j = 0; j < NR; ++j) dst[j] = j < nr ? src[j][k] : 0.0f;
    }
  }

  // op(B):[K,N] -> for each KC-chunk starting at p0 (rows p0..p0+kc), at
  // offset p0 * padded_n(N): its NR-column panels, each kc x NR, k-major,
  // columns past N zero. Packs the panels [panel0, panel1) of every chunk.
  static void pack_b(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb,
                     const float* const* rows, float* out, int64_t panel0, int64_t panel1) {
    const int64_t Np = padded_n(N);
    for (int64_t p0 = 0; p0 < K; p0 += KC) {
      const int64_t kc = std::min<int64_t>(KC, K - p0);
      for (int64_t j0 = panel0 * NR; j0 < std::min(N, panel1 * NR); j0 += NR)
        pack_panel(trans_b, N, B, ldb, rows, p0, kc, j0, out + p0 * Np + j0 * kc);
    }
  }

  // op(A) rows i0..i0+mc, columns p0..p0+kc -> row panels of MR, each
  // kc x MR, k-major; rows past mc zero.
  static void pack_a(const GemmBlock& g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
    for (int64_t r0 = 0; r0 < mc; r0 += MR) {
      float* panel = out + r0 * kc;
      const int64_t mr = std::min<int64_t>(MR, mc - r0);
      // Rows the micro-kernel reads: MR, or fewer for edge tiles (M::rows_used).
      int64_t used = MR;
      if constexpr (requires { M::rows_used(1); }) used = M::rows_used(static_cast<int>(mr));
      if (!g.trans_a) {  // op(A)(i, k) = A[i*lda + k]
        // Whole panels in registers (M::pack_rows); a few rows' panel (an
        // edge, or a product of a few rows) is copied one by one.
        if constexpr (requires { &M::pack_rows; }) {
          if (mr == MR) {
            const float* src[MR];
            for (int64_t i = 0; i < MR; ++i) src[i] = g.A + (i0 + r0 + i) * g.lda + p0;
            M::pack_rows(src, kc, panel);
            continue;
          }
        }
        for (int64_t i = 0; i < used; ++i) {
          if (i < mr) {
            const float* src = g.A + (i0 + r0 + i) * g.lda + p0;
            for (int64_t k = 0; k < kc; ++k) panel[k * MR + i] = src[k];
          } else {
            for (int64_t k = 0; k < kc; ++k) panel[k * MR + i] = 0.0f;
          }
        }
      } else {  // op(A)(i, k) = A[k*lda + i]: contiguous along i
        for (int64_t k = 0; k < kc; ++k) {
          const float* src = g.A + (p0 + k) * g.lda + i0 + r0;
          float* dst = panel + k * MR;
          for (int64_t i = 0; i < mr; ++i) dst[i] = src[i];
          for (int64_t i = mr; i < used; ++i) dst[i] = 0.0f;
        }
      }
    }
  }

  // C = bias, or beta C, when the sum is empty (K = 0).
  static void empty_sum(const GemmBlock& g) {
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.N; ++j) {
        float* c = g.C + i * g.ldc + j;
        *c = g.bias ? g.bias[j] : g.beta == 0.0f ? 0.0f : g.beta * *c;
      }
  }

  // One A block of every chunk of a sum of at most KA (run()), per thread.
  static float* a_block_buffer() {
    alignas(64) static thread_local float a_all[MC * KA];
    return a_all;
  }
  // One A block per thread, reused by every call on it.
  static float* a_buffer() {
    alignas(64) static thread_local float a_pack[MC * KC];
    return a_pack;
  }

  // C rows i0..i0+mc, columns j0..j0+NR (or to N) from one KC-chunk: A's
  // row panels (packed) past one packed B panel.
  static void panel_rows(const GemmBlock& g, int64_t i0, int64_t mc, int64_t kc, const float* a_pack,
                         const float* b_panel, int64_t j0, float beta_here) {
    const int64_t nr = std::min<int64_t>(NR, g.N - j0);
    for (int64_t r0 = 0; r0 < mc; r0 += MR) {
      const int64_t mr = std::min<int64_t>(MR, mc - r0);
      const float* a_panel = a_pack + r0 * kc;
      float* c = g.C + (i0 + r0) * g.ldc + j0;
      if (mr == MR && nr == NR) {
        M::tile(kc, a_panel, b_panel, c, g.ldc, g.alpha, beta_here);
      } else if constexpr (requires { &M::edge; }) {
        M::edge(kc, a_panel, b_panel, c, g.ldc, static_cast<int>(mr), static_cast<int>(nr), g.alpha, beta_here);
      } else {  // an edge tile: whole in registers, then element-wise
        alignas(64) float acc[MR * NR];
        M::tile_to(kc, a_panel, b_panel, acc);
        for (int64_t i = 0; i < mr; ++i)
          for (int64_t j = 0; j < nr; ++j) {
            float* ce = c + i * g.ldc + j;
            *ce = update(acc[i * NR + j], g.alpha, beta_here, ce);
          }
      }
    }
  }

  // Columns [panel0 * NR, panel1 * NR) (to N) of products gs[0..count)
  // that share op(B) (B, ldb, trans_b, K, N; `rows` as in pack_b), without a
  // PackedB: per KC-chunk, the A rows of as many products as fill one A
  // block are packed once, and each B panel is packed into an L1 buffer just
  // before their row panels pass it. The same packed operands reach the
  // same micro-kernel calls as in run(), so every element has the same bits
  // as there.
  static void run_unpacked(const GemmBlock* gs, int64_t count, const float* const* rows, int64_t panel0,
                           int64_t panel1) {
    if (count <= 0 || gs[0].N <= 0) return;
    const int64_t N = gs[0].N, K = gs[0].K;
    const int64_t j_begin = panel0 * NR, j_end = std::min(N, panel1 * NR);
    if (j_begin >= j_end) return;
    for (int64_t p = 0; p < count; ++p) {  // C = bias, or beta C when the sum is empty
      const GemmBlock& g = gs[p];
      for (int64_t i = 0; i < g.M; ++i) {
        float* c = g.C + i * g.ldc;
        if (g.bias)
          std::memcpy(c + j_begin, g.bias + j_begin, sizeof(float) * static_cast<size_t>(j_end - j_begin));
        else if (K <= 0)
          for (int64_t j = j_begin; j < j_end; ++j) c[j] = g.beta == 0.0f ? 0.0f : g.beta * c[j];
      }
    }
    if (K <= 0) return;
    // Pieces of at most MC rows, in product order; a run of pieces whose
    // row panels fit one A block shares each B panel.
    struct Piece {
      const GemmBlock* g;
      int64_t i0, mc, at;  // rows i0..i0+mc of *g, at row `at` of the A block
    };
    std::vector<Piece> pieces;
    for (int64_t p = 0; p < count; ++p)
      for (int64_t i0 = 0; i0 < gs[p].M; i0 += MC) pieces.push_back({&gs[p], i0, std::min<int64_t>(MC, gs[p].M - i0), 0});
    float* a_pack = a_buffer();
    alignas(64) static thread_local float b_panel[KC * NR];
    for (size_t first = 0; first < pieces.size();) {
      size_t last = first;
      int64_t used = 0;
      while (last < pieces.size() && used + (pieces[last].mc + MR - 1) / MR * MR <= MC) {
        pieces[last].at = used;
        used += (pieces[last].mc + MR - 1) / MR * MR;
        ++last;
      }
      for (int64_t p0 = 0; p0 < K; p0 += KC) {
        const int64_t kc = std::min<int64_t>(KC, K - p0);
        for (size_t q = first; q < last; ++q) pack_a(*pieces[q].g, pieces[q].i0, pieces[q].mc, p0, kc, a_pack + pieces[q].at * kc);
        for (int64_t j0 = j_begin; j0 < j_end; j0 += NR) {
          pack_panel(gs[0].trans_b, N, gs[0].B, gs[0].ldb, rows, p0, kc, j0, b_panel);
          for (size_t q = first; q < last; ++q) {
            const Piece& pc = pieces[q];
            // A bias is C's starting value (beta 1); later chunks add to C.
            const float beta_here = p0 > 0 || pc.g->bias ? 1.0f : pc.g->beta;
            panel_rows(*pc.g, pc.i0, pc.mc, kc, a_pack + pc.at * kc, b_panel, j0, beta_here);
          }
        }
      }
      first = last;
    }
  }

  static void run(const GemmBlock& g, const float* packed_b) {
    if (g.M <= 0 || g.N <= 0) return;
    if (g.K <= 0) return empty_sum(g);
    // A bias is C's starting value: written first, then added to (beta 1).
    float beta = g.beta;
    if (g.bias) {
      for (int64_t i = 0; i < g.M; ++i) std::memcpy(g.C + i * g.ldc, g.bias, sizeof(float) * g.N);
      beta = 1.0f;
    }
    const int64_t Np = padded_n(g.N);
    if (g.K <= KA) {
      // Each A block packed once for the whole sum (all its KC-chunks),
      // then C in slices of NC columns: a slice's MC x NC block of C stays
      // in L2 while every chunk adds to it (gemm_traits.h: why).
      float* a_all = a_block_buffer();
      for (int64_t i0 = 0; i0 < g.M; i0 += MC) {
        const int64_t mc = std::min<int64_t>(MC, g.M - i0), mc_pad = (mc + MR - 1) / MR * MR;
        for (int64_t p0 = 0; p0 < g.K; p0 += KC)
          pack_a(g, i0, mc, p0, std::min<int64_t>(KC, g.K - p0), a_all + p0 * mc_pad);
        for (int64_t jc = 0; jc < g.N; jc += NC) {
          const int64_t j_end = std::min<int64_t>(g.N, jc + NC);
          for (int64_t p0 = 0; p0 < g.K; p0 += KC) {
            const int64_t kc = std::min<int64_t>(KC, g.K - p0);
            // The first chunk scales C by beta; later ones add to it.
            const float beta_here = p0 == 0 ? beta : 1.0f;
            const float* b_chunk = packed_b + p0 * Np;
            for (int64_t j0 = jc; j0 < j_end; j0 += NR)
              panel_rows(g, i0, mc, kc, a_all + p0 * mc_pad, b_chunk + j0 * kc, j0, beta_here);
          }
        }
      }
      return;
    }
    float* a_pack = a_buffer();
    for (int64_t i0 = 0; i0 < g.M; i0 += MC) {
      const int64_t mc = std::min<int64_t>(MC, g.M - i0);
      for (int64_t p0 = 0; p0 < g.K; p0 += KC) {
        const int64_t kc = std::min<int64_t>(KC, g.K - p0);
        pack_a(g, i0, mc, p0, kc, a_pack);
        // The first chunk scales C by beta; later ones add to it.
        const float beta_here = p0 == 0 ? beta : 1.0f;
        const float* b_chunk = packed_b + p0 * Np;
        for (int64_t j0 = 0; j0 < g.N; j0 += NR)
          panel_rows(g, i0, mc, kc, a_pack, b_chunk + j0 * kc, j0, beta_here);
      }
    }
  }

  static constexpr IsaGemm table() {
    return {M::kName, NR, KC, MC, &packed_b_floats, &pack_b, &run, &run_unpacked};
  }
};

}  // namespace mha::cpu::gemm_kernels
