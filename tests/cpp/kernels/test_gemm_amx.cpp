// tests/cpp/kernels/test_gemm_amx.cpp: the bits of the AMX bfloat16 product
// (cpu/gemm/gemm_amx.h) depend on the shapes and the inputs only: the same
// at 1 and 2 threads, in any row block, however op(B) was packed. (Its
// accuracy: test_gemm_bf16.cpp.) Skipped where AMX is not usable.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "cpu/blas/blas.h"
#include "cpu/gemm/gemm_amx.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/random.h"
#include "mha/threads.h"

namespace mha {
namespace {

std::vector<float> random_vector(Generator& gen, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = gen.uniform(-1.0f, 1.0f);
  return v;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

class GemmAmx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::amx_usable()) GTEST_SKIP() << "AMX (AMX-TILE, AMX-BF16, OS permission) not usable here";
  }
};

// A batch like a module's: a projection with bias, a weight gradient
// (trans_a), padded rows sharing one weight, and a few rows against a
// weight of their own (packed panel by panel); 1 and 2 threads.
TEST_F(GemmAmx, SameBitsAtOneAndTwoThreads) {
  Generator gen(21);
  const int64_t M = 1500, N = 300, K = 200;
  const std::vector<float> A = random_vector(gen, M * K), W = random_vector(gen, N * K), bias = random_vector(gen, N);
  const std::vector<float> G = random_vector(gen, M * N), C0 = random_vector(gen, K * N);
  auto run = [&](int threads) {
    const int saved = num_threads();
    set_num_threads(threads);
    std::vector<float> Y(static_cast<size_t>(M * N)), dW = C0, Z(static_cast<size_t>(7 * N)), V(static_cast<size_t>(3 * N));
    cpu::GemmBatch batch(Precision::BFloat16);
    batch.add(M, N, K, A.data(), K, W.data(), K, true, bias.data(), Y.data(), N);
    batch.add(true, false, K, N, M, 0.5f, A.data(), K, G.data(), N, 1.0f, dW.data(), N);  // dW += 0.5 A^T G
    for (int64_t r = 0; r < 7; ++r)  // rows of different lengths' leftovers, one product each
      batch.add(1, N, K, A.data() + r * 13 * K, K, W.data(), K, true, nullptr, Z.data() + r * N, N);
    // 3 rows against a weight of their own: unpacked, its panels split into jobs.
    batch.add(3, N, K, A.data() + 5 * K, K, G.data(), K, true, bias.data(), V.data(), N);
    batch.run();
    set_num_threads(saved);
    Y.insert(Y.end(), dW.begin(), dW.end());
    Y.insert(Y.end(), Z.begin(), Z.end());
    Y.insert(Y.end(), V.begin(), V.end());
    return Y;
  };
  const std::vector<float> one = run(1), two = run(2);
  EXPECT_TRUE(same_bits(one, two));
}

// Rows r0..r0+len of a product, computed as a product of their own (so in
// row blocks and 32-row tile groups that start elsewhere), have the bits
// of the same rows of the whole product; for op(A) = A and A^T.
TEST_F(GemmAmx, RowsIndependentOfWhereTheirBlockStarts) {
  Generator gen(22);
  const int64_t M = 300, N = 70, K = 130;
  for (bool trans_a : {false, true}) {
    const std::vector<float> A = random_vector(gen, M * K), B = random_vector(gen, K * N), bias = random_vector(gen, N);
    const int64_t lda = trans_a ? M : K;
    cpu::PackedBf16B packed(K, N);
    packed.pack(false, B.data(), N, 0, packed.panels());
    std::vector<float> whole(static_cast<size_t>(M * N));
    cpu::gemm_amx_packed({trans_a, false, M, N, K, 1.5f, A.data(), lda, nullptr, 0, 0.0f, nullptr, whole.data(), N},
                         packed);
    const int64_t pieces[][2] = {{0, 1}, {1, 16}, {17, 33}, {37, 100}, {150, 150}, {299, 1}, {5, 130}};
    for (const auto& [r0, len] : pieces) {
      std::vector<float> part(static_cast<size_t>(len * N));
      const float* a = trans_a ? A.data() + r0 : A.data() + r0 * K;
      cpu::gemm_amx_packed({trans_a, false, len, N, K, 1.5f, a, lda, nullptr, 0, 0.0f, nullptr, part.data(), N},
                           packed);
      const std::vector<float> want(whole.begin() + r0 * N, whole.begin() + (r0 + len) * N);
      EXPECT_TRUE(same_bits(part, want)) << "rows " << r0 << ".." << r0 + len << " trans_a " << trans_a;
    }
    // Through GemmBatch too: 5 rows (few: B packed panel by panel,
    // gemm_amx_unpacked), and rows 37.. (its own row blocks).
    std::vector<float> few(static_cast<size_t>(5 * N));
    cpu::GemmBatch few_rows(Precision::BFloat16);
    few_rows.add(trans_a, false, 5, N, K, 1.5f, trans_a ? A.data() + 37 : A.data() + 37 * K, lda, B.data(), N, 0.0f,
                 few.data(), N);
    few_rows.run();
    EXPECT_TRUE(same_bits(few, std::vector<float>(whole.begin() + 37 * N, whole.begin() + 42 * N)));
    std::vector<float> tail(static_cast<size_t>((M - 37) * N));
    cpu::GemmBatch batch(Precision::BFloat16);
    batch.add(trans_a, false, M - 37, N, K, 1.5f, trans_a ? A.data() + 37 : A.data() + 37 * K, lda, B.data(), N, 0.0f,
              tail.data(), N);
    batch.run();
    EXPECT_TRUE(same_bits(tail, std::vector<float>(whole.begin() + 37 * N, whole.end())));
  }
}

// Packing by panel ranges, in any order, gives the packing of a whole
// op(B), for B and B^T, with N not a multiple of the panel.
TEST_F(GemmAmx, PackingByPanelRangesIsThePackingOfTheWhole) {
  Generator gen(23);
  const int64_t K = 70, N = 150;  // 5 panels, the last 22 columns; 3 steps, the last 6 deep
  const std::vector<float> B = random_vector(gen, K * N);
  for (bool trans_b : {false, true}) {
    const int64_t ldb = trans_b ? K : N;
    cpu::PackedBf16B whole(K, N), pieces(K, N);
    whole.pack(trans_b, B.data(), ldb, 0, whole.panels());
    pieces.pack(trans_b, B.data(), ldb, 3, 5);
    pieces.pack(trans_b, B.data(), ldb, 0, 1);
    pieces.pack(trans_b, B.data(), ldb, 1, 3);
    for (int64_t p = 0; p < whole.panels(); ++p)
      EXPECT_EQ(0, std::memcmp(whole.panel(p), pieces.panel(p), static_cast<size_t>(whole.steps()) * 2 * 1024))
          << "panel " << p << " trans_b " << trans_b;
  }
}

// cpu::sgemm in bfloat16 from inside a parallel region (where it runs on the
// calling thread alone) gives the bits it gives outside one.
TEST_F(GemmAmx, SgemmInsideAParallelRegion) {
  Generator gen(24);
  const int64_t M = 400, N = 96, K = 64;
  const std::vector<float> A = random_vector(gen, M * K), B = random_vector(gen, K * N);
  std::vector<float> outside(static_cast<size_t>(M * N));
  cpu::sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, outside.data(), N, Precision::BFloat16);
  std::vector<std::vector<float>> inside(2, std::vector<float>(static_cast<size_t>(M * N)));
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    cpu::sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, inside[static_cast<size_t>(t)].data(), N,
               Precision::BFloat16);
  }
  for (const std::vector<float>& c : inside) EXPECT_TRUE(same_bits(c, outside));
}

}  // namespace
}  // namespace mha
