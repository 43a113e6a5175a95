// tests/cpp/kernels/test_gemm_bf16.cpp: the bfloat16 product
// (Precision::BFloat16) on AMX tiles (cpu/gemm/gemm_amx.h) and on the
// portable path, against a double-precision product of the bfloat16-rounded
// inputs; the AMX path bitwise the same at 1 and 2 threads and in any row
// block. AMX-only tests skip where the CPU or the OS does not allow AMX.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/blas/blas.h"
#include "cpu/gemm/gemm_amx.h"
#include "cpu/gemm/parallel_gemm.h"
#include "gemm_operands.h"
#include "mha/random.h"
#include "mha/threads.h"

namespace mha {
namespace {

using core::round_to_bf16;

using Operands = test::GemmOperands;

// C = alpha op(A) op(B) + beta C, or (bias) C = A op(B) + bias, in bfloat16.
void run_bf16(const Operands& o, std::vector<float>& out) {
  cpu::GemmBatch batch(Precision::BFloat16);
  if (o.bias)
    batch.add(o.M, o.N, o.K, o.A.data(), o.lda, o.B.data(), o.ldb, o.trans_b, o.b.data(), out.data(), o.ldc);
  else
    batch.add(o.trans_a, o.trans_b, o.M, o.N, o.K, o.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, o.beta, out.data(),
              o.ldc);
  batch.run();
}

// The bound: |got - want| <= 1e-5 (|alpha| sum_k |a_ik b_kj| + |prior|)
// + 1e-30, want = alpha sum_k a_ik b_kj + prior in double over the
// bfloat16-rounded a and b (prior: bias, or beta C). Both paths' float32
// sums of K <= 1000 products of values in [-1, 1] stay more than 10x inside
// it (every shape here passes at 1e-6); the float32 product of the unrounded
// inputs is outside it (BoundRejectsTheUnroundedProduct).
::testing::AssertionResult within_bf16_bound(const Operands& o, const std::vector<float>& c0,
                                             const std::vector<float>& got) {
  const bool has_beta = !o.bias && o.beta != 0.0f;
  for (int64_t i = 0; i < o.M; ++i)
    for (int64_t j = 0; j < o.N; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < o.K; ++k) {
        const double p = static_cast<double>(round_to_bf16(o.a(i, k))) * round_to_bf16(o.bb(k, j));
        exact += p;
        magnitude += std::fabs(p);
      }
      const double alpha = o.bias ? 1.0 : o.alpha;
      const double prior = o.bias ? o.b[static_cast<size_t>(j)]
                                  : has_beta ? o.beta * static_cast<double>(c0[static_cast<size_t>(i * o.ldc + j)]) : 0.0;
      const double want = alpha * exact + prior;
      const double bound = 1e-5 * (std::fabs(alpha) * magnitude + std::fabs(prior)) + 1e-30;
      const double g = got[static_cast<size_t>(i * o.ldc + j)];
      if (!(std::fabs(g - want) <= bound))
        return ::testing::AssertionFailure() << "C[" << i << "," << j << "] = " << g << ", want " << want
                                             << ", bound " << bound << " (" << o.describe() << ")";
    }
  // Padding columns of C (past N) are never written.
  for (int64_t i = 0; i < o.M; ++i)
    for (int64_t j = o.N; j < o.ldc; ++j)
      if (std::memcmp(&got[static_cast<size_t>(i * o.ldc + j)], &c0[static_cast<size_t>(i * o.ldc + j)], 4) != 0)
        return ::testing::AssertionFailure() << "padding C[" << i << "," << j << "] written (" << o.describe() << ")";
  return ::testing::AssertionSuccess();
}

// Param: true runs the AMX path (skipped where unusable), false the portable one.
class GemmBf16Test : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    cpu::set_amx_enabled(GetParam());
    if (GetParam() && !cpu::amx_usable()) GTEST_SKIP() << "AMX (AMX-TILE, AMX-BF16, OS permission) not usable here";
  }
  void TearDown() override { cpu::set_amx_enabled(true); }
};

const int64_t kSmall[] = {1, 2, 15, 16, 17, 31, 33, 63, 100};

Operands random_operands(Generator& gen, int64_t M, int64_t N, int64_t K) {
  const float alphas[] = {1.0f, -0.5f, 3.0f};
  const float betas[] = {0.0f, 1.0f, 0.5f};
  const bool bias = gen.below(5) == 0;
  const bool trans_a = bias ? false : gen.below(2);  // the bias form has no trans_a
  const bool trans_b = gen.below(2);
  const int64_t pad = gen.below(2) ? 0 : 1 + gen.below(7);
  const float alpha = alphas[gen.below(3)], beta = betas[gen.below(3)];
  return Operands(gen, trans_a, trans_b, M, N, K, pad, alpha, beta, bias);
}

TEST_P(GemmBf16Test, SmallShapesWithinTheBound) {
  Generator gen(5);
  for (int64_t M : kSmall)
    for (int64_t N : kSmall)
      for (int64_t K : kSmall) {
        Operands o = random_operands(gen, M, N, K);
        // beta 0 never reads C: NaN there must not reach the result.
        std::vector<float> c0 = o.C;
        if (!o.bias && o.beta == 0.0f) std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
        std::vector<float> out = c0;
        run_bf16(o, out);
        ASSERT_TRUE(within_bf16_bound(o, c0, out));
      }
}

TEST_P(GemmBf16Test, LargeShapesWithinTheBound) {
  Generator gen(9);
  const int64_t shapes[][3] = {{768, 100, 768}, {100, 768, 1000}, {1000, 33, 100}, {17, 1000, 768},
                               {768, 63, 1000}, {1000, 100, 17},  {33, 768, 63},    {2, 1000, 1000}};
  for (const auto& s : shapes)
    for (int variant = 0; variant < 2; ++variant) {
      Operands o = random_operands(gen, s[0], s[1], s[2]);
      std::vector<float> out = o.C;
      run_bf16(o, out);
      ASSERT_TRUE(within_bf16_bound(o, o.C, out));
    }
}

TEST_P(GemmBf16Test, EmptySumIsBiasOrBetaC) {
  Generator gen(2);
  for (bool bias : {false, true})
    for (float beta : {0.0f, 0.5f}) {
      Operands o(gen, false, true, 17, 33, 0, 2, 2.0f, beta, bias);
      std::vector<float> c0 = o.C;
      if (beta == 0.0f) std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
      std::vector<float> out = c0;
      run_bf16(o, out);
      for (int64_t i = 0; i < o.M; ++i)
        for (int64_t j = 0; j < o.N; ++j) {
          const float c = c0[static_cast<size_t>(i * o.ldc + j)];
          const float want = bias ? o.b[static_cast<size_t>(j)] : beta == 0.0f ? 0.0f : beta * c;
          ASSERT_EQ(out[static_cast<size_t>(i * o.ldc + j)], want) << i << "," << j;
        }
    }
}

// Inputs are rounded as core::to_bf16 rounds (nearest, ties to even, NaN
// stays NaN, overflow to infinity): with K = 1 and one side 1, C is the
// rounded other side exactly.
TEST_P(GemmBf16Test, RoundsInputsToNearestEven) {
  const float tie_down = 1.0f + 0.5f / 128, tie_up = 1.0f + 1.5f / 128, above = 1.0f + 0.5f / 128 + 1e-6f;
  const float values[] = {tie_down, tie_up, above, -tie_up, 3.0e38f, std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 1e-30f};
  const int64_t N = sizeof(values) / sizeof(values[0]);
  for (bool trans_b : {false, true}) {
    std::vector<float> a = {1.0f}, c(static_cast<size_t>(N), 7.0f);
    cpu::GemmBatch batch(Precision::BFloat16);
    batch.add(false, trans_b, 1, N, 1, 1.0f, a.data(), 1, values, trans_b ? 1 : N, 0.0f, c.data(), N);
    batch.run();
    for (int64_t j = 0; j < N; ++j) {
      const float want = round_to_bf16(values[j]);
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(c[static_cast<size_t>(j)])) << j;
      else EXPECT_EQ(c[static_cast<size_t>(j)], want) << "value " << values[j] << " trans_b " << trans_b;
    }
  }
  EXPECT_EQ(round_to_bf16(tie_down), 1.0f);  // the tie went to the even neighbour
  EXPECT_EQ(round_to_bf16(tie_up), 1.0f + 2.0f / 128);
}

// Stacked weights (add_stacked): the same as one product with the weights
// concatenated, within the bound.
TEST_P(GemmBf16Test, StackedWeights) {
  Generator gen(4);
  const int64_t M = 70, K = 100, sizes[] = {33, 17, 48};
  Operands o(gen, false, true, M, 98, K, 0, 1.0f, 0.0f, true);
  std::vector<std::vector<float>> weights;
  std::vector<std::pair<const float*, int64_t>> parts;
  int64_t j0 = 0;
  for (int64_t n : sizes) {
    weights.emplace_back(o.B.begin() + j0 * K, o.B.begin() + (j0 + n) * K);  // rows j0..j0+n of B, apart
    parts.emplace_back(weights.back().data(), n);
    j0 += n;
  }
  std::vector<float> out = o.C;
  cpu::GemmBatch batch(Precision::BFloat16);
  batch.add_stacked(M, K, o.A.data(), o.lda, parts, o.b.data(), out.data(), o.ldc);
  batch.run();
  ASSERT_TRUE(within_bf16_bound(o, o.C, out));
  std::vector<float> whole = o.C;
  run_bf16(o, whole);
  EXPECT_EQ(0, std::memcmp(out.data(), whole.data(), out.size() * 4)) << "stacked differs from the whole product";
}

// The bound tells a bfloat16 product from a float32 one: the float32
// product of the same (unrounded) inputs lies outside it.
TEST(GemmBf16, BoundRejectsTheUnroundedProduct) {
  Generator gen(8);
  Operands o(gen, false, true, 31, 33, 100, 0, 1.0f, 0.0f, false);
  std::vector<float> out = o.C;
  cpu::GemmBatch batch(Precision::Float32);
  batch.add(false, true, o.M, o.N, o.K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f, out.data(), o.ldc);
  batch.run();
  EXPECT_FALSE(within_bf16_bound(o, o.C, out));
}

INSTANTIATE_TEST_SUITE_P(Paths, GemmBf16Test, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Amx" : "Portable"; });

}  // namespace
}  // namespace mha
