// src/cpu/gemm/parallel_gemm.h: matrix products on mha's threads whose result
// does not depend on the thread count.
//
// Each product runs on mha's own GEMM (cpu/gemm/gemm.h): its right-hand
// matrix is packed once (shared read-only by every thread), its rows are cut
// into blocks fixed by the shapes alone, and one thread computes each block
// from start to end. Every element sums its K products in the same order in
// any block, so 1 and N threads give the same bits. Several products (e.g.
// the projections of every batch row's unpadded part) go into one batch, so
// the threads share them all without a join per product, and products that
// read the same right-hand matrix share one packing.
//
// A right-hand matrix that serves few rows in all (at most
// gemm_unpacked_max_rows() over the batch's products that read it: the
// d2l chapter's toy call, decode steps, the padded rows of short batches)
// is not packed whole: its products run through gemm_unpacked, split into
// jobs of a few column panels, each job passing all their rows; the same
// bits as the packed path, so a row's result never depends on the path.
//
// A product may carry a row epilogue (RowEpilogue): it runs on each row block
// of the product's C (in pieces of at most 192 rows: gemm_schedule.h) right
// after that piece is computed, on the thread that computed it, while the
// piece is still in cache (the projections rotate q and k there:
// nn/projections.h). It must change each row alone, so that its result does
// not depend on how rows are cut into blocks.
//
// (Before mha had its own GEMM, each block was one single-threaded OpenBLAS
// call: OpenBLAS threads a product by splitting its rows by the thread count
// and rounds a split's edge blocks differently, so its threaded results
// change with the thread count.)
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/gemm/gemm.h"
#include "mha/precision.h"

namespace mha::cpu {

struct PackedWeight;  // cpu/gemm/packed_weight.h

// Rows per block for a batch of products of M rows in all: about M/8, a
// multiple of 192 (whole row blocks of every ISA's micro-kernel, so that
// only a product's last block has an edge), within [192, 1152]. Depends on
// the shapes only.
int64_t gemm_row_block(int64_t M);

// fn(ctx, C, ldc, r0, rows): rows [r0, r0 + rows) of a product's C (counted
// from the product's first row; C points at row r0) are final.
struct RowEpilogue {
  void (*fn)(const void* ctx, float* C, int64_t ldc, int64_t r0, int64_t rows) = nullptr;
  const void* ctx = nullptr;
  explicit operator bool() const { return fn != nullptr; }
  void operator()(float* C, int64_t ldc, int64_t r0, int64_t rows) const { fn(ctx, C, ldc, r0, rows); }
};

class GemmBatch {
 public:
  // Precision::BFloat16: every product of the batch rounds op(A) and op(B)
  // to bfloat16 (nearest, ties to even) and sums in float32 (mha/precision.h);
  // alpha, beta and the bias apply in float32. Where amx_usable() (cpu/gemm/
  // gemm_amx.h) the products run on AMX tiles, in the same row blocks;
  // elsewhere on rounded copies (parallel_gemm_bf16.cpp).
  explicit GemmBatch(Precision precision = Precision::Float32) : precision_(precision) {}
  // Adds C = alpha op(A) op(B) + beta C, to be cut into row blocks of
  // gemm_row_block(total rows of the batch).
  void add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);
  // Adds C = A op(B) + bias (bias:[N] or null) in row blocks.
  void add(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
           int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc);
  // Adds C:[M,N] = A [W_0; W_1; ...]^T + bias: the right-hand matrix is
  // several weights W_i:[n_i,K] (rows K floats apart) stacked by rows, read
  // in place (the projections of one input through several layers, without
  // a stacked copy); N = sum n_i; bias:[N] or null.
  void add_stacked(int64_t M, int64_t K, const float* A, int64_t lda,
                   const std::vector<std::pair<const float*, int64_t>>& weights, const float* bias,
                   float* C, int64_t ldc);
  // Adds C:[M,N] = A W^T + bias with W:[N,K] packed once beforehand
  // (cpu/gemm/packed_weight.h; w.precision must be the batch's): no packing per
  // call, whatever M; the same bits as add(M, N, K, A, lda, W, K, true, ...).
  // `w` (and the epilogue's context) must outlive run(). The epilogue runs
  // on the rows of C piece by piece as soon as they are computed.
  void add_packed(int64_t M, const float* A, int64_t lda, const PackedWeight& w, const float* bias, float* C,
                  int64_t ldc, RowEpilogue epilogue = {});
  // Adds C:[M,N] = A W^T + bias with W:[N,K] read in place, as dot products
  // (cpu/gemm/few_rows.h: faster at one row; other bits than the packed
  // product). Only where dot_products_serve(M, the batch's precision). The
  // epilogue runs on all M rows once they are computed.
  void add_dot_products(int64_t M, const float* A, int64_t lda, const float* W, int64_t N, int64_t K,
                        const float* bias, float* C, int64_t ldc, RowEpilogue epilogue = {});
  // Packs each distinct right-hand matrix once, then runs every block on
  // mha::num_threads() threads.
  void run() const;
  // The same on at most `threads` threads (1: the calling thread alone, e.g.
  // inside a parallel region); the same bits as run().
  void run_on(int threads) const;

 private:
  void run_float32(int threads) const;
  void run_bfloat16(int threads) const;
  // The portable bfloat16 path: rounded copies into the float32 product.
  void run_bfloat16_portable(int threads) const;
  // The AMX path (cpu/gemm/gemm_amx.h), when amx_usable().
  void run_bfloat16_amx(int threads) const;
  // Products x and y read the same right-hand matrix (one packing serves both).
  bool shares_b(size_t x, size_t y) const;
  Precision precision_;
  std::vector<GemmBlock> products_;
  // Per product: where each row of B^T starts, for stacked weights (else empty).
  std::vector<std::vector<const float*>> rows_;
  // Per product: its packed weight (add_packed), else null.
  std::vector<const PackedWeight*> packed_;
  // Per product: its row epilogue (add_packed only), else none.
  std::vector<RowEpilogue> epilogues_;
  // Products of few rows run as dot products (add_dot_products).
  struct DotProduct {
    int64_t M, N, K;
    const float *A, *W, *bias;
    int64_t lda;
    float* C;
    int64_t ldc;
    RowEpilogue epilogue;
  };
  std::vector<DotProduct> dots_;
  void run_dots(int threads) const;
};

// Whether a product of M rows in `precision` may run as dot products
// (GemmBatch::add_dot_products): float32, at most kDotProductMaxRows rows.
bool dot_products_serve(int64_t M, Precision precision);

// One product through a GemmBatch: C = A op(B) (+ bias). cpu::sgemm
// (blas.h) is the general one, run the same way (on the calling thread alone
// when called from inside one of mha's parallel regions). A product of at
// most kDotProductMaxRows rows against a weight (trans_b, ldb == K, float32)
// runs as dot products, as a decode step's projection does (few_rows.h).
void parallel_sgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc,
                    Precision precision = Precision::Float32);

}  // namespace mha::cpu
