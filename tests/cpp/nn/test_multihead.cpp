// MultiHeadAttention: the seed's check, modes, lazy widths, state dicts, errors.
// Numerical parity with the seed's PyTorch code lives in tests/python.
#include <cmath>

#include "mha/error.h"
#include "mha/multihead.h"
#include "test_util.h"

using namespace mha;
using mha::test::all_close;
using mha::test::random_tensor;
using mha::test::throws_with;

TEST(MultiHeadAttention, SeedCheck) {
  MultiHeadAttention attention(100, 5, 0.5f);
  const Tensor X({2, 4, 100}, 1.0f), Y({2, 6, 100}, 1.0f);
  const Tensor out = attention(X, Y, Y, ValidLens::per_batch({3, 2}));
  EXPECT_EQ(out.shape(), (Shape{2, 4, 100}));
  const Tensor& w = attention.attention_weights();
  ASSERT_EQ(w.shape(), (Shape{2, 5, 4, 6}));
  // Identical keys: the valid keys share the weight equally, masked ones get 0.
  for (int64_t h = 0; h < 5; ++h)
    for (int64_t q = 0; q < 4; ++q)
      for (int64_t k = 0; k < 6; ++k) {
        EXPECT_NEAR(w.at({0, h, q, k}), k < 3 ? 1.0f / 3 : 0.0f, 1e-7);
        EXPECT_NEAR(w.at({1, h, q, k}), k < 2 ? 0.5f : 0.0f, 1e-7);
      }
}

TEST(MultiHeadAttention, ComputesTheSeedsFormula) {
  // An independent composition from the public pieces: the projections, a
  // per-head masked softmax and W_o, checked against the module.
  const int64_t B = 2, Q = 3, K = 5, D = 6, H = 3, d = D / H;
  Generator gen(5);
  MultiHeadAttention m(D, H, 0.0f, /*bias=*/true, 1);
  const Tensor q = random_tensor({B, Q, 4}, gen), k = random_tensor({B, K, 7}, gen),
               v = random_tensor({B, K, 2}, gen);
  const ValidLens lens = ValidLens::per_query(B, Q, {1, 2.5f, 0, 5, 4, 3});
  const Tensor out = m(q, k, v, lens);
  Generator unused(0);
  const Tensor pq = m.W_q().forward(q, unused), pk = m.W_k().forward(k, unused),
               pv = m.W_v().forward(v, unused);
  Tensor concat({B, Q, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      Tensor scores({1, Q, K});
      for (int64_t i = 0; i < Q; ++i)
        for (int64_t j = 0; j < K; ++j) {
          double s = 0;
          for (int64_t c = 0; c < d; ++c) s += pq.at({b, i, h * d + c}) * pk.at({b, j, h * d + c});
          scores.at({0, i, j}) = static_cast<float>(s / std::sqrt(static_cast<double>(d)));
        }
      std::vector<float> row_lens(lens.values().begin() + b * Q, lens.values().begin() + (b + 1) * Q);
      const Tensor w = masked_softmax(scores, ValidLens::per_query(1, Q, row_lens));
      for (int64_t i = 0; i < Q; ++i)
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < K; ++j) acc += w.at({0, i, j}) * pv.at({b, j, h * d + c});
          concat.at({b, i, h * d + c}) = static_cast<float>(acc);
        }
    }
  EXPECT_TRUE(all_close(out, m.W_o().forward(concat, unused), 1e-5, 1e-6));
}

TEST(MultiHeadAttention, EvalEqualsZeroDropoutAndSeedsRepeat) {
  Generator gen(9);
  const Tensor q = random_tensor({3, 5, 8}, gen), kv = random_tensor({3, 7, 8}, gen);
  MultiHeadAttention a(8, 2, 0.4f, false, 42), b(8, 2, 0.4f, false, 42), zero(8, 2, 0.0f);
  const Tensor out_a = a(q, kv, kv), out_b = b(q, kv, kv);
  EXPECT_EQ(out_a, out_b);  // same seed: same initialisation and dropout
  zero.load_state_dict(a.state_dict());
  const Tensor train_zero = zero(q, kv, kv);
  a.eval();
  EXPECT_EQ(a(q, kv, kv), train_zero);  // eval mode == p = 0
  EXPECT_FALSE(out_a == a(q, kv, kv)) << "dropout 0.4 in training mode changed nothing";
}

TEST(MultiHeadAttention, ConstructorErrors) {
  EXPECT_TRUE(throws_with([] { MultiHeadAttention(100, 3, 0.0f); },
                          "num_hiddens: 100 is not divisible by num_heads 3"));
  EXPECT_TRUE(throws_with([] { MultiHeadAttention(8, 0, 0.0f); }, "num_heads"));
  EXPECT_TRUE(throws_with([] { MultiHeadAttention(8, 2, 1.5f); }, "dropout"));
  EXPECT_TRUE(throws_with([] { MultiHeadAttention(8, 2, NAN); }, "dropout"));
}

TEST(MultiHeadAttention, ForwardErrorsNameTheArgumentAndShapes) {
  MultiHeadAttention m(8, 2);
  const Tensor q({2, 3, 4}), k({2, 5, 6}), v({2, 5, 6});
  EXPECT_TRUE(throws_with([&] { m(q, Tensor({3, 5, 6}), v); }, "keys: batch size 3 differs from queries' 2"));
  EXPECT_TRUE(throws_with([&] { m(q, k, Tensor({3, 5, 6})); }, "values: batch size 3"));
  EXPECT_TRUE(throws_with([&] { m(q, k, Tensor({2, 4, 6})); }, "values: shape (2, 4, 6) has 4 positions but keys (2, 5, 6) have 5"));
  EXPECT_TRUE(throws_with([&] { m(Tensor({2, 3}), k, v); }, "queries: shape (2, 3) is not (B, Q, Dq)"));
  EXPECT_TRUE(throws_with([&] { m(q, k, v, ValidLens::per_batch({1, 2, 3})); }, "valid_lens: shape (3,)"));
  EXPECT_TRUE(throws_with([&] { m(q, k, v, ValidLens::per_query(2, 2, {1, 2, 3, 4})); }, "valid_lens: shape (2, 2)"));
  EXPECT_TRUE(throws_with([&] { m(q, k, v, ValidLens::per_batch({1, -2})); }, "entry 1 is -2"));
  EXPECT_TRUE(throws_with([&] { m(q, k, v, ValidLens::per_batch({NAN, 1})); }, "entry 0 is NaN"));
  m(q, k, v);  // fixes the widths 4, 6, 6
  EXPECT_TRUE(throws_with([&] { m(Tensor({2, 3, 5}), k, v); }, "queries: width 5"));
  EXPECT_TRUE(throws_with([&] { m(q, Tensor({2, 5, 7}), v); }, "keys: width 7"));
  EXPECT_TRUE(throws_with([&] { m(q, k, Tensor({2, 5, 3})); }, "values: width 3"));
}

TEST(MultiHeadAttention, FailedCallLeavesLazyWidthsUnset) {
  MultiHeadAttention m(8, 2);
  EXPECT_THROW(m(Tensor({2, 3, 4}), Tensor({2, 5, 6}), Tensor({2, 4, 6})), Error);
  EXPECT_FALSE(m.W_q().initialized());
  m(Tensor({1, 3, 9}), Tensor({1, 5, 6}), Tensor({1, 5, 6}));
  EXPECT_EQ(m.W_q().in_features(), 9);
}

TEST(MultiHeadAttention, StateDictRoundTripAndErrors) {
  Generator gen(1);
  MultiHeadAttention a(6, 3, 0.0f, true, 3);
  const Tensor q = random_tensor({2, 4, 5}, gen), kv = random_tensor({2, 3, 7}, gen);
  const Tensor out = a(q, kv, kv);
  StateDict s = a.state_dict();
  EXPECT_EQ(s.size(), 8u);
  EXPECT_EQ(s.at("W_k.weight").shape(), (Shape{6, 7}));
  EXPECT_EQ(s.at("W_o.bias").shape(), (Shape{6}));
  MultiHeadAttention b(6, 3, 0.0f, true, 99);
  b.load_state_dict(s);
  EXPECT_EQ(b(q, kv, kv), out);

  MultiHeadAttention no_bias(6, 3);
  EXPECT_TRUE(throws_with([&] { no_bias.load_state_dict(s); }, "unexpected parameter 'W_k.bias'"));
  StateDict missing = s;
  missing.erase("W_v.weight");
  EXPECT_TRUE(throws_with([&] { b.load_state_dict(missing); }, "missing parameter 'W_v.weight'"));
  StateDict bad = s;
  bad["W_o.weight"] = Tensor({6, 5});
  EXPECT_TRUE(throws_with([&] { b.load_state_dict(bad); }, "W_o.weight: shape (6, 5) is not (6, 6)"));
  bad = s;
  bad["W_q.bias"] = Tensor({5});
  EXPECT_TRUE(throws_with([&] { b.load_state_dict(bad); }, "W_q.bias: shape (5,) is not (6,)"));
  bad = s;
  bad["W_q.weight"] = Tensor({6, 4});  // b's W_q was fixed at width 5
  EXPECT_TRUE(throws_with([&] { b.load_state_dict(bad); }, "differs from the initialised (6, 5)"));
  EXPECT_EQ(b(q, kv, kv), out) << "a failed load changed the module";
}

TEST(LazyLinear, PyTorchInitialisationBounds) {
  Generator gen(0);
  LazyLinear layer(64, true);
  EXPECT_FALSE(layer.initialized());
  layer.forward(Tensor({2, 49}), gen);
  const float bound = 1.0f / 7.0f;
  float lo = 1, hi = -1;
  for (float x : layer.weight().values()) lo = std::min(lo, x), hi = std::max(hi, x);
  for (float x : layer.bias().values()) lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_GE(lo, -bound);
  EXPECT_LT(hi, bound);
  // 3200 uniform draws fill the interval: the extremes come within 1% of it.
  EXPECT_LT(lo, -0.99f * bound);
  EXPECT_GT(hi, 0.99f * bound);
  EXPECT_TRUE(throws_with([&] { layer.forward(Tensor({2, 50}), gen); }, "input width 50 differs from the width 49"));
}
