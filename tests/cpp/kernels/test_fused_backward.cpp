// The fused attention backward's own promises, on every instruction set this
// CPU supports: rows of valid length 0 spread their value gradient over every
// key and give the keys none, and the gradients are bitwise the same at one
// and two threads. (Its gradients against the reference on every case
// family: test_kernel_cases.cpp.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu/blas/attention_blas.h"
#include "cpu/fused/attention_fused.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/case_data.h"
#include "mha/threads.h"

namespace mha::kernels {
namespace {

using test::kBackwardBound;
using test::normalised_error;

struct Grads {
  Tensor q, k, v;  // (B, Q, H*d), (B, K, H*d), (B, K, H*dv)
  explicit Grads(const Case& c) : q({c.B, c.Q, c.H * c.d}), k({c.B, c.K, c.H * c.d}), v({c.B, c.K, c.H * c.dv}) {}
};

// The fused forward (saving statistics) and the backward `kernel` from them
// (fused) or from nothing (reference).
struct FusedCall {
  const CaseData& data;
  Tensor out;
  std::vector<float> stats;
  AttentionForward f;
  explicit FusedCall(const CaseData& d) : data(d), out(d.new_out()), stats(d.new_stats()), f(d.forward()) {
    const int64_t n = d.c.B * d.c.H * d.c.Q;
    f.out = out.view().split_heads(d.c.H);
    f.stats = {stats.data(), stats.data() + n};
    attention_forward_fused(f);
  }
  void backward(Grads& g, bool fused) const {
    AttentionBackward p;
    p.fwd = f;
    p.grad_out = data.grad_out.view().split_heads(data.c.H);
    p.grad_q = g.q.view().split_heads(data.c.H);
    p.grad_k = g.k.view().split_heads(data.c.H);
    p.grad_v = g.v.view().split_heads(data.c.H);
    if (fused) attention_backward_fused(p);
    else attention_backward_reference(p);
  }
};

class FusedBackwardTest : public ::testing::TestWithParam<FusedIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(set_fused_isa(GetParam())); }
  void TearDown() override { set_fused_isa(fused_best_isa()); }
};

TEST_P(FusedBackwardTest, ZeroLengthRowsSpreadValueGradientsOverEveryKey) {
  // Every query of row 0 has valid length 0: uniform weights 1/K over all
  // keys, so grad_v of every key is mean(dO) and grad_k is 0.
  Case c;
  c.family = "zero lengths";
  c.B = 2, c.H = c.Hkv = 2, c.Q = 9, c.K = 70, c.d = 8, c.dv = 8;
  c.length_kind = LengthKind::PerBatch;
  c.lens = {0.0f, 33.0f};
  c.seed = 5;
  const CaseData data(c);
  const FusedCall call(data);
  Grads ref(c), got(c);
  call.backward(ref, false);
  call.backward(got, true);
  EXPECT_LE(normalised_error(got.v.data(), ref.v.data(), ref.v.numel()), kBackwardBound);
  EXPECT_LE(normalised_error(got.q.data(), ref.q.data(), ref.q.numel()), kBackwardBound);
  for (int64_t j = 0; j < c.K; ++j)
    for (int64_t x = 0; x < c.H * c.d; ++x) EXPECT_EQ(got.k.at({0, j, x}), 0.0f);
}

TEST_P(FusedBackwardTest, BitwiseTheSameAtOneAndTwoThreads) {
  Case c;
  c.family = "threads";
  c.B = 2, c.H = c.Hkv = 3, c.Q = 150, c.K = 131, c.d = 64, c.dv = 64;
  c.length_kind = LengthKind::PerQuery;
  c.dropout = 0.2f;
  c.seed = 8;
  const CaseData data(c);
  const FusedCall call(data);
  const int saved = num_threads();
  Grads one(c), two(c);
  set_num_threads(1);
  call.backward(one, true);
  set_num_threads(2);
  call.backward(two, true);
  set_num_threads(saved);
  EXPECT_TRUE(one.q == two.q && one.k == two.k && one.v == two.v);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedBackwardTest, ::testing::ValuesIn(test::supported_isas()),
                         [](const auto& info) { return std::string(fused_isa_name(info.param)); });

}  // namespace
}  // namespace mha::kernels
