// GridAttention against the single-process MultiHeadAttention: heads and
// sequence split at once (2 x 2 under -np 4; 2 x 1 and 1 x 2 under -np 2),
// each rank's rows of the output, of the attention weights of its heads and
// of the input gradients; weight gradients of its heads.
#include "dist_test_util.h"

namespace mha::dist::test {
namespace {

constexpr double kTol = 1e-5;

struct Run {
  int64_t B, Q, K;
  ValidLens lens;
  Causal causal = Causal::None;
  Window window = {};
};

ValidLens local_lens(const ValidLens& lens, int64_t B, int64_t Q, int64_t begin, int64_t n) {
  if (lens.kind() != ValidLens::Kind::PerQuery) return lens;
  std::vector<float> mine;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) mine.push_back(lens.values()[static_cast<size_t>(b * Q + begin + i)]);
  return ValidLens::per_query(B, n, mine);
}

void check(int groups, const Run& run, int64_t num_hiddens, int64_t num_heads, bool bias, uint64_t seed) {
  const Communicator& c = world();
  auto ref = reference_module(num_hiddens, num_heads, bias, 7, 6, 5, seed);
  ref->train();  // dropout 0: the same output, and a backward
  GridAttention grid(c, groups, num_hiddens, num_heads, ref->state_dict());
  ASSERT_EQ(grid.head_groups() * grid.sequence_blocks(), c.size());
  grid.keep_attention_weights(true);
  const Tensor q = randn({run.B, run.Q, 7}, seed + 1), k = randn({run.B, run.K, 6}, seed + 2),
               v = randn({run.B, run.K, 5}, seed + 3), g = randn({run.B, run.Q, num_hiddens}, seed + 4);
  CallMasks masks;
  masks.causal = run.causal;
  masks.window = run.window;
  const Tensor want = ref->forward(q, k, v, run.lens, masks);
  const auto [q0, qn] = grid.query_block(run.Q);
  const auto [k0, kn] = grid.key_block(run.K);
  const Tensor got = grid.forward(rows(q, q0, qn), rows(k, k0, kn), rows(v, k0, kn),
                                  local_lens(run.lens, run.B, run.Q, q0, qn), masks);
  const std::string where = "G " + std::to_string(groups) + ", rank " + std::to_string(c.rank());
  EXPECT_LT(relative_error(got, rows(want, q0, qn)), kTol) << where;
  const std::vector<int64_t>& heads = grid.heads();
  EXPECT_LT(relative_error(grid.attention_weights(),
                           query_rows(head_slice(ref->attention_weights(), heads.front(),
                                                 static_cast<int64_t>(heads.size())),
                                      q0, qn)),
            kTol)
      << "weights, " << where;
  const auto gw = ref->backward(g);
  const auto gg = grid.backward(rows(g, q0, qn));
  EXPECT_LT(relative_error(gg.queries, rows(gw.queries, q0, qn)), kTol) << "dX_q, " << where;
  EXPECT_LT(relative_error(gg.keys, rows(gw.keys, k0, kn)), kTol) << "dX_k, " << where;
  EXPECT_LT(relative_error(gg.values, rows(gw.values, k0, kn)), kTol) << "dX_v, " << where;
  // This group's heads' rows of W_q's gradient, columns of W_o's.
  const int64_t d = num_hiddens / num_heads, r0 = heads.front() * d, n = static_cast<int64_t>(heads.size()) * d;
  const Tensor& wq = ref->grads().at("W_q.weight");
  Tensor wq_rows({n, wq.size(1)});
  std::copy(wq.data() + r0 * wq.size(1), wq.data() + (r0 + n) * wq.size(1), wq_rows.data());
  EXPECT_LT(relative_error(grid.ring().grads().at("W_q.weight"), wq_rows), kTol) << "W_q grad, " << where;
  const Tensor& wo = ref->grads().at("W_o.weight");
  Tensor wo_cols({num_hiddens, n});
  for (int64_t o = 0; o < num_hiddens; ++o)
    std::copy(wo.data() + o * num_hiddens + r0, wo.data() + o * num_hiddens + r0 + n, wo_cols.data() + o * n);
  EXPECT_LT(relative_error(grid.ring().grads().at("W_o.weight"), wo_cols), kTol) << "W_o grad, " << where;
  // Every group's gradients, assembled on rank 0 (W_k.bias's is 0 up to rounding).
  const StateDict full = grid.gather_grads();
  if (c.rank() != 0) {
    EXPECT_TRUE(full.empty());
    return;
  }
  ASSERT_EQ(full.size(), ref->grads().size());
  double largest = 0;
  for (const auto& [name, t] : ref->grads())
    for (float x : t.values()) largest = std::max(largest, static_cast<double>(std::fabs(x)));
  for (const auto& [name, t] : ref->grads())
    EXPECT_LT(relative_error(full.at(name), t, name == "W_k.bias" ? largest : 0.0), kTol) << name << ", " << where;
}

// The head-group counts a run of P ranks can take here: 1, 2 and P.
std::vector<int> group_counts() {
  std::vector<int> gs{1};
  for (int g : {2, 4})
    if (world().size() % g == 0 && g <= world().size()) gs.push_back(g);
  return gs;
}

// Dropout (set_dropout(p, seed)) drops what MultiHeadAttention(..., p, seed)
// drops: each group's ring keys its masks by the module's head numbers.
TEST(GridAttention, DropoutDropsWhatOneProcessDrops) {
  const Communicator& c = world();
  for (int groups : {1, 2}) {
    if (c.size() % groups != 0) continue;
    auto base = reference_module(16, 4, true, 7, 6, 5, 100);
    MultiHeadAttention ref(16, 4, 0.25f, true, /*seed=*/101);
    ref.load_state_dict(base->state_dict());
    ref.train();
    GridAttention grid(c, groups, 16, 4, ref.state_dict());
    grid.set_dropout(0.25f, 101);
    const int64_t B = 2, Q = 7, K = 8;
    const Tensor q = randn({B, Q, 7}, 102), k = randn({B, K, 6}, 103), v = randn({B, K, 5}, 104);
    const Tensor want = ref.forward(q, k, v, ValidLens::per_batch({6, 8}));
    const auto [q0, qn] = grid.query_block(Q);
    const auto [k0, kn] = grid.key_block(K);
    const Tensor got = grid.forward(rows(q, q0, qn), rows(k, k0, kn), rows(v, k0, kn), ValidLens::per_batch({6, 8}));
    EXPECT_LT(relative_error(got, rows(want, q0, qn)), kTol) << "G " << groups << ", rank " << c.rank();
  }
}

TEST(GridAttention, EqualsTheModule) {
  for (int g : group_counts()) {
    check(g, {2, 7, 9, ValidLens::per_batch({4, 0})}, 16, 4, true, 120);
    check(g, {2, 5, 6, ValidLens::per_query(2, 5, {1, 6, 2.5f, 0, 5, 3, 3, 6, 1.5f, 4})}, 8, 4, false, 121);
    check(g, {2, 6, 6, ValidLens(), Causal::TopLeft}, 20, 5, true, 122);  // 5 heads: groups of 3 and 2
    check(g, {1, 3, 3, ValidLens::per_batch({2}), Causal::BottomRight}, 16, 4, true, 123);
    check(g, {2, 9, 9, ValidLens::per_batch({8, 5}), Causal::None, {2, 0}}, 16, 4, true, 124);
    check(g, {1, 7, 10, ValidLens(), Causal::BottomRight, {3, 1}}, 20, 5, false, 125);
  }
}

TEST(GridAttention, SameRanksGiveBitwiseTheSameResults) {
  const Communicator& c = world();
  auto ref = reference_module(16, 4, true, 7, 6, 5, 130);
  const int G = c.size() % 2 == 0 ? 2 : 1;
  std::vector<Tensor> results[2];
  for (auto& result : results) {
    GridAttention grid(c, G, 16, 4, ref->state_dict());
    const auto [q0, qn] = grid.query_block(40);
    const auto [k0, kn] = grid.key_block(33);
    const Tensor out = grid.forward(rows(randn({2, 40, 7}, 131), q0, qn), rows(randn({2, 33, 6}, 132), k0, kn),
                                    rows(randn({2, 33, 5}, 133), k0, kn), ValidLens::per_batch({20, 33}));
    result.push_back(out);
    const auto grads = grid.backward(rows(randn({2, 40, 16}, 134), q0, qn));
    result.insert(result.end(), {grads.queries, grads.keys, grads.values});
  }
  for (size_t i = 0; i < results[0].size(); ++i)
    EXPECT_TRUE(bitwise_equal(results[0][i], results[1][i])) << "result " << i << " rank " << c.rank();
}

TEST(GridAttention, RefusesGroupsThatDoNotSplitTheRanksOrHeads) {
  const Communicator& c = world();
  auto ref = reference_module(8, 2, false, 7, 6, 5, 140);
  try {
    GridAttention grid(c, c.size() + 1, 8, 2, ref->state_dict());
    ADD_FAILURE() << "G = P + 1 was taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[dist.GridAttention] head_groups: " + std::to_string(c.size() + 1) +
                                         " does not divide the " + std::to_string(c.size()) +
                                         " ranks; wanted a divisor G of P (G head groups x P/G sequence blocks)");
  }
  if (c.size() >= 4) {
    try {
      GridAttention grid(c, 4, 8, 2, ref->state_dict());
      ADD_FAILURE() << "4 groups of 2 heads were taken";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "[dist.GridAttention] head_groups: 4 is more than the 2 heads; wanted G <= num_heads");
    }
  }
}

}  // namespace
}  // namespace mha::dist::test
