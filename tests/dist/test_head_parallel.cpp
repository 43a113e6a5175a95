// HeadParallelAttention against the single-process MultiHeadAttention: the
// same output, input gradients and (gathered) weight gradients, with uneven
// head counts and, under -np 4, ranks that own no head.
#include <algorithm>
#include <set>

#include "dist_test_util.h"

namespace mha::dist::test {
namespace {

constexpr double kTol = 1e-5;

struct Case {
  int64_t num_hiddens, num_heads;
  bool bias;
};
// 3 heads over 2 ranks: 2 + 1; over 4: 1 + 1 + 1 + 0. 5 heads over 4: 2 + 1 + 1 + 1.
const Case kCases[] = {{12, 3, true}, {8, 2, false}, {20, 5, true}, {6, 1, true}};

struct Inputs {
  Tensor q, k, v;
};
Inputs inputs(int64_t B, int64_t Q, int64_t K, uint64_t seed) {
  return {randn({B, Q, 7}, seed), randn({B, K, 6}, seed + 1), randn({B, K, 5}, seed + 2)};
}

TEST(HeadParallel, HeadsOfSplitsEveryHeadOnceAsEvenlyAsPossible) {
  for (int64_t heads : {1, 2, 3, 5, 8})
    for (int size : {1, 2, 3, 4, 7}) {
      std::vector<int64_t> all;
      size_t most = 0, least = 1000;
      for (int r = 0; r < size; ++r) {
        const auto h = HeadParallelAttention::heads_of(heads, size, r);
        all.insert(all.end(), h.begin(), h.end());
        most = std::max(most, h.size());
        least = std::min(least, h.size());
      }
      EXPECT_EQ(static_cast<int64_t>(all.size()), heads) << heads << " heads, " << size << " ranks";
      for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
      EXPECT_LE(most - least, 1u);
    }
}

TEST(HeadParallel, ForwardEqualsTheModule) {
  const Communicator& c = world();
  for (const Case& k : kCases) {
    auto ref = reference_module(k.num_hiddens, k.num_heads, k.bias, 7, 6, 5, 11);
    HeadParallelAttention hp(c, k.num_hiddens, k.num_heads, ref->state_dict());
    hp.eval();
    const Inputs x = inputs(2, 3, 5, 20);
    for (const ValidLens& lens : {ValidLens(), ValidLens::per_batch({3, 0}),
                                  ValidLens::per_query(2, 3, {1, 2.5f, 5, 0, 4, 1})}) {
      const Tensor want = ref->forward(x.q, x.k, x.v, lens);
      const Tensor got = hp.forward(x.q, x.k, x.v, lens);
      EXPECT_LT(relative_error(got, want), kTol) << k.num_hiddens << "/" << k.num_heads << " rank " << c.rank();
    }
    CallMasks causal;
    causal.causal = Causal::BottomRight;
    const ValidLens lens = ValidLens::per_batch({4, 2});
    EXPECT_LT(relative_error(hp.forward(x.q, x.k, x.v, lens, causal), ref->forward(x.q, x.k, x.v, lens, causal)), kTol);
  }
}

TEST(HeadParallel, BackwardEqualsTheModule) {
  const Communicator& c = world();
  for (const Case& k : kCases) {
    auto ref = reference_module(k.num_hiddens, k.num_heads, k.bias, 7, 6, 5, 12);
    HeadParallelAttention hp(c, k.num_hiddens, k.num_heads, ref->state_dict());
    ref->train();
    hp.train();
    const Inputs x = inputs(2, 3, 4, 30);
    const ValidLens lens = ValidLens::per_batch({3, 1.5f});
    const Tensor grad_out = randn({2, 3, k.num_hiddens}, 40);
    for (int call = 0; call < 2; ++call) {  // gradients accumulate over calls
      ref->forward(x.q, x.k, x.v, lens);
      hp.forward(x.q, x.k, x.v, lens);
      const auto want = ref->backward(grad_out);
      const auto got = hp.backward(grad_out);
      EXPECT_LT(relative_error(got.queries, want.queries), kTol);
      EXPECT_LT(relative_error(got.keys, want.keys), kTol);
      EXPECT_LT(relative_error(got.values, want.values), kTol);
    }
    const StateDict grads = hp.gather_grads();
    if (c.rank() == 0) {
      ASSERT_EQ(grads.size(), ref->grads().size());
      double largest = 0;  // W_k.bias's gradient is 0 up to rounding: compare it at the module's scale
      for (const auto& [name, g] : ref->grads())
        for (float v : g.values()) largest = std::max(largest, static_cast<double>(std::fabs(v)));
      for (const auto& [name, g] : ref->grads())
        EXPECT_LT(relative_error(grads.at(name), g, name == "W_k.bias" ? largest : 0.0), kTol) << name;
    } else {
      EXPECT_TRUE(grads.empty());
      if (hp.shard() && k.bias) {  // the output bias lives on rank 0: its copy here stays 0
        const Tensor grad = hp.shard()->grads().at("W_o.bias"), value = hp.shard()->state_dict().at("W_o.bias");
        for (float v : grad.values()) EXPECT_EQ(v, 0.0f);
        for (float v : value.values()) EXPECT_EQ(v, 0.0f);
      }
    }
    hp.zero_grad();
    const StateDict zero = hp.gather_grads();
    for (const auto& [name, g] : zero)
      for (float v : g.values()) EXPECT_EQ(v, 0.0f) << name;
  }
}

TEST(HeadParallel, ShardsHoldTheirHeadsAndGatherBackToTheStateDict) {
  const Communicator& c = world();
  for (const Case& k : kCases) {
    auto ref = reference_module(k.num_hiddens, k.num_heads, k.bias, 7, 6, 5, 13);
    HeadParallelAttention hp(c, k.num_hiddens, k.num_heads, ref->state_dict());
    const auto mine = HeadParallelAttention::heads_of(k.num_heads, c.size(), c.rank());
    EXPECT_EQ(hp.heads(), mine);
    ASSERT_EQ(hp.shard() != nullptr, !mine.empty());
    if (hp.shard()) {
      EXPECT_EQ(hp.shard()->kept_heads(), mine);
      EXPECT_EQ(hp.shard()->num_hiddens(), k.num_hiddens);  // W_o keeps the full output width
    }
    const StateDict full = hp.gather_state_dict();
    if (c.rank() == 0) {
      ASSERT_EQ(full.size(), ref->state_dict().size());
      for (const auto& [name, t] : ref->state_dict()) EXPECT_EQ(full.at(name), t) << name;
    } else {
      EXPECT_TRUE(full.empty());
    }
  }
}

TEST(HeadParallel, SameRanksGiveBitwiseTheSameResults) {
  const Communicator& c = world();
  auto ref = reference_module(20, 5, true, 7, 6, 5, 150);
  const Tensor q = randn({2, 9, 7}, 151), k = randn({2, 11, 6}, 152), v = randn({2, 11, 5}, 153),
               g = randn({2, 9, 20}, 154);
  std::vector<Tensor> results[2];
  for (auto& result : results) {
    HeadParallelAttention heads(c, 20, 5, ref->state_dict());
    heads.train();
    result.push_back(heads.forward(q, k, v, ValidLens::per_batch({4, 11})));
    const auto grads = heads.backward(g);
    result.insert(result.end(), {grads.queries, grads.keys, grads.values});
    for (const auto& [name, t] : heads.gather_grads()) result.push_back(t);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i)
    EXPECT_TRUE(bitwise_equal(results[0][i], results[1][i])) << "result " << i << " rank " << c.rank();
}

}  // namespace
}  // namespace mha::dist::test
