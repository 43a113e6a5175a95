// src/cpu/gemm/gemm.h: mha's own single-precision matrix product.
//
// Why not the BLAS: Debian 12's OpenBLAS (0.3.21) does not recognise recent
// Xeons (family 6 model 207 among them) and falls back to its generic
// "Prescott" SSE kernels unless the user sets OPENBLAS_CORETYPE; measured on
// such a machine, 2 threads, B8 L512 D768: mha's projections ran at ~24% of
// the sgemm rate those CPUs reach. Nobody sets that variable, so mha carries
// its own packed, register-blocked product, chosen at run time by the CPU's
// instruction set (AVX-512, AVX2+FMA, portable), as the fused attention
// kernel does. OpenBLAS stays as the reference the tests hold this one to.
// (Measured alternatives, and why they lost, are in gemm_traits.h.)
//
// The other GEMMs Debian 12 ships, measured against this one in one process
// (bench/gemm_libraries.sh: each library through dlopen, time relative to
// mha's, idle machine, Xeon family 6 model 207) on the modules' products
// (4096x768x768 x W^T, 768x768x4096, 4096x512x512, 16384x256x256, stacked
// 4096x2304x768, 8x100x100, 1x4096x4096):
//   1 thread:  OpenBLAS (no OPENBLAS_CORETYPE) 3.0-5.6x; BLIS 0.9 1.3-1.6x
//              (0.6x on the 1-row product); oneDNN 2.6 0.71-0.83x, i.e.
//              1.2-1.4x faster than this product (146-158 GFLOP/s against
//              98-125), 0.47x on the 1-row product.
//   2 threads: oneDNN 0.72-0.87x on the D 768 products, 1.00x at D 256 and
//              1.35x (slower) at D 512, where its threading scales less.
// So oneDNN's kernels (libdnnl-dev) beat these per thread, by most on the
// packing this product repeats every call; its own threading does not, and
// whether its bits stay the same at any thread count is not measured.
// Since then (2-core AMD EPYC, 48 KiB L1d, 1 MiB L2, FMA peak 233 GFLOP/s
// a core; bench/gemm_libraries.sh build 1 5): A's panels packed in
// registers, the tile's sums kept in registers and C written in L2-sized
// slices (gemm_traits.h) bring this product to 1.00-1.05x oneDNN's time on
// the products above at one thread (mha 177-198 GFLOP/s, oneDNN 183-201),
// 0.9-1.1x at two; the few-row products run as dot products (few_rows.h)
// at oneDNN's speed. Kept, then: bitwise results at any thread count by
// fixed blocking (tested), weights packed once per version
// (packed_weight.h), no new dependency.
//
// The bfloat16 product (Precision::BFloat16) is not a micro-kernel here but
// AMX tiles (gemm_amx.h), by measurement: a 12 x 32 vdpbf16ps kernel
// (AVX512_BF16, pairs of bfloat16 into float32 accumulators; all its variants
// gave the same bits as a portable one) ran at 76 / 75 / 69 GFLOP/s against
// this float32 kernel's 124 / 126 / 139 on the shapes of gemm_traits.h, one
// thread, on the Xeon (family 6 model 207) it was meant for: that CPU issues
// vdpbf16ps at about a third of its vfmadd231ps rate, so the bfloat16
// kernel would be 0.55-0.6x, not the 2x the instruction's width suggests,
// while its AMX tiles reach 2.2-5.4x. Without AMX, bfloat16 products run
// here on values rounded beforehand (parallel_gemm_bf16.cpp).
//
// The product is the BLAS's: C:[M,N] = alpha op(A) op(B) + beta C, row-major,
// op(X) = X^T when trans_x. beta = 0 never reads C (it may hold NaN).
//
// Layout (BLIS's): op(B) is packed once per product (a layer's weight once
// per version: cpu/gemm/packed_weight.h) into column panels of NR columns and KC
// rows (PackedB), op(A) into row panels of MR rows per
// (MC x KC) block, and a micro-kernel keeps an MR x NR tile of C in registers
// over KC steps. The blocking depends on the shapes only, never on threads,
// and every C element sums its K products in the same order whichever block
// or thread computes it: results are bitwise the same at any thread count.
#pragma once

#include "cpu/isa/isa.h"
#include <cstdint>
#include <memory>

namespace mha::cpu {

// One product: C:[M,N] = alpha op(A) op(B) + beta C (+ bias broadcast over
// rows, then beta = 1); op(A):[M,K], op(B):[K,N]; lda/ldb/ldc are row strides
// of A, B, C as stored.
struct GemmBlock {
  bool trans_a, trans_b;
  int64_t M, N, K;
  float alpha;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float beta;
  const float* bias;  // [N] or null
  float* C;
  int64_t ldc;
};

// Instruction sets of the product's micro-kernels: the one list
// (cpu/isa/isa.h); AMX's bfloat16 tiles are the separate path of gemm_amx.h.
using GemmIsa = Isa;
GemmIsa gemm_isa();        // the one in use (the best the CPU has, unless set)
GemmIsa gemm_best_isa();   // the best the CPU has
// Uses `isa` from now on (for tests); false, and no change, when the CPU
// lacks it. Not thread-safe against running products.
bool set_gemm_isa(GemmIsa isa);
const char* gemm_isa_name(GemmIsa isa);

// op(B):[K,N] packed for the current ISA's micro-kernel; read-only once made,
// so one packing serves every row block of a product on every thread.
class PackedB {
 public:
  // Packs op(B) = B^T (trans_b) or B, B's rows ldb apart.
  PackedB(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb);
  // Room for op(B):[K,N], packed by pack() panel by panel (so that threads
  // can share the packing).
  PackedB(int64_t K, int64_t N);
  // Column panels of the micro-kernel's width; pack() takes them in ranges.
  int64_t panels() const;
  // With trans_b, `rows` (N pointers, or null) gives where each row of B
  // starts, in place of B + j * ldb: rows of several matrices packed as one.
  void pack(bool trans_b, const float* B, int64_t ldb, int64_t panel0, int64_t panel1,
            const float* const* rows = nullptr);
  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  GemmIsa isa() const { return isa_; }
  const float* data() const { return data_.get(); }
  // Bytes held.
  int64_t bytes() const;

 private:
  struct Free {
    void operator()(float* p) const;
  };
  int64_t K_, N_;
  GemmIsa isa_;
  std::unique_ptr<float[], Free> data_;
};

// C = alpha op(A) B + beta C (+ bias) on the calling thread, with B packed
// (g.B, g.ldb and g.trans_b are not read). b.K() == g.K, b.N() == g.N.
void gemm_packed(const GemmBlock& g, const PackedB& b);

// Products whose right-hand matrix serves at most this many rows in all
// skip PackedB: packing all of op(B) (a copy of a whole weight, per call)
// pays only when many rows reuse its panels. gemm_unpacked instead packs one
// B panel at a time into an L1 buffer, just before the rows pass it, and
// feeds the same micro-kernel: the same bits as gemm_packed, so a row's
// result does not depend on which path its product took. The switch depends
// on the shapes alone (so, like the blocking, not on threads); its
// measurement is beside kGemmUnpackedMaxRows in gemm.cpp.
int64_t gemm_unpacked_max_rows();
// Columns [panel0 * w, panel1 * w) (to N) of products g[0..count) on the
// calling thread, w = gemm_panel_width(), without a PackedB. The products
// share op(B) (B, ldb, trans_b, K, N; with trans_b, `rows` as in
// PackedB::pack: N row pointers of B, or null), and each B panel is packed
// once for all of them (the projections of padded batch rows).
void gemm_unpacked(const GemmBlock* g, int64_t count, const float* const* rows, int64_t panel0, int64_t panel1);
int64_t gemm_panel_width();  // the current ISA's micro-tile width (NR)

// The whole product on the calling thread, packing op(B) itself (or, up to
// gemm_unpacked_max_rows() rows, through gemm_unpacked).
void gemm(const GemmBlock& g);

// The plain triple loop, for tests: the same product, no blocking, no SIMD.
void gemm_reference(const GemmBlock& g);

}  // namespace mha::cpu
