// The BLAS path held to the plain reference, and masked_softmax's rules.
#include <cmath>

#include "kernels/attention_params.h"
#include "kernels/dispatch.h"
#include "mha/attention.h"
#include "mha/error.h"
#include "test_util.h"

using namespace mha;
using mha::test::all_close;
using mha::test::random_tensor;
using mha::test::throws_with;

namespace {

struct Case {
  int64_t B, H, Q, K, d;
  ValidLens lens;
  float dropout;
};

// Runs `kernel` on (B, L, H*d) buffers viewed as heads; returns (out, weights).
std::pair<Tensor, Tensor> run(AttentionKernel kernel, const Case& c, const Tensor& q,
                              const Tensor& k, const Tensor& v, uint64_t key) {
  Tensor out({c.B, c.Q, c.H * c.d}), w({c.B, c.H, c.Q, c.K});
  kernels::AttentionForward p;
  p.q = q.view().split_heads(c.H);
  p.k = k.view().split_heads(c.H);
  p.v = v.view().split_heads(c.H);
  p.out = out.view().split_heads(c.H);
  p.weights = w.data();
  kernels::set_lengths(p, c.lens);
  p.scale_divisor = std::sqrt(static_cast<float>(c.d));
  p.dropout = {c.dropout, key};
  (void)kernels::attention_forward(kernel, p);
  return {out, w};
}

}  // namespace

TEST(AttentionKernels, BlasMatchesReferenceOnAwkwardShapes) {
  Generator gen(7);
  const int64_t sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64};
  int cases = 0;
  for (int trial = 0; trial < 60; ++trial) {
    Case c;
    c.B = 1 + static_cast<int64_t>(gen.below(3));
    c.H = 1 + static_cast<int64_t>(gen.below(4));
    c.Q = sizes[gen.below(10)];
    c.K = sizes[gen.below(10)];
    c.d = 1 + static_cast<int64_t>(gen.below(12));
    c.dropout = trial % 3 == 0 ? 0.3f : 0.0f;
    std::vector<float> lens;
    switch (trial % 4) {
      case 0: break;
      case 1:
        for (int64_t b = 0; b < c.B; ++b) lens.push_back(static_cast<float>(gen.below(c.K + 3)));
        c.lens = ValidLens::per_batch(lens);
        break;
      case 2:
        for (int64_t i = 0; i < c.B * c.Q; ++i) lens.push_back(gen.uniform(0.0f, c.K + 1.0f));
        c.lens = ValidLens::per_query(c.B, c.Q, lens);
        break;
      case 3:
        c.lens = ValidLens::per_batch(std::vector<float>(c.B, 0.0f));  // everything masked
        break;
    }
    const Tensor q = random_tensor({c.B, c.Q, c.H * c.d}, gen, -2, 2);
    const Tensor k = random_tensor({c.B, c.K, c.H * c.d}, gen, -2, 2);
    const Tensor v = random_tensor({c.B, c.K, c.H * c.d}, gen);
    const uint64_t key = gen.next();
    auto [ref_out, ref_w] = run(AttentionKernel::Reference, c, q, k, v, key);
    auto [out, w] = run(AttentionKernel::Blas, c, q, k, v, key);
    EXPECT_TRUE(all_close(w, ref_w, 1e-5, 1e-6)) << "trial " << trial;
    EXPECT_TRUE(all_close(out, ref_out, 1e-5, 1e-5)) << "trial " << trial;
    ++cases;
  }
  EXPECT_EQ(cases, 60);
}

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
