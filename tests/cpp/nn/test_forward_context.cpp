// mha::ForwardContext (mha/context.h): a call's backward and weights from its
// context, in any order, bitwise as the stateful API gives them right after
// the same call; the module keeps nothing of a contextful call.
#include <gtest/gtest.h>

#include <vector>

#include "mha/mha.h"
#include "test_util.h"

namespace mha {
namespace {

using test::random_tensor;

bool bitwise_equal(const Tensor& a, const Tensor& b) { return a.shape() == b.shape() && a.values() == b.values(); }

TEST(ForwardContext, BackwardsInAnyOrderEqualTheStatefulOnes) {
  Generator gen(3);
  const Tensor X1 = random_tensor({2, 5, 12}, gen), X2 = random_tensor({3, 4, 12}, gen);
  const Tensor G1 = random_tensor({2, 5, 12}, gen), G2 = random_tensor({3, 4, 12}, gen);
  const ValidLens lens = ValidLens::per_batch({1, 4, 2});
  for (AttentionKernel kernel : {AttentionKernel::Fused, AttentionKernel::Blas}) {
    auto module = [&] {
      MultiHeadAttention m(12, 3, /*dropout=*/0.25f, /*bias=*/true, /*seed=*/9);
      m.set_kernel(kernel);
      return m;
    };
    MultiHeadAttention s = module();
    s(X1, X1, X1);
    const Tensor a1 = s.backward(G1).queries;
    const Tensor w1 = s.attention_weights();
    s(X2, X2, X2, lens);
    const Tensor a2 = s.backward(G2).keys;

    MultiHeadAttention m = module();
    auto r1 = m.forward_with_context(X1, X1, X1);
    auto r2 = m.forward_with_context(X2, X2, X2, lens);
    EXPECT_TRUE(bitwise_equal(m.backward(r2.context, G2).keys, a2));
    EXPECT_TRUE(bitwise_equal(m.backward(r1.context, G1).queries, a1));
    EXPECT_TRUE(bitwise_equal(r1.context.attention_weights(), w1));
    EXPECT_TRUE(bitwise_equal(r1.context.attention_weights({1}, {2, 0}).reshape({2, 5, 5}),
                              Tensor({2, 5, 5}, [&] {
                                std::vector<float> v;
                                for (int64_t h : {2, 0})
                                  for (int64_t i = 0; i < 25; ++i) v.push_back(w1.data()[(1 * 3 + h) * 25 + i]);
                                return v;
                              }())));
    EXPECT_EQ(m.attention_weights().dim(), 0);  // nothing of either call in the module
    EXPECT_EQ(r2.context.num_keys(), 4);
    EXPECT_TRUE(r2.context.differentiable());
  }
}

TEST(ForwardContext, DropInCallsKeepTheirContextWhenAsked) {
  Generator gen(4);
  const int64_t E = 8, h = 2;
  StateDict state{{"in_proj_weight", random_tensor({3 * E, E}, gen)}, {"out_proj.weight", random_tensor({E, E}, gen)}};
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(state, h, test::batch_first_options());
  TorchMultiheadAttention s = TorchMultiheadAttention::from_state_dict(state, h, test::batch_first_options());
  const Tensor q = random_tensor({2, 3, E}, gen), k = random_tensor({2, 6, E}, gen), G = random_tensor({2, 3, E}, gen);
  TorchMhaCall call;
  call.keep_context = true;
  call.average_attn_weights = false;
  TorchMhaResult r = m.forward(q, k, k, call);
  ASSERT_FALSE(r.context.empty());
  EXPECT_TRUE(bitwise_equal(r.context.attention_weights(), *r.weights));
  m.forward(q, q, q);  // another call between
  s.forward(q, k, k);
  EXPECT_TRUE(bitwise_equal(m.backward(r.context, G).key, s.backward(G).key));
  EXPECT_TRUE(TorchMultiheadAttention::from_state_dict(state, h, test::batch_first_options()).forward(q, k, k).context.empty());
}

}  // namespace
}  // namespace mha
