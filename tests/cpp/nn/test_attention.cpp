// masked_softmax's rules and DotProductAttention's dropout. (Every kernel
// against the reference: tests/cpp/kernels/test_kernel_cases.cpp.)
#include <cmath>

#include "mha/attention.h"
#include "mha/error.h"
#include "test_util.h"

using namespace mha;
using mha::test::all_close;
using mha::test::random_tensor;
using mha::test::throws_with;

TEST(MaskedSoftmax, SeedRules) {
  // One row of 4 keys with lengths 0 (uniform over all keys), 2.5 (keys
  // 0, 1, 2), and 9 (> K: nothing masked).
  Tensor X({3, 1, 4}, std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4});
  Tensor w = masked_softmax(X, ValidLens::per_batch({0.0f, 2.5f, 9.0f}));
  for (int64_t j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(w.at({0, 0, j}), 0.25f);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(w.at({1, 0, 0}), std::exp(1.0) / z, 1e-7);
  EXPECT_NEAR(w.at({1, 0, 2}), std::exp(3.0) / z, 1e-7);
  EXPECT_EQ(w.at({1, 0, 3}), 0.0f);  // exactly zero, not tiny
  const double z4 = z + std::exp(4.0);
  EXPECT_NEAR(w.at({2, 0, 3}), std::exp(4.0) / z4, 1e-7);
}

TEST(MaskedSoftmax, PerQueryLengthsAndErrors) {
  Tensor X({1, 2, 3}, 0.0f);
  Tensor w = masked_softmax(X, ValidLens::per_query(1, 2, {1.0f, 3.0f}));
  EXPECT_FLOAT_EQ(w.at({0, 0, 0}), 1.0f);
  EXPECT_FLOAT_EQ(w.at({0, 1, 2}), 1.0f / 3.0f);
  EXPECT_TRUE(throws_with([&] { masked_softmax(X, ValidLens::per_batch({1, 2})); },
                          "valid_lens: shape (2,)"));
  EXPECT_TRUE(throws_with([&] { masked_softmax(X, ValidLens::per_batch({-1})); }, "must be >= 0"));
  EXPECT_TRUE(throws_with([&] { masked_softmax(X, ValidLens::per_batch({NAN})); }, "NaN"));
  EXPECT_TRUE(throws_with([&] { masked_softmax(Tensor({3, 3}), {}); }, "is not (N, Q, K)"));
}

TEST(DotProductAttention, DropoutZeroesAFractionPAndScalesSurvivors) {
  // With values = identity, the output rows are the dropped-out weights.
  const int64_t N = 8, Q = 64, K = 64, d = 8;
  const float p = 0.3f;
  Generator gen(3);
  DotProductAttention attention(p, 11);
  Tensor eye({N, K, K}, 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) eye.at({n, j, j}) = 1.0f;
  const Tensor q = random_tensor({N, Q, d}, gen), k = random_tensor({N, K, d}, gen);
  const Tensor out = attention.forward(q, k, eye);
  const Tensor& w = attention.attention_weights();
  int64_t zeros = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (out.data()[i] == 0.0f) {
      ++zeros;
    } else {
      EXPECT_NEAR(out.data()[i], w.data()[i] / (1.0f - p), 1e-6f * (1 + w.data()[i]));
    }
  }
  // Binomial(n, p): 5 standard deviations is a false alarm once in ~3.5 million runs.
  const double n = static_cast<double>(out.numel());
  const double frac = zeros / n, sigma = std::sqrt(p * (1 - p) / n);
  EXPECT_NEAR(frac, p, 5 * sigma) << zeros << " of " << n << " zeroed";
  // Evaluation mode is the identity: out = weights.
  attention.eval();
  const Tensor out_eval = attention.forward(q, k, eye);
  EXPECT_TRUE(all_close(out_eval, attention.attention_weights(), 1e-6, 1e-7));
}
