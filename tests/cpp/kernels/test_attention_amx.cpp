// tests/cpp/kernels/test_attention_amx.cpp: the fused forward on AMX tiles
// (cpu/fused/attention_amx.h), which kernels::attention_forward runs for a
// fused call in bfloat16 mode, held to the reference kernel on the same
// bfloat16-valued q, k, v: its output within kAmxForwardBound, its softmax
// statistics good for attention_weights within kAmxWeightsBound, over random
// shapes (1..700 queries and keys, head widths 8..256, multiples of 16 or not, every
// length kind and mask, grouped heads); and bitwise the same at 1 and 2
// threads. Skipped where AMX is not usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "cpu/blas/attention_blas.h"
#include "cpu/fused/attention_amx.h"
#include "cpu/fused/isa.h"
#include "cpu/gemm/gemm_amx.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/case_data.h"
#include "kernels/dispatch.h"
#include "mha/random.h"
#include "mha/threads.h"

namespace mha::kernels {
namespace {

using test::normalised_error;

// What the tiles change against the reference (which sums in double): the
// float32 sums of the two products in another order, and the weights carried
// as hi + lo bfloat16 parts (2^-16 relative). Measured worst over the cases
// below 6.8e-6 (printed by the test); rounding the weights once instead
// gave 1.9e-3 (cpu/fused/attention_amx.cpp, kSplitWeights).
constexpr double kAmxForwardBound = 2e-5;
// The weights recomputed in float32 from the statistics, which hold the
// tiles' scores' max and sum: those scores differ from float32 ones by the
// order of d float32 sums. Measured worst 6e-7.
constexpr double kAmxWeightsBound = 1e-5;

class AttentionAmx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::amx_usable() || fused_best_isa() != FusedIsa::Avx512)
      GTEST_SKIP() << "AMX (AMX-TILE, AMX-BF16, OS permission) with AVX-512 not usable here";
  }
};

void round_to_bf16(Tensor& t) {
  for (float& x : t.values()) x = core::round_to_bf16(x);
}

// A random case: shapes around and off the 16/32 tile edges, every mask.
Case random_case(Generator& g, int index) {
  const int64_t widths[] = {16, 32, 64, 80, 128, 8, 40, 256};
  // Axes from the smallest the AMX forward takes (amx_forward_pays).
  const int64_t queries[] = {16, 17, 31, 32, 33, 63, 64, 65, 127, 129};
  const int64_t keys[] = {64, 65, 95, 127, 128, 129, 191, 255, 257, 300};
  Case c;
  c.family = "amx";
  c.B = 1 + static_cast<int64_t>(g.below(2));
  c.Hkv = 1 + static_cast<int64_t>(g.below(2));
  c.H = c.Hkv * (1 + static_cast<int64_t>(g.below(3)));  // grouped heads in 2 of 3
  const bool long_axes = index % 4 == 0;
  c.Q = long_axes ? 16 + static_cast<int64_t>(g.below(685)) : queries[g.below(10)];
  c.K = long_axes ? 64 + static_cast<int64_t>(g.below(637)) : keys[g.below(10)];
  c.d = index < 8 ? widths[index] : widths[g.below(8)];
  c.dv = g.below(4) == 0 ? widths[g.below(8)] : c.d;
  c.length_kind = static_cast<LengthKind>(g.below(3));
  c.causal = static_cast<Causal>(g.below(3));
  c.key_keep = g.below(4) == 0;
  c.key_bias = g.below(6) == 0;
  c.pair_keep = g.below(8) == 0;
  c.pair_bias = g.below(8) == 0;
  c.pair_per_head = g.below(2) == 0;
  c.fill = g.below(4) == 0 ? MaskFill::NegInf : MaskFill::Seed;
  c.fully_masked = g.below(4) == 0 ? FullyMaskedRows::Zeros : FullyMaskedRows::Uniform;
  c.seed = g.next();
  return c;
}

// The case's data with q, k, v rounded to bfloat16, as bfloat16 mode holds them.
CaseData bf16_data(const Case& c) {
  CaseData data(c);
  round_to_bf16(data.q);
  round_to_bf16(data.k);
  round_to_bf16(data.v);
  return data;
}

// The fused kernel through the dispatcher in bfloat16 mode (the AMX
// forward): out and stats.
SoftmaxStats run_amx(const CaseData& data, Tensor& out, std::vector<float>& stats) {
  AttentionForward p = data.forward();
  p.precision = Precision::BFloat16;
  p.out = out.view().split_heads(data.c.H);
  const int64_t n = data.c.B * data.c.H * data.c.Q;
  p.stats = {stats.data(), stats.data() + n};
  EXPECT_TRUE(fused::amx_forward_supports(p) && fused::amx_forward_pays(p));
  return attention_forward(AttentionKernel::Fused, p);
}

TEST_F(AttentionAmx, MatchesTheReferenceOnBf16Inputs) {
  Generator g(4242);
  double worst_out = 0, worst_weights = 0;
  for (int i = 0; i < 120; ++i) {
    const Case c = random_case(g, i);
    SCOPED_TRACE(c.name());
    const CaseData data = bf16_data(c);
    Tensor out = data.new_out(), ref = data.new_out();
    Tensor ref_w = data.new_weights(), got_w = data.new_weights();
    std::vector<float> stats = data.new_stats();
    AttentionForward r = data.forward();
    r.out = ref.view().split_heads(c.H);
    r.weights = ref_w.data();
    attention_forward_reference(r);

    const SoftmaxStats saved = run_amx(data, out, stats);
    ASSERT_FALSE(saved.empty());
    const double e = normalised_error(out.data(), ref.data(), out.numel());
    EXPECT_LE(e, kAmxForwardBound);
    worst_out = std::max(worst_out, e);

    // The statistics, as the float32 fused forward's: the weights from them.
    AttentionWeightsParams wp;
    wp.fwd = data.forward();
    wp.fwd.stats = saved;
    for (int64_t b = 0; b < c.B; ++b) wp.batch_rows.push_back(b);
    for (int64_t h = 0; h < c.H; ++h) wp.heads.push_back(h);
    wp.out = got_w.data();
    attention_weights(wp);
    const double ew = normalised_error(got_w.data(), ref_w.data(), got_w.numel());
    EXPECT_LE(ew, kAmxWeightsBound);
    worst_weights = std::max(worst_weights, ew);
  }
  std::printf("AMX forward vs reference on bf16 inputs: worst out %.3g, weights %.3g\n", worst_out, worst_weights);
}

// The same bits at 1 and 2 threads (chunks fixed by the shapes).
TEST_F(AttentionAmx, SameBitsAtOneAndTwoThreads) {
  Generator g(77);
  for (int i = 0; i < 12; ++i) {
    Case c = random_case(g, i);
    c.B = 2, c.H = 4, c.Hkv = 2, c.Q = 200 + static_cast<int64_t>(g.below(300));
    c.K = 200 + static_cast<int64_t>(g.below(300));
    SCOPED_TRACE(c.name());
    const CaseData data = bf16_data(c);
    auto run = [&](int threads) {
      const int saved = num_threads();
      set_num_threads(threads);
      Tensor out = data.new_out();
      std::vector<float> stats = data.new_stats();
      run_amx(data, out, stats);
      set_num_threads(saved);
      std::vector<float> all(out.values().begin(), out.values().end());
      all.insert(all.end(), stats.begin(), stats.end());
      return all;
    };
    const std::vector<float> one = run(1), two = run(2);
    ASSERT_EQ(one.size(), two.size());
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
  }
}

// Dropout, and float32 calls, keep the float32 fused kernel.
TEST_F(AttentionAmx, OnlyBf16CallsWithoutDropout) {
  Case c;
  c.d = c.dv = 16;
  const CaseData data(c);
  AttentionForward p = data.forward();
  EXPECT_FALSE(fused::amx_forward_supports(p));
  p.precision = Precision::BFloat16;
  EXPECT_TRUE(fused::amx_forward_supports(p));
  p.dropout = {0.1f, 1};
  EXPECT_FALSE(fused::amx_forward_supports(p));
}

// Below 16 queries or 64 keys the tiles would be mostly padding: the
// float32 kernel runs (amx_forward_pays; measured in attention_amx.cpp).
TEST_F(AttentionAmx, SmallCallsKeepTheFloat32Kernel) {
  const int64_t sizes[][3] = {{15, 64, 0}, {16, 63, 0}, {1, 4096, 0}, {16, 64, 1}, {300, 70, 1}};
  for (const auto& [Q, K, pays] : sizes) {
    Case c;
    c.Q = Q, c.K = K, c.d = c.dv = 16;
    const CaseData data(c);
    AttentionForward p = data.forward();
    p.precision = Precision::BFloat16;
    EXPECT_EQ(fused::amx_forward_pays(p), pays == 1) << "Q " << Q << " K " << K;
  }
}

}  // namespace
}  // namespace mha::kernels
