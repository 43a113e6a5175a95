// The fused attention kernel's own promises with mask options, on every
// instruction set this CPU supports: forward and backward bitwise the same at
// one and two threads whatever the options, keys past every query's limit
// never read, and fully masked rows passing no gradient to their queries and
// no NaN anywhere. (Its results against the reference with every option:
// test_kernel_cases.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/blas/attention_blas.h"
#include "cpu/fused/attention_fused.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/case_data.h"

namespace mha::kernels {
namespace {

using test::kForwardBound;
using test::normalised_error;

bool all_finite(const Tensor& t) {
  return std::all_of(t.values().begin(), t.values().end(), [](float x) { return std::isfinite(x); });
}

// The fused forward on `data`, keeping its statistics.
struct Forward {
  Tensor out, w;
  std::vector<float> stats;
  AttentionForward f;
  Forward(const CaseData& d, bool weights) : out(d.new_out()), w(d.new_weights()), stats(d.new_stats()), f(d.forward()) {
    const int64_t n = d.c.B * d.c.H * d.c.Q;
    f.out = out.view().split_heads(d.c.H);
    f.weights = weights ? w.data() : nullptr;
    f.stats = {stats.data(), stats.data() + n};
    attention_forward_fused(f);
  }
};

// Gradients by the fused backward from the fused forward's statistics, NaN
// until written.
struct Gradients {
  Tensor q, k, v;  // (B, Q, H*d), (B, K, Hkv*d), (B, K, Hkv*dv)
  explicit Gradients(const CaseData& d) {
    const Case& c = d.c;
    q = Tensor({c.B, c.Q, c.H * c.d}, NAN);
    k = Tensor({c.B, c.K, c.Hkv * c.d}, NAN);
    v = Tensor({c.B, c.K, c.Hkv * c.dv}, NAN);
    const Forward fwd(d, false);
    AttentionBackward p;
    p.fwd = fwd.f;
    p.grad_out = d.grad_out.view().split_heads(c.H);
    p.grad_q = q.view().split_heads(c.H);
    p.grad_k = k.view().split_heads(c.Hkv);
    p.grad_v = v.view().split_heads(c.Hkv);
    attention_backward_fused(p);
  }
  bool finite() const { return all_finite(q) && all_finite(k) && all_finite(v); }
};

// Random cases with grouped heads forced on or not, every other option drawn.
std::vector<Case> thread_cases(uint64_t seed, bool grouped) {
  std::vector<Case> cases = random_cases(seed, 12);
  for (Case& c : cases)
    if (grouped && c.Hkv == c.H) c.H *= 2;
  return cases;
}

class FusedMasks : public ::testing::TestWithParam<FusedIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(set_fused_isa(GetParam())); }
  void TearDown() override { set_fused_isa(fused_best_isa()); }
};

TEST_P(FusedMasks, BitwiseTheSameAtOneAndTwoThreads) {
  const int saved = omp_get_max_threads();
  for (const Case& c : thread_cases(5, false)) {
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    omp_set_num_threads(1);
    const Forward one(data, true);
    omp_set_num_threads(2);
    const Forward two(data, true);
    EXPECT_TRUE(one.out == two.out) << "outputs differ between 1 and 2 threads";
    EXPECT_TRUE(one.w == two.w) << "weights differ between 1 and 2 threads";
    EXPECT_EQ(one.stats, two.stats) << "statistics differ between 1 and 2 threads";
  }
  omp_set_num_threads(saved);
}

// Keys past every query's key limit (padding, causal) are not read: NaN
// there must not reach the output, whatever the masks.
TEST_P(FusedMasks, KeysPastEveryLimitAreNotRead) {
  for (Causal causal : {Causal::TopLeft, Causal::BottomRight}) {
    Case c;
    c.family = "past the limits";
    c.B = 2, c.H = c.Hkv = 2, c.Q = 49, c.K = 130, c.d = 17, c.dv = 17;
    c.key_keep = true;
    c.causal = causal;
    c.seed = 8;
    // Padding masks: row b keeps its first 1 + b*7 keys.
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < c.K; ++j) c.key_keep_values.push_back(j < 1 + b * 7);
    SCOPED_TRACE(c.name());
    CaseData data(c);
    Tensor ref = data.new_out();
    AttentionForward r = data.forward();
    r.out = ref.view().split_heads(c.H);
    attention_forward_reference(r);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 1 + b * 7; j < c.K; ++j)
        for (int64_t x = 0; x < c.Hkv * c.d; ++x) data.k.at({b, j, x}) = NAN;
    const Forward fused(data, false);
    EXPECT_LE(normalised_error(fused.out.data(), ref.data(), ref.numel()), kForwardBound);
  }
}

// Rows with every key masked (batch row 0, by key_keep) or every score -inf
// (query 0 of batch row 1, by a -inf pair bias): both policies, both fills,
// with and without dropout, the gradients are finite and those rows pass
// exactly nothing to their queries (their weights are constants).
TEST_P(FusedMasks, FullyMaskedRowsGiveNoQueryGradientAndNoNaN) {
  for (auto policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros})
    for (auto fill : {MaskFill::Seed, MaskFill::NegInf})
      for (float dropout : {0.0f, 0.3f}) {
        Case c;
        c.family = "fully masked rows";
        c.B = 2, c.H = c.Hkv = 2, c.Q = 17, c.K = 65, c.d = 8, c.dv = 20;
        c.key_keep = c.pair_bias = c.pair_per_head = true;
        c.fill = fill;
        c.fully_masked = policy;
        c.dropout = dropout;
        c.seed = 9;
        SCOPED_TRACE(c.name());
        CaseData data(c);
        const int64_t H = c.H, Q = c.Q, K = c.K;
        std::fill(data.key_keep.begin(), data.key_keep.end(), 1);
        std::fill(data.key_keep.begin(), data.key_keep.begin() + K, 0);
        std::fill(data.pair_bias.begin(), data.pair_bias.end(), 0.5f);
        for (int64_t h = 0; h < H; ++h)
          std::fill_n(data.pair_bias.begin() + ((1 * H + h) * Q + 0) * K, K, -INFINITY);
        const Gradients g(data);
        ASSERT_TRUE(g.finite());
        for (int64_t x = 0; x < Q * H * c.d; ++x) ASSERT_EQ(g.q.data()[x], 0.0f) << "batch row 0";
        for (int64_t x = 0; x < H * c.d; ++x) ASSERT_EQ(g.q.data()[Q * H * c.d + x], 0.0f) << "row 1, query 0";
      }
}

TEST_P(FusedMasks, BackwardBitwiseTheSameAtOneAndTwoThreads) {
  const int saved = omp_get_max_threads();
  for (const Case& c : thread_cases(6, true)) {
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    omp_set_num_threads(1);
    const Gradients g1(data);
    omp_set_num_threads(2);
    const Gradients g2(data);
    EXPECT_TRUE(g1.q == g2.q && g1.k == g2.k && g1.v == g2.v) << "gradients differ between 1 and 2 threads";
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedMasks, ::testing::ValuesIn(test::supported_isas()),
                         [](const auto& info) { return std::string(fused_isa_name(info.param)); });

}  // namespace
}  // namespace mha::kernels
