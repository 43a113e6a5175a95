// src/cpu/gemm/gemm_amx_tiles.h: the tile code of the AMX product
// (gemm_amx.h): rounding to bfloat16 in zmm registers, the packing of op(B)
// and op(A) into 16 x 32 bfloat16 tiles, the 2 x 2-tile kernel and the
// write-back of C (the drivers: gemm_amx_driver.h). Included by
// gemm_amx.cpp inside its amx-tile/amx-bf16/avx512f target region only.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "cpu/gemm/gemm_amx.h"

namespace mha::cpu::amx {

// core::to_bf16 on 16 lanes: each lane's low 16 bits the bfloat16 (nearest,
// ties to even; NaN kept quiet), high bits zero.
inline __m512i round_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i top = _mm512_srli_epi32(u, 16);
  const __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(top, _mm512_set1_epi32(0x40)));
}

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

// 32 consecutive floats from src, those past `n` read as zero, rounded: as
// 16 words, word r = bf16(src[2r]) | bf16(src[2r + 1]) << 16 (one tile row).
inline __m512i round_pairs(const float* src, int64_t n) {
  const __m256i lo = _mm512_cvtepi32_epi16(round_bits(_mm512_maskz_loadu_ps(first_lanes(n), src)));
  const __m256i hi = _mm512_cvtepi32_epi16(round_bits(_mm512_maskz_loadu_ps(first_lanes(n - 16), src + 16)));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Two rows of 16 floats (k and k+1 of 16 columns or rows) -> 16 words,
// word c = bf16(even[c]) | bf16(odd[c]) << 16.
inline __m512i pair_rows(__m512 even, __m512 odd) {
  return _mm512_or_si512(round_bits(even), _mm512_slli_epi32(round_bits(odd), 16));
}

// x[i] lane j <-> x[j] lane i: a 16 x 16 transpose of 32-bit words, in
// registers (unpacks within 128-bit lanes, then lane shuffles), so that
// every tile row is written whole. Against 16 scatters of 16 words (the
// first version) on the loaded machine: packing a 768 x 768 op(B) = B^T
// took 336 against 457 us, the toy 100 x 100 5.3 against 4.8-6.1 us: within
// the noise; there packing is bound by reading B (2.4 MB, past L2) and by
// the rounding (~7 instructions per 16 values), not by the stores.
inline void transpose_words(__m512i (&x)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // t[i], t[i+1]: rows i, i+1 interleaved (words 0,1 / 2,3 of each lane)
    t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + e], lane L: rows g..g+3, word 4L + e
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i even_lo = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88);   // lanes 0, 2 of rows 0-3, 4-7
    const __m512i odd_lo = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd);    // lanes 1, 3
    const __m512i even_hi = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88);
    const __m512i odd_hi = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
    x[e] = _mm512_shuffle_i32x4(even_lo, even_hi, 0x88);       // word e (lane 0)
    x[8 + e] = _mm512_shuffle_i32x4(even_lo, even_hi, 0xdd);   // word 8 + e (lane 2)
    x[4 + e] = _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88);     // word 4 + e (lane 1)
    x[12 + e] = _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xdd);    // word 12 + e (lane 3)
  }
}

// One B tile, op(B) = B: k0..k0+31 (to K) by columns j0..j0+cols, B[k,j] at
// B[k*ldb + j]; tile row r = the pairs (k0+2r, k0+2r+1) of 16 columns.
inline void pack_rows_tile(const float* B, int64_t ldb, int64_t j0, int64_t cols, int64_t k0, int64_t K,
                           uint32_t* tile) {
  const __mmask16 m = first_lanes(cols);
  for (int r = 0; r < 16; ++r) {
    const int64_t k = k0 + 2 * r;
    const __m512 even = cols > 0 && k < K ? _mm512_maskz_loadu_ps(m, B + k * ldb + j0) : _mm512_setzero_ps();
    const __m512 odd = cols > 0 && k + 1 < K ? _mm512_maskz_loadu_ps(m, B + (k + 1) * ldb + j0) : _mm512_setzero_ps();
    _mm512_store_si512(tile + r * 16, pair_rows(even, odd));
  }
}

// One B tile, op(B) = B^T: column j of op(B) is row j of B (at rows[j], or
// B + j*ldb), contiguous along k; its 16 words go down tile column c.
inline void pack_columns_tile(const float* B, int64_t ldb, const float* const* rows, int64_t j0, int64_t cols,
                              int64_t k0, int64_t K, uint32_t* tile) {
  __m512i words[16];  // words[c]: column c's 16 k pairs, then transposed
  for (int64_t c = 0; c < 16; ++c)
    words[c] = c < cols ? round_pairs((rows ? rows[j0 + c] : B + (j0 + c) * ldb) + k0, K - k0) : _mm512_setzero_si512();
  transpose_words(words);
  for (int r = 0; r < 16; ++r) _mm512_store_si512(tile + r * 16, words[r]);
}

// op(A) rows i0..i0+mr (mr <= 32) over all `steps` 32-deep steps of K into
// `out`: per step, tile 0 (rows 0-15) then tile 1 (rows 16-31, only when
// mr > 16), 16 rows of 16 k pairs; rows past mr and k past K zero.
inline void pack_a_group(const GemmBlock& g, int64_t i0, int64_t mr, int64_t steps, uint16_t* out) {
  const int halves = mr > 16 ? 2 : 1;
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t k0 = t * 32;
    for (int h = 0; h < halves; ++h) {
      uint32_t* tile = reinterpret_cast<uint32_t*>(out + (t * 2 + h) * 512);
      const int64_t rows = std::clamp<int64_t>(mr - 16 * h, 0, 16);
      if (!g.trans_a) {  // op(A)(i, k) = A[i*lda + k]: a row is contiguous along k
        for (int64_t m = 0; m < 16; ++m)
          _mm512_store_si512(tile + m * 16, m < rows ? round_pairs(g.A + (i0 + 16 * h + m) * g.lda + k0, g.K - k0)
                                                     : _mm512_setzero_si512());
        continue;
      }
      // op(A)(i, k) = A[k*lda + i]: for each k, the rows are contiguous;
      // words[r] lane m = row m's pair r, transposed into tile rows.
      const __mmask16 lanes = first_lanes(rows);
      const float* src = g.A + i0 + 16 * h;
      __m512i words[16];
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t k = k0 + 2 * r;
        const __m512 even = k < g.K ? _mm512_maskz_loadu_ps(lanes, src + k * g.lda) : _mm512_setzero_ps();
        const __m512 odd = k + 1 < g.K ? _mm512_maskz_loadu_ps(lanes, src + (k + 1) * g.lda) : _mm512_setzero_ps();
        words[r] = pair_rows(even, odd);
      }
      transpose_words(words);
      for (int m = 0; m < 16; ++m) _mm512_store_si512(tile + m * 16, words[m]);
    }
  }
}

// Tiles 0-3: the 2 x 2 accumulators (rows 0-15 / 16-31 by columns 0-15 /
// 16-31); 4, 5: A; 6, 7: B. 16 rows of 64 bytes each.
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Loaded at every call of run() (one per row block) rather than once per
// thread (the toy 10 x 100 x 100 call, B packed: ~2 us, 97-120 GFLOP/s
// either way, one thread, loaded machine): another library on the
// same thread (oneDNN inside PyTorch, in the Python module's process) may
// load its own tile config or release the tiles (tilerelease), after which
// a tile load with our stale assumption would fault.
inline void configure_tiles() {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// acc:[32,32] (R = 2) or its first 16 rows (R = 1) = the A group (packed by
// pack_a_group) times one B panel, all `steps` steps accumulated in tiles,
// from zero, in order: the same sums for a row whichever group it is in.
template <int R>
void panel_tiles(int64_t steps, const uint16_t* a, const uint16_t* b, float* acc) {
  // The tile loads and stores are asm the compiler cannot see into.
  __asm__ volatile("" ::: "memory");
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (R == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t t = 0; t < steps; ++t, a += 1024, b += 1024) {
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (R == 2) {
      _tile_loadd(5, a + 512, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, acc, 128);
  _tile_stored(1, acc + 16, 128);
  if constexpr (R == 2) {
    _tile_stored(2, acc + 512, 128);
    _tile_stored(3, acc + 528, 128);
  }
  __asm__ volatile("" ::: "memory");
}

// C rows i0..i0+rows, columns j0..j0+cols = alpha acc + (bias, or beta C);
// the same operations, in the same order, as update() in gemm_impl.h.
inline void write_back(const GemmBlock& g, const float* acc, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  const __m512 alpha = _mm512_set1_ps(g.alpha), beta = _mm512_set1_ps(g.beta);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const __mmask16 m = first_lanes(cols - c0);
      __m512 r = _mm512_load_ps(acc + i * 32 + c0);
      if (g.alpha != 1.0f) r = _mm512_mul_ps(alpha, r);
      float* c = g.C + (i0 + i) * g.ldc + j0 + c0;
      if (g.bias) r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, g.bias + j0 + c0), r);
      else if (g.beta == 1.0f) r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), r);
      else if (g.beta != 0.0f) r = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m, c), r);
      _mm512_mask_storeu_ps(c, m, r);
    }
}

// Panel p of op(B):[K,N] (columns 32p..32p+31, zero past N) into `out`:
// steps x 2 tiles, step-major (PackedBf16B's layout of one panel).
inline void pack_panel(bool trans_b, const float* B, int64_t ldb, const float* const* rows, int64_t K, int64_t N,
                       int64_t p, uint16_t* out) {
  const int64_t steps = (K + 31) / 32;
  for (int64_t t = 0; t < steps; ++t)
    for (int h = 0; h < 2; ++h) {
      const int64_t jh = p * 32 + 16 * h, cols = std::clamp<int64_t>(N - jh, 0, 16);
      uint32_t* tile = reinterpret_cast<uint32_t*>(out + (t * 2 + h) * 512);
      if (trans_b) pack_columns_tile(B, ldb, rows, jh, cols, t * 32, K, tile);
      else pack_rows_tile(B, ldb, jh, cols, t * 32, K, tile);
    }
}

}  // namespace mha::cpu::amx
