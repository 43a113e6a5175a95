// tests/cpp/kernels/test_gemm.cpp: mha's own product (src/cpu/gemm) against a
// double-precision product, OpenBLAS and its plain reference loop, on every
// instruction set the CPU has; bitwise the same at any thread count and any
// row blocking.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/blas/blas.h"
#include "cpu/gemm/few_rows.h"
#include "cpu/gemm/gemm.h"
#include "cpu/gemm/parallel_gemm.h"
#include "gemm_operands.h"
#include "mha/random.h"
#include "mha/threads.h"

namespace mha {
namespace {

using cpu::GemmBlock;
using cpu::GemmIsa;

using Operands = test::GemmOperands;

// |got - exact| <= 2 K eps sum_k |a||b| (+ the rounding of alpha and beta C):
// the classical bound for a float sum of K products, per element.
::testing::AssertionResult within_float_bound(const Operands& o, const std::vector<float>& got) {
  const double eps = std::numeric_limits<float>::epsilon();
  for (int64_t i = 0; i < o.M; ++i)
    for (int64_t j = 0; j < o.N; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < o.K; ++k) {
        exact += static_cast<double>(o.a(i, k)) * o.bb(k, j);
        magnitude += std::fabs(static_cast<double>(o.a(i, k)) * o.bb(k, j));
      }
      const double c0 = o.C[static_cast<size_t>(i * o.ldc + j)];
      const double prior = o.bias ? o.b[static_cast<size_t>(j)] : o.beta == 0.0f ? 0.0 : o.beta * c0;
      const double want = o.alpha * exact + prior;
      const double bound = (2.0 * o.K + 4.0) * eps * (std::fabs(o.alpha) * magnitude + std::fabs(prior)) + 1e-30;
      const double g = got[static_cast<size_t>(i * o.ldc + j)];
      if (!(std::fabs(g - want) <= bound))
        return ::testing::AssertionFailure() << "C[" << i << "," << j << "] = " << g << ", exact " << want
                                             << ", bound " << bound;
    }
  return ::testing::AssertionSuccess();
}

std::vector<GemmIsa> supported_isas() {
  std::vector<GemmIsa> isas;
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512})
    if (static_cast<int>(isa) <= static_cast<int>(cpu::gemm_best_isa())) isas.push_back(isa);
  return isas;
}

class GemmIsaTest : public ::testing::TestWithParam<GemmIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(cpu::set_gemm_isa(GetParam())); }
  void TearDown() override { cpu::set_gemm_isa(cpu::gemm_best_isa()); }
};

// Sizes around every ISA's micro-tile and block edges (MR 4/6/12, NR 8/16/32,
// KC 256, MC 64/96/192, NC 256), 1, and primes. (Sums longer than KA 1024,
// which the driver runs in another order, are the depth 1100 below.)
const int64_t kSizes[] = {1, 2, 5, 7, 11, 12, 13, 16, 17, 31, 33, 64, 97, 191, 193, 255, 257, 300};

TEST_P(GemmIsaTest, MatchesTheExactProductWithinTheFloatBound) {
  Generator gen(7);
  for (int trial = 0; trial < 60; ++trial) {
    auto pick = [&] { return kSizes[gen.below(sizeof(kSizes) / sizeof(kSizes[0]))]; };
    const bool ta = gen.below(2), tb = gen.below(2);
    const int64_t M = pick(), N = pick(), K = pick(), pad = gen.below(3);
    const float alphas[] = {1.0f, -0.5f, 2.0f};
    const float betas[] = {0.0f, 1.0f, 0.25f};
    const float alpha = alphas[gen.below(3)], beta = betas[gen.below(3)];
    const bool bias = gen.below(4) == 0;
    Operands o(gen, ta, tb, M, N, K, pad, alpha, beta, bias);
    std::vector<float> out = o.C;
    cpu::gemm(o.block(out));
    ASSERT_TRUE(within_float_bound(o, out))
        << "trans " << ta << tb << " M" << M << " N" << N << " K" << K << " pad " << pad << " alpha "
        << alpha << " beta " << beta << " bias " << bias;
    // Padding columns of C (past N) are never written.
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = N; j < o.ldc; ++j)
        ASSERT_EQ(out[static_cast<size_t>(i * o.ldc + j)], o.C[static_cast<size_t>(i * o.ldc + j)]);
  }
}

TEST_P(GemmIsaTest, AgreesWithOpenBlasAndTheReferenceLoop) {
  Generator gen(11);
  for (int64_t K : {1, 40, 256, 513, 1100}) {
    Operands o(gen, false, true, 77, 70, K, 0, 1.0f, 0.0f, false);
    std::vector<float> ours = o.C, blas = o.C, ref = o.C;
    cpu::gemm(o.block(ours));
    cpu::blas_sgemm(false, true, o.M, o.N, K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f, blas.data(),
                    o.ldc);
    cpu::gemm_reference(o.block(ref));
    ASSERT_TRUE(within_float_bound(o, blas));  // the bound holds for the peer too
    ASSERT_TRUE(within_float_bound(o, ref));
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(ours[i] - blas[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(blas[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale) << "K " << K;
  }
}

TEST_P(GemmIsaTest, BetaZeroNeverReadsC) {
  Generator gen(3);
  Operands o(gen, false, false, 29, 45, 300, 1, 1.0f, 0.0f, false);
  std::vector<float> out(o.C.size(), std::numeric_limits<float>::quiet_NaN());
  cpu::gemm(o.block(out));
  for (int64_t i = 0; i < o.M; ++i)
    for (int64_t j = 0; j < o.N; ++j) ASSERT_TRUE(std::isfinite(out[static_cast<size_t>(i * o.ldc + j)]));
  ASSERT_TRUE(within_float_bound(o, out));
}

TEST_P(GemmIsaTest, AnEmptySumGivesBetaCOrTheBias) {
  Generator gen(5);
  for (bool bias : {false, true}) {
    Operands o(gen, false, true, 6, 9, 0, 0, 1.0f, 0.5f, bias);
    std::vector<float> out = o.C;
    cpu::gemm(o.block(out));
    for (int64_t i = 0; i < o.M; ++i)
      for (int64_t j = 0; j < o.N; ++j) {
        const size_t at = static_cast<size_t>(i * o.ldc + j);
        EXPECT_EQ(out[at], bias ? o.b[static_cast<size_t>(j)] : 0.5f * o.C[at]);
      }
  }
}

TEST_P(GemmIsaTest, BitwiseTheSameAtAnyThreadCountAndRowSplit) {
  Generator gen(13);
  // A product big enough for many row blocks, and padded batches of pieces;
  // a sum within KA and one past it (the driver's two orders).
  for (int64_t K : {300, 1100}) {
    Operands o(gen, false, true, 2000, 200, K, 0, 1.0f, 0.0f, true);
    const int saved = num_threads();
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      std::vector<float> out(o.C.size());
      cpu::parallel_sgemm(o.M, o.N, o.K, o.A.data(), o.lda, o.B.data(), o.ldb, true, o.b.data(), out.data(),
                          o.ldc);
      results.push_back(out);
    }
    set_num_threads(saved);
    // The same rows as pieces of other sizes, in one batch: each row's sum
    // does not depend on which block it falls in.
    std::vector<float> pieces(o.C.size());
    cpu::GemmBatch batch;
    for (int64_t r0 = 0, step = 1; r0 < o.M; r0 += step, step = step * 3 % 401 + 1) {
      const int64_t rows = std::min(step, o.M - r0);
      batch.add(rows, o.N, o.K, o.A.data() + r0 * o.lda, o.lda, o.B.data(), o.ldb, true, o.b.data(),
                pieces.data() + r0 * o.ldc, o.ldc);
    }
    batch.run();
    results.push_back(pieces);
    for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r], results[0]) << "run " << r << " K " << K;
  }
}

TEST_P(GemmIsaTest, StackedWeightsReadInPlaceGiveEachLayersProductBitwise) {
  // Three layers W_i:[n_i, K] stacked by rows without a copy: every output
  // column is bitwise its layer's own product, and within the float bound.
  Generator gen(17);
  // 301 rows: a PackedB; 5 rows: panel by panel (gemm_unpacked).
  for (const int64_t M : {int64_t{301}, int64_t{5}}) {
  const int64_t K = 77;
  const int64_t widths[] = {40, 33, 100};  // not multiples of any NR
  std::vector<std::vector<float>> W;
  std::vector<std::pair<const float*, int64_t>> parts;
  int64_t N = 0;
  for (int64_t n : widths) {
    W.emplace_back(static_cast<size_t>(n * K));
    for (float& x : W.back()) x = gen.uniform(-1.0f, 1.0f);
    N += n;
  }
  for (size_t i = 0; i < W.size(); ++i) parts.push_back({W[i].data(), widths[i]});
  std::vector<float> A(static_cast<size_t>(M * K)), bias(static_cast<size_t>(N));
  for (float& x : A) x = gen.uniform(-1.0f, 1.0f);
  for (float& x : bias) x = gen.uniform(-1.0f, 1.0f);
  std::vector<float> stacked(static_cast<size_t>(M * N)), separate(stacked.size());
  cpu::GemmBatch one;
  one.add_stacked(M, K, A.data(), K, parts, bias.data(), stacked.data(), N);
  one.run();
  cpu::GemmBatch each;
  int64_t col = 0;
  for (size_t i = 0; i < W.size(); ++i) {
    each.add(M, widths[i], K, A.data(), K, W[i].data(), K, true, bias.data() + col, separate.data() + col, N);
    col += widths[i];
  }
  each.run();
  EXPECT_EQ(stacked, separate);
  // And the exact product of the stacked matrix, row by row of B^T.
  std::vector<float> whole(static_cast<size_t>(N * K));
  col = 0;
  for (size_t i = 0; i < W.size(); ++i) {
    std::copy(W[i].begin(), W[i].end(), whole.begin() + col * K);
    col += widths[i];
  }
  Operands o(gen, false, true, M, N, K, 0, 1.0f, 0.0f, true);
  o.A = A;
  o.B = whole;
  o.b = bias;
  EXPECT_TRUE(within_float_bound(o, stacked)) << "M " << M;
  }
}

// Few rows (at most gemm_unpacked_max_rows) run without a PackedB, B packed
// one panel at a time (cpu/gemm/gemm.h): held to the double-precision
// product within the float bound (|error| <= (2K + 4) eps sum |a b|, per
// element) and bitwise to the packed path, over M 1..40 (both sides of the
// switch), odd and even N and K, strides, every op() and alpha/beta/bias.
TEST_P(GemmIsaTest, UnpackedProductsGiveThePackedBitsWithinTheFloatBound) {
  Generator gen(19);
  // Widths past NC 256 and depths past KA 1024: the packed driver's two
  // orders (gemm_impl.h run) give the unpacked path's bits too.
  const int64_t widths[] = {1, 2, 7, 16, 31, 32, 33, 64, 100, 129, 300};
  const int64_t depths[] = {1, 3, 8, 17, 64, 100, 255, 256, 257, 513, 1100};
  const int64_t nr = cpu::gemm_panel_width();
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t M = 1 + static_cast<int64_t>(gen.below(40));
    const int64_t N = widths[gen.below(11)], K = depths[gen.below(11)], pad = gen.below(3);
    const bool ta = gen.below(2), tb = gen.below(4) != 0;  // weights (trans_b) most often
    const float alphas[] = {1.0f, -0.5f};
    const float betas[] = {0.0f, 1.0f, 0.25f};
    const float alpha = alphas[gen.below(2)], beta = betas[gen.below(3)];
    const bool bias = gen.below(2) == 0;
    Operands o(gen, ta, tb, M, N, K, pad, alpha, beta, bias);
    std::vector<float> packed = o.C, unpacked = o.C, split = o.C;
    const cpu::PackedB b(tb, K, N, o.B.data(), o.ldb);
    cpu::gemm_packed(o.block(packed), b);
    const int64_t panels = (N + nr - 1) / nr;
    const GemmBlock whole = o.block(unpacked);
    cpu::gemm_unpacked(&whole, 1, nullptr, 0, panels);
    // Any split of the columns into panel ranges (as threads take them), and
    // of the rows into products that share B.
    std::vector<GemmBlock> parts;
    for (int64_t r0 = 0, rows = 1; r0 < M; r0 += rows, rows = rows % 5 + 1) {
      GemmBlock part = o.block(split);
      part.M = std::min(rows, M - r0);
      part.A += r0 * (ta ? 1 : o.lda);
      part.C += r0 * o.ldc;
      parts.push_back(part);
    }
    for (int64_t p0 = 0, step = 1; p0 < panels; p0 += step, ++step)
      cpu::gemm_unpacked(parts.data(), static_cast<int64_t>(parts.size()), nullptr, p0, std::min(panels, p0 + step));
    const auto where = ::testing::Message() << "trans " << ta << tb << " M" << M << " N" << N << " K" << K
                                            << " pad " << pad << " alpha " << alpha << " beta " << beta
                                            << " bias " << bias;
    ASSERT_TRUE(within_float_bound(o, unpacked)) << where;
    ASSERT_EQ(unpacked, packed) << where;  // padding columns of C included: never written
    ASSERT_EQ(split, packed) << where;
  }
}

TEST_P(GemmIsaTest, FewRowProductsBitwiseTheSameAtOneAndTwoThreads) {
  // Few rows, wide enough to be split by columns across a team (work above
  // GemmBatch's 2e6 multiply-adds threshold), plain and stacked.
  Generator gen(23);
  const int saved = num_threads();
  for (int64_t M : {int64_t{1}, int64_t{7}, cpu::gemm_unpacked_max_rows()}) {
    Operands o(gen, false, true, M, 1000, 300, 1, 1.0f, 0.0f, true);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<float> out(o.C.size());
      cpu::parallel_sgemm(o.M, o.N, o.K, o.A.data(), o.lda, o.B.data(), o.ldb, true, o.b.data(), out.data(),
                          o.ldc);
      results.push_back(out);
      ASSERT_TRUE(within_float_bound(o, out)) << "M " << M << ", threads " << threads;
    }
    EXPECT_EQ(results[0], results[1]) << "M " << M;
    // The same rows as pieces in one batch (padded batch rows' projections):
    // the pieces share B, run without a PackedB, and keep every row's bits.
    std::vector<float> pieces(o.C.size());
    cpu::GemmBatch batch;
    for (int64_t r0 = 0, step = 1; r0 < M; r0 += step, step = step % 4 + 1)
      batch.add(std::min(step, M - r0), o.N, o.K, o.A.data() + r0 * o.lda, o.lda, o.B.data(), o.ldb, true,
                o.b.data(), pieces.data() + r0 * o.ldc, o.ldc);
    batch.run();
    EXPECT_EQ(pieces, results[0]) << "M " << M;
    // dX = dY W: op(B) = B, few rows.
    Operands d(gen, false, false, M, 800, 300, 0, 1.0f, 0.0f, false);
    results.clear();
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<float> out(d.C.size());
      cpu::sgemm(false, false, d.M, d.N, d.K, 1.0f, d.A.data(), d.lda, d.B.data(), d.ldb, 0.0f, out.data(),
                 d.ldc);
      results.push_back(out);
      ASSERT_TRUE(within_float_bound(d, out)) << "M " << M << ", threads " << threads;
    }
    EXPECT_EQ(results[0], results[1]) << "M " << M;
  }
  set_num_threads(saved);
}

TEST_P(GemmIsaTest, DotProductRowsWithinTheFloatBoundAndTheSameAtOneAndTwoThreads) {
  // A decode step's one-row product (GemmBatch::add_dot_products,
  // cpu/gemm/few_rows.h): N not a multiple of 4 (the last outputs' loop),
  // a bias, and work above the team threshold (N 1027).
  ASSERT_TRUE(cpu::dot_products_serve(1, Precision::Float32));
  EXPECT_FALSE(cpu::dot_products_serve(cpu::kDotProductMaxRows + 1, Precision::Float32));
  EXPECT_FALSE(cpu::dot_products_serve(1, Precision::BFloat16));
  Generator gen(29);
  const int saved = num_threads();
  for (int64_t N : {int64_t{1}, int64_t{7}, int64_t{1027}}) {
    Operands o(gen, false, true, 1, N, 301, 0, 1.0f, 0.0f, true);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<float> out(o.C.size(), -7.0f);
      cpu::GemmBatch batch;
      batch.add_dot_products(1, o.A.data(), o.lda, o.B.data(), o.N, o.K, o.b.data(), out.data(), o.ldc);
      batch.run();
      ASSERT_TRUE(within_float_bound(o, out)) << "N " << N << ", threads " << threads;
      results.push_back(out);
    }
    EXPECT_EQ(results[0], results[1]) << "N " << N;
  }
  set_num_threads(saved);
}

TEST(Gemm, PackedBForAnotherShapeIsRefused) {
  std::vector<float> B(12, 1.0f), C(12);
  cpu::PackedB packed(false, 3, 4, B.data(), 4);
  GemmBlock g{false, false, 1, 4, 2, 1.0f, B.data(), 2, nullptr, 0, 0.0f, nullptr, C.data(), 4};
  EXPECT_THROW(cpu::gemm_packed(g, packed), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, GemmIsaTest, ::testing::ValuesIn(supported_isas()),
                         [](const auto& info) { return std::string(cpu::gemm_isa_name(info.param)); });

}  // namespace
}  // namespace mha
