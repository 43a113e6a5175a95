// mha's product: the run-time choice of instruction set, PackedB, and the
// plain reference loop.
#include "cpu/gemm/gemm.h"

#include <cstdlib>
#include <new>

#include "cpu/isa/have_x86.h"
#include "cpu/gemm/gemm_isa.h"
#include "mha/error.h"

namespace mha::cpu {

namespace {

cpu::IsaChoice g_isa(best_vector_isa());

const gemm_kernels::IsaGemm& kernels_for(GemmIsa isa) {
  return isa_entry<gemm_kernels::IsaGemm>(isa, gemm_kernels::kScalarGemm, MHA_X86_ONLY(gemm_kernels::kAvx2Gemm),
                                          MHA_X86_ONLY(gemm_kernels::kAvx512Gemm));
}

}  // namespace

GemmIsa gemm_isa() { return g_isa.get(); }
GemmIsa gemm_best_isa() { return best_vector_isa(); }
bool set_gemm_isa(GemmIsa isa) { return g_isa.set(isa); }
const char* gemm_isa_name(GemmIsa isa) { return kernels_for(isa).name; }

void PackedB::Free::operator()(float* p) const { std::free(p); }

PackedB::PackedB(int64_t K, int64_t N) : K_(K), N_(N), isa_(g_isa.get()) {
  const int64_t floats = kernels_for(isa_).packed_b_floats(K, N);
  // 64-byte aligned: the micro-kernels load B panels with aligned loads.
  const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
  data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (!data_) throw std::bad_alloc();
}

PackedB::PackedB(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb) : PackedB(K, N) {
  pack(trans_b, B, ldb, 0, panels());
}

int64_t PackedB::bytes() const {
  return kernels_for(isa_).packed_b_floats(K_, N_) * static_cast<int64_t>(sizeof(float));
}

int64_t PackedB::panels() const {
  const int64_t nr = kernels_for(isa_).NR;
  return (N_ + nr - 1) / nr;
}

void PackedB::pack(bool trans_b, const float* B, int64_t ldb, int64_t panel0, int64_t panel1,
                   const float* const* rows) {
  if (K_ > 0 && N_ > 0)
    kernels_for(isa_).pack_b(trans_b, K_, N_, B, ldb, rows, data_.get(), panel0, panel1);
}

void gemm_packed(const GemmBlock& g, const PackedB& b) {
  if (b.K() != g.K || b.N() != g.N || b.isa() != g_isa.get())
    fail("gemm", "packed B is ", b.K(), "x", b.N(), " for ", gemm_isa_name(b.isa()), ", the product needs ",
         g.K, "x", g.N, " for ", gemm_isa_name(g_isa.get()));
  kernels_for(g_isa.get()).run(g, b.data());
}

namespace {
// `mha bench --small-gemm` (one thread, AVX-512, the 2-core development
// machine under load): C = A W^T + bias, time per call without a PackedB
// over the time with one (packing included), by rows M:
//   N x K         M=1   4     8     16    24    32    48    64    96
//   100 x 100     0.82  0.80  0.84  0.91  0.93  0.96  0.96  0.97  0.98
//   300 x 100     0.86  0.86  0.89  0.94  0.96  0.97  0.97  0.97  0.98
//   768 x 768     0.48  0.41  0.46  0.61  0.66  0.72  0.78  0.82  0.84
//   2304 x 768    0.48  0.50  0.54  0.61  0.68  0.72  0.76  0.77  0.78
//   4096 x 4096   0.15  0.16  0.18  0.21  0.24  0.27  0.32  0.37  0.45
// (the toy call's weights: 100 x 100 at 8 rows, 4.4 against 5.2 us). The
// gain shrinks with the rows as packing is shared by more of them; large
// weights gain at any row count on one thread (a PackedB is fresh pages),
// but with threads a PackedB is shared by every row block of a batch, which
// a switch this low never gives up for a large product. 32 also stays
// within every ISA's MC (one A block).
constexpr int64_t kGemmUnpackedMaxRows = 32;
}  // namespace

int64_t gemm_unpacked_max_rows() { return kGemmUnpackedMaxRows; }
int64_t gemm_panel_width() { return kernels_for(g_isa.get()).NR; }

void gemm_unpacked(const GemmBlock* g, int64_t count, const float* const* rows, int64_t panel0, int64_t panel1) {
  kernels_for(g_isa.get()).run_unpacked(g, count, rows, panel0, panel1);
}

void gemm(const GemmBlock& g) {
  if (g.M <= 0 || g.N <= 0) return;
  if (g.M <= kGemmUnpackedMaxRows) {
    const int64_t nr = gemm_panel_width();
    return gemm_unpacked(&g, 1, nullptr, 0, (g.N + nr - 1) / nr);
  }
  const PackedB b(g.trans_b, g.K, g.N, g.B, g.ldb);
  gemm_packed(g, b);
}

void gemm_reference(const GemmBlock& g) {
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < g.K; ++k) {
        const float a = g.trans_a ? g.A[k * g.lda + i] : g.A[i * g.lda + k];
        const float b = g.trans_b ? g.B[j * g.ldb + k] : g.B[k * g.ldb + j];
        sum += a * b;
      }
      float* c = g.C + i * g.ldc + j;
      const float prior = g.bias ? g.bias[j] : g.beta == 0.0f ? 0.0f : g.beta * *c;
      *c = g.alpha * sum + prior;
    }
}

}  // namespace mha::cpu
