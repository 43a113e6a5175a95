// MultiHeadAttention on its default fused path against the same module on
// the reference kernel: padding skipped in the projections, lazy weights,
// weights of a subset, thread-count independence.
//
// Tolerance as in test_fused_attention.cpp: 1e-5 relative + 1e-6 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mha/mha.h"

namespace mha {
namespace {

void expect_close(const Tensor& got, const Tensor& want, const std::string& what,
                  float rtol = 1e-5f, float atol = 1e-6f) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    const float g = got.data()[i], w = want.data()[i];
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", reference " << w;
      ++bad;
    }
  }
}

Tensor random_tensor(Shape shape, Generator& g) {
  Tensor t(std::move(shape));
  for (float& x : t.values()) x = g.uniform(-1.0f, 1.0f);
  return t;
}

struct Pair {
  MultiHeadAttention fused, reference;
  Pair(int64_t D, int64_t H, bool bias) : fused(D, H, 0.0f, bias, 7), reference(D, H, 0.0f, bias, 7) {
    fused.eval();
    reference.eval();
    reference.set_kernel(AttentionKernel::Reference);
  }
};

TEST(FusedModule, IsTheDefaultAndMatchesTheReferenceWithPadding) {
  Generator g(1);
  for (bool bias : {false, true}) {
    Pair m(48, 4, bias);
    EXPECT_EQ(m.fused.kernel(), AttentionKernel::Fused);
    // Self-attention (one stacked product), cross-attention with keys =
    // values, and all inputs distinct; lengths per row and per query,
    // including 0 (uniform over all keys, so all value rows are needed).
    const Tensor X = random_tensor({3, 37, 48}, g);
    const Tensor Y = random_tensor({3, 53, 20}, g);
    const Tensor Z = random_tensor({3, 53, 30}, g);
    const ValidLens per_batch = ValidLens::per_batch({5.0f, 0.0f, 36.5f});
    std::vector<float> per_query_lens(3 * 37);
    for (size_t i = 0; i < per_query_lens.size(); ++i)
      per_query_lens[i] = static_cast<float>(g.below(60)) * 0.75f;
    const ValidLens per_query = ValidLens::per_query(3, 37, per_query_lens);
    expect_close(m.fused(X, X, X, per_batch), m.reference(X, X, X, per_batch), "self, per batch");
    expect_close(m.fused.attention_weights(), m.reference.attention_weights(), "self weights");
    Pair cross(48, 4, bias);
    expect_close(cross.fused(X, Y, Y, per_query), cross.reference(X, Y, Y, per_query), "keys = values");
    expect_close(cross.fused.attention_weights(), cross.reference.attention_weights(), "cross weights");
    Pair distinct(48, 4, bias);
    expect_close(distinct.fused(X, Y, Z, per_batch), distinct.reference(X, Y, Z, per_batch), "distinct");
  }
}

TEST(FusedModule, WeightsOfASubsetAreThoseOfTheFullTensor) {
  Generator g(2);
  Pair m(30, 3, false);
  const Tensor X = random_tensor({4, 21, 30}, g);
  const ValidLens lens = ValidLens::per_batch({3.0f, 21.0f, 0.0f, 9.5f});
  m.fused(X, X, X, lens);
  m.reference(X, X, X, lens);
  const Tensor sub = m.fused.attention_weights({3, 0, 2}, {2, 0});  // before the full ones exist
  const Tensor& all = m.reference.attention_weights();
  ASSERT_EQ(sub.shape(), (Shape{3, 2, 21, 21}));
  const int64_t rows[] = {3, 0, 2}, heads[] = {2, 0};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int64_t q = 0; q < 21; ++q)
        for (int64_t k = 0; k < 21; ++k) {
          const float want = all.at({rows[i], heads[j], q, k});
          EXPECT_NEAR(sub.at({i, j, q, k}), want, 1e-6 + 1e-5 * std::fabs(want));
        }
  EXPECT_THROW(m.fused.attention_weights({4}, {0}), Error);
  EXPECT_THROW(m.fused.attention_weights({0}, {3}), Error);
  MultiHeadAttention fresh(30, 3);
  EXPECT_TRUE(fresh.attention_weights().empty());
  EXPECT_THROW(fresh.attention_weights({0}, {0}), Error);
}

// A score within ~104 of the -1e6 fill gives the masked keys non-zero weight
// (the seed's softmax sees them), so their value rows must be projected even
// though every length is > 0. Weights (1x1) and inputs make the one real
// score -999995: masked keys then weigh e^-5 each against the real key, and
// their values (100) move the output by ~2.6.
TEST(FusedModule, ScoresNearTheFillStillProjectMaskedValues) {
  Pair m(1, 1, false);
  StateDict s;
  for (const char* n : {"W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"}) s[n] = Tensor({1, 1}, 1.0f);
  m.fused.load_state_dict(s);
  m.reference.load_state_dict(s);
  const Tensor queries({1, 1, 1}, 1000.0f);
  Tensor keys({1, 5, 1}, -999.995f);
  Tensor values({1, 5, 1}, 100.0f);
  values.at({0, 0, 0}) = 0.0f;
  const ValidLens lens = ValidLens::per_batch({1.0f});
  const Tensor want = m.reference(queries, keys, values, lens);
  const Tensor got = m.fused(queries, keys, values, lens);
  ASSERT_GT(want.at({0, 0, 0}), 1.0f) << "the masked keys should carry weight in the reference";
  // Scores of magnitude 1e6 carry float32 rounding of ~0.06: a loose bound,
  // but a skipped projection would give 0.
  EXPECT_NEAR(got.at({0, 0, 0}), want.at({0, 0, 0}), 0.15f * want.at({0, 0, 0}));
}

TEST(FusedModule, BitwiseTheSameAtAnyThreadCount) {
  Generator g(3);
  const Tensor X = random_tensor({2, 300, 64}, g);
  const ValidLens lens = ValidLens::per_batch({300.0f, 111.0f});
  const int saved = num_threads();
  std::vector<Tensor> outs, weights;
  for (int n : {1, 2, 3}) {
    set_num_threads(n);
    MultiHeadAttention m(64, 4, 0.2f, true, 5);  // training mode: dropout on
    outs.push_back(m(X, X, X, lens));
    weights.push_back(m.attention_weights());
  }
  set_num_threads(saved);
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_TRUE(outs[i] == outs[0]) << "output at " << i + 1 << " threads differs from 1 thread";
    EXPECT_TRUE(weights[i] == weights[0]) << "weights at " << i + 1 << " threads differ";
  }
  EXPECT_THROW(set_num_threads(0), Error);
}

}  // namespace
}  // namespace mha

namespace mha {
namespace {

// The seed's DotProductAttention helper runs the fused kernel by default too,
// with its weights formed eagerly (it has no lazy state).
TEST(FusedModule, DotProductAttentionMatchesTheReference) {
  Generator g(4);
  const Tensor q = random_tensor({3, 50, 9}, g), k = random_tensor({3, 70, 9}, g),
               v = random_tensor({3, 70, 5}, g);
  const ValidLens lens = ValidLens::per_batch({0.0f, 33.5f, 80.0f});
  DotProductAttention fused(0.3f, 2), reference(0.3f, 2);  // training mode: dropout on
  reference.set_kernel(AttentionKernel::Reference);
  expect_close(fused.forward(q, k, v, lens), reference.forward(q, k, v, lens), "output");
  expect_close(fused.attention_weights(), reference.attention_weights(), "weights");
}

}  // namespace
}  // namespace mha

namespace mha {
namespace {

// A training step on the fused path (padding skipped, fused backward from the
// forward's statistics) against the reference kernel's: input and parameter
// gradients within 1e-5 of the largest gradient element of the step.
TEST(FusedModule, TrainingGradientsMatchTheReference) {
  Generator g(9);
  for (float dropout : {0.0f, 0.25f}) {
    MultiHeadAttention fused(32, 4, dropout, true, 11), reference(32, 4, dropout, true, 11);
    reference.set_kernel(AttentionKernel::Reference);
    const Tensor X = random_tensor({3, 45, 32}, g), Y = random_tensor({3, 70, 24}, g);
    const ValidLens lens = ValidLens::per_batch({0.0f, 70.0f, 17.5f});
    const Tensor grad_out = random_tensor({3, 45, 32}, g);
    for (auto* m : {&fused, &reference}) {
      m->train();
      (*m)(X, Y, Y, lens);
    }
    const auto gf = fused.backward(grad_out), gr = reference.backward(grad_out);
    // One scale for all: W_k.bias's true gradient is exactly 0 (a constant
    // added to every score of a row does not change its softmax), so its
    // own magnitude is rounding noise in either path.
    double scale = 0;
    auto grow = [&](const Tensor& t) {
      for (float x : t.values()) scale = std::fmax(scale, std::fabs(double(x)));
    };
    for (const Tensor* t : {&gr.queries, &gr.keys, &gr.values}) grow(*t);
    for (const auto& [name, t] : reference.grads()) grow(t);
    auto check = [&](const Tensor& got, const Tensor& want, const std::string& what) {
      double err = 0;
      for (int64_t i = 0; i < want.numel(); ++i)
        err = std::fmax(err, std::fabs(double(got.data()[i]) - want.data()[i]));
      EXPECT_LE(err, 1e-5 * scale) << what;
    };
    check(gf.queries, gr.queries, "grad queries");
    check(gf.keys, gr.keys, "grad keys");
    check(gf.values, gr.values, "grad values");
    for (const auto& [name, t] : reference.grads()) check(fused.grads().at(name), t, name);
  }
}

// A module's training steps reuse the buffers of its earlier calls (the
// forward's and the backward's scratch, taken by element count). After steps
// of other shapes with the same element counts, a step gives the bits a
// fresh module gives: no stale value reaches a result.
TEST(FusedModule, ReusedBuffersGiveAFreshModulesBits) {
  Generator g(12);
  const Tensor X = random_tensor({4, 30, 32}, g), grad_out = random_tensor({4, 30, 32}, g);
  const ValidLens lens = ValidLens::per_batch({30.0f, 7.0f, 0.0f, 19.0f});
  MultiHeadAttention fresh(32, 4, 0.0f, true, 5), used(32, 4, 0.0f, true, 5);
  fresh.train();
  used.train();
  for (const Shape& shape : {Shape{2, 60, 32}, Shape{8, 15, 32}, Shape{3, 40, 32}}) {
    const Tensor x = random_tensor(shape, g);
    used(x, x, x, ValidLens());
    used.backward(random_tensor(shape, g));
  }
  used.zero_grad();
  const Tensor out_fresh = fresh(X, X, X, lens), out_used = used(X, X, X, lens);
  EXPECT_EQ(out_used, out_fresh);
  const auto g_fresh = fresh.backward(grad_out), g_used = used.backward(grad_out);
  EXPECT_EQ(g_used.queries, g_fresh.queries);
  EXPECT_EQ(g_used.keys, g_fresh.keys);
  EXPECT_EQ(g_used.values, g_fresh.values);
  for (const auto& [name, t] : fresh.grads()) EXPECT_EQ(used.grads().at(name), t) << name;
}

}  // namespace
}  // namespace mha
