// src/cpu/gemm/gemm_amx_driver.h: the drivers of the AMX product (gemm_amx.h)
// over the tile code of gemm_amx_tiles.h: one row block against a packed
// op(B) (run), and products of few rows with op(B) packed panel by panel
// (run_unpacked). Included by gemm_amx.cpp inside its target region only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "cpu/gemm/gemm_amx.h"
#include "cpu/gemm/gemm_amx_tiles.h"

namespace mha::cpu::amx {

// Rows of op(A) rounded and packed at a time; every B panel then passes
// them all (the A block, kRowBlock x K bfloat16, 192 KB at K 768, in L2; a
// B panel, 32 x K, in L1). Measured on the projection 4096 x 768 x 768, B
// packed, one thread: 64, 128, 256 and 512 rows, panels outer or 32-row
// groups outer, each reached 690-790 GFLOP/s at best on the loaded machine
// and ~250 at worst: no choice stood out of the noise, so the middle one.
constexpr int64_t kRowBlock = 128;

struct FreeBuffer {
  void operator()(uint16_t* p) const { std::free(p); }
};

// This thread's buffer `which` (0: the A block, 1: one B panel), at least
// `elements` bfloat16, 64-byte aligned.
inline uint16_t* thread_buffer(int which, size_t elements) {
  thread_local std::unique_ptr<uint16_t[], FreeBuffer> buffers[2];
  thread_local size_t capacities[2] = {0, 0};
  std::unique_ptr<uint16_t[], FreeBuffer>& buffer = buffers[which];
  size_t& capacity = capacities[which];
  if (capacity < elements) {
    buffer.reset(static_cast<uint16_t*>(std::aligned_alloc(64, elements * sizeof(uint16_t))));
    if (!buffer) throw std::bad_alloc();
    capacity = elements;
  }
  return buffer.get();
}

// Columns j0..j1 of C when K = 0: C = bias, or beta C (beta 0 never reads C).
inline void empty_sum(const GemmBlock& g, int64_t j0, int64_t j1) {
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = j0; j < j1; ++j) {
      float* c = g.C + i * g.ldc + j;
      *c = g.bias ? g.bias[j] : g.beta == 0.0f ? 0.0f : g.beta * *c;
    }
}

// C:[M,N] = alpha op(A):[M,K] op(B):[K,N] + beta C (+ bias), op(B) in b.
inline void run(const GemmBlock& g, const PackedBf16B& b) {
  if (g.M <= 0 || g.N <= 0) return;
  if (g.K <= 0) return empty_sum(g, 0, g.N);
  configure_tiles();
  const int64_t steps = b.steps(), group = steps * 1024;  // bfloat16 per 32-row group
  uint16_t* a = thread_buffer(0, static_cast<size_t>(kRowBlock / 32 * group));
  alignas(64) float acc[32 * 32];
  for (int64_t i0 = 0; i0 < g.M; i0 += kRowBlock) {
    const int64_t mc = std::min(kRowBlock, g.M - i0);
    for (int64_t q = 0; q * 32 < mc; ++q) pack_a_group(g, i0 + q * 32, std::min<int64_t>(32, mc - q * 32), steps, a + q * group);
    for (int64_t p = 0; p < b.panels(); ++p) {
      const int64_t j0 = p * 32, cols = std::min<int64_t>(32, g.N - j0);
      for (int64_t q = 0; q * 32 < mc; ++q) {
        const int64_t rows = std::min<int64_t>(32, mc - q * 32);
        if (rows > 16) panel_tiles<2>(steps, a + q * group, b.panel(p), acc);
        else panel_tiles<1>(steps, a + q * group, b.panel(p), acc);
        write_back(g, acc, i0 + q * 32, rows, j0, cols);
      }
    }
  }
}

// Columns of panels [panel0, panel1) of products gs[0..count), which share
// op(B) (B, ldb, trans_b, K, N; `rows` as in PackedBf16B::pack), each of at
// most kRowBlock rows, without a PackedBf16B: each B panel is packed into
// this thread's buffer just before every product's rows pass it. The same
// tiles reach the same kernel as in run(), so the bits are run()'s.
inline void run_unpacked(const GemmBlock* gs, int64_t count, const float* const* rows, int64_t panel0,
                         int64_t panel1) {
  if (count <= 0 || gs[0].N <= 0) return;
  const int64_t N = gs[0].N, K = gs[0].K, j_end = std::min(N, panel1 * 32);
  if (K <= 0) {
    for (int64_t q = 0; q < count; ++q) empty_sum(gs[q], panel0 * 32, j_end);
    return;
  }
  configure_tiles();
  const int64_t steps = (K + 31) / 32, group = steps * 1024;
  int64_t groups = 0;
  for (int64_t q = 0; q < count; ++q) groups += (gs[q].M + 31) / 32;
  uint16_t* a = thread_buffer(0, static_cast<size_t>(groups * group));
  uint16_t* b = thread_buffer(1, static_cast<size_t>(group));
  uint16_t* at = a;
  for (int64_t q = 0; q < count; ++q)
    for (int64_t i0 = 0; i0 < gs[q].M; i0 += 32, at += group)
      pack_a_group(gs[q], i0, std::min<int64_t>(32, gs[q].M - i0), steps, at);
  alignas(64) float acc[32 * 32];
  for (int64_t p = panel0; p * 32 < j_end; ++p) {
    pack_panel(gs[0].trans_b, gs[0].B, gs[0].ldb, rows, K, N, p, b);
    const int64_t cols = std::min<int64_t>(32, N - p * 32);
    at = a;
    for (int64_t q = 0; q < count; ++q)
      for (int64_t i0 = 0; i0 < gs[q].M; i0 += 32, at += group) {
        const int64_t mr = std::min<int64_t>(32, gs[q].M - i0);
        if (mr > 16) panel_tiles<2>(steps, at, b, acc);
        else panel_tiles<1>(steps, at, b, acc);
        write_back(gs[q], acc, i0, mr, p * 32, cols);
      }
  }
}

}  // namespace mha::cpu::amx
