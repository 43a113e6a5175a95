// The fused attention kernel with every mask option,
// against the reference kernel: outputs, weights (from the saved statistics,
// any subset) and, when the fused backward lists the options, gradients; on
// shapes that straddle the tiles (Q, K not multiples of them, K over two key
// tiles, d not a multiple of 16, dv != d), every option alone and in random
// combinations, every instruction set this CPU supports, and bitwise equal
// at one and two threads.
//
// Tolerances: the forward as test_fused_attention.cpp (1e-5 relative + 1e-6
// absolute per element); gradients as test_fused_backward.cpp (max error at
// most 1e-5 of the largest reference gradient element of q, k and v).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_backward.h"
#include "kernels/attention_backward_masked.h"
#include "cpu/attention_kernels.h"
#include "cpu/fused/attention_fused.h"
#include "kernels/attention_params.h"
#include "mha/random.h"
#include "mha/tensor.h"

namespace mha::kernels {
namespace {

constexpr float kRtol = 1e-5f, kAtol = 1e-6f;

void expect_close(const float* got, const float* want, int64_t n, const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const float tol = kAtol + kRtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << want[i]
                    << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

bool all_finite(const Tensor& t) {
  for (float x : t.values())
    if (!std::isfinite(x)) return false;
  return true;
}

// Options a case may draw: the MaskOptions fields and grouped heads, then
// the rest.
enum Option : uint32_t {
  kKeyKeep = 1u << 0,
  kKeyBias = 1u << 1,
  kPairKeep = 1u << 2,
  kPairBias = 1u << 3,
  kCausal = 1u << 4,
  kNegInfFill = 1u << 5,
  kZerosForMasked = 1u << 6,
  kGroupedHeads = 1u << 7,
  kLensPerBatch = 1u << 8,
  kLensPerQuery = 1u << 9,
  kDropout = 1u << 10,
  kPairPerHead = 1u << 11,  // pair masks (B*h, Q, K) instead of (Q, K)
};

// One problem: inputs laid out as the modules lay them out ((B, L, h*d)
// buffers seen as (B, h, L, d) views) and the masks `options` asks for, drawn
// so that every kind of row turns up: padding masks (kept keys first), holes,
// rows with every key masked or every score -inf. (Huge finite biases such
// as -1e4 are left to test_mask_kernels.cpp's exact cases: added to a score,
// they round it to a grid of 1e-3, so a one-ulp difference in the dot
// product moves a weight by 1e-3 in every kernel, the reference included.)
struct MaskProblem {
  int64_t B, H, Hkv, Q, K, d, dv;
  uint32_t options;
  Tensor q, k, v;
  std::vector<uint8_t> key_keep, pair_keep;
  std::vector<float> key_bias, pair_bias, lens;
  AttentionForward p;  // without out and weights

  MaskProblem(Generator& gen, uint32_t opts) : options(opts) {
    const int64_t lengths[] = {1, 3, 17, 47, 49, 64, 65, 97, 130, 161};
    const int64_t widths[] = {3, 8, 17, 20, 33, 64};
    B = 1 + static_cast<int64_t>(gen.below(2));
    Hkv = 1 + static_cast<int64_t>(gen.below(2));
    H = Hkv;
    if (options & kGroupedHeads) {
      Hkv = gen.below(2) ? 1 : 2;
      H = Hkv * (2 + static_cast<int64_t>(gen.below(2)));
    }
    Q = lengths[gen.below(std::size(lengths))];
    K = lengths[gen.below(std::size(lengths))];
    if (gen.below(3) == 0) K = 100 + static_cast<int64_t>(gen.below(120));  // over two key tiles
    d = widths[gen.below(std::size(widths))];
    dv = gen.below(3) == 0 ? widths[gen.below(std::size(widths))] : d;
    q = Tensor({B, Q, H * d});
    k = Tensor({B, K, Hkv * d});
    v = Tensor({B, K, Hkv * dv});
    for (Tensor* t : {&q, &k, &v})
      for (float& x : t->values()) x = gen.uniform(-1.5f, 1.5f);
    p.q = q.view().split_heads(H);
    p.k = k.view().split_heads(Hkv);
    p.v = v.view().split_heads(Hkv);
    p.scale_divisor = std::sqrt(static_cast<float>(d));
    MaskOptions& m = p.masks;
    auto coin = [&](double prob) { return gen.uniform() < prob; };
    // A row kind per mask row: 0 random, 1 padding (a kept prefix), 2 none kept.
    if (options & kKeyKeep) {
      for (int64_t b = 0; b < B; ++b) {
        const uint64_t kind = gen.below(5);
        const int64_t prefix = static_cast<int64_t>(gen.below(static_cast<uint64_t>(K) + 1));
        for (int64_t j = 0; j < K; ++j)
          key_keep.push_back(kind == 4 ? 0 : kind >= 2 ? j < prefix : coin(0.6));
      }
      m.key_keep = key_keep.data();
    }
    auto bias_value = [&](uint64_t kind) -> float {
      if (kind == 3) return -INFINITY;  // the whole row -inf
      return coin(0.2) ? -INFINITY : gen.uniform(-3, 3);
    };
    if (options & kKeyBias) {
      for (int64_t b = 0; b < B; ++b) {
        const uint64_t kind = gen.below(5);
        for (int64_t j = 0; j < K; ++j) key_bias.push_back(bias_value(kind));
      }
      m.key_bias = key_bias.data();
    }
    const bool per_head = options & kPairPerHead;
    const int64_t pair_rows = per_head ? B * H * Q : Q;
    if (per_head) {
      m.pair_stride_h = Q * K;
      m.pair_stride_b = H * Q * K;
    }
    if (options & kPairKeep) {
      for (int64_t r = 0; r < pair_rows; ++r) {
        const bool none = gen.below(8) == 0;
        for (int64_t j = 0; j < K; ++j) pair_keep.push_back(!none && coin(0.8));
      }
      m.pair_keep = pair_keep.data();
    }
    if (options & kPairBias) {
      for (int64_t r = 0; r < pair_rows; ++r) {
        const uint64_t kind = gen.below(8);
        for (int64_t j = 0; j < K; ++j) pair_bias.push_back(bias_value(kind < 4 ? 0 : kind - 2));
      }
      m.pair_bias = pair_bias.data();
    }
    if (options & kCausal) m.causal = gen.below(2) ? Causal::TopLeft : Causal::BottomRight;
    if (options & kNegInfFill) m.fill = MaskFill::NegInf;
    if (options & kZerosForMasked) m.fully_masked = FullyMaskedRows::Zeros;
    if (options & (kLensPerBatch | kLensPerQuery)) {
      const int64_t n = options & kLensPerBatch ? B : B * Q;
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t kind = gen.below(5);
        float len = gen.uniform(0.0f, static_cast<float>(K));
        if (kind == 0) len = 0.0f;
        if (kind == 1) len = static_cast<float>(K) + 2.5f;
        if (kind == 2) len = std::floor(len);
        lens.push_back(len);
      }
      p.length_kind = options & kLensPerBatch ? LengthKind::PerBatch : LengthKind::PerQuery;
      p.lens = lens.data();
    }
    if (options & kDropout) p.dropout = {0.3f, gen.next()};
  }

  std::string name() const {
    std::ostringstream s;  // not a chain of std::string +: GCC 12 warns (-Wrestrict) on those
    s << "B" << B << " H" << H << " Hkv" << Hkv << " Q" << Q << " K" << K << " d" << d << " dv" << dv
      << " options 0x" << std::hex << options;
    return s.str();
  }

  Tensor new_out() const { return Tensor({B, Q, H * dv}); }
  AttentionForward with(Tensor& out, float* weights) const {
    AttentionForward r = p;
    r.out = out.view().split_heads(H);
    r.weights = weights;
    return r;
  }
};

// Every option alone (with each kind of length), then random combinations.
std::vector<uint32_t> option_sets() {
  std::vector<uint32_t> sets;
  const uint32_t single[] = {0u, kKeyKeep, kKeyBias, kPairKeep, uint32_t{kPairKeep} | kPairPerHead,
                             kPairBias, uint32_t{kPairBias} | kPairPerHead, kCausal, kNegInfFill,
                             kZerosForMasked, kGroupedHeads, kDropout};
  const uint32_t lens[] = {0u, kLensPerBatch, kLensPerQuery};
  for (uint32_t l : lens)
    for (uint32_t s : single) sets.push_back(s | l);
  Generator g(2024);
  for (int i = 0; i < 60; ++i) {
    uint32_t s = static_cast<uint32_t>(g.below(1u << 8));
    const uint64_t l = g.below(3);
    if (l == 1) s |= kLensPerBatch;
    if (l == 2) s |= kLensPerQuery;
    if (g.below(3) == 0) s |= kDropout;
    if (g.below(2)) s |= kPairPerHead;
    sets.push_back(s);
  }
  return sets;
}

std::vector<FusedIsa> supported_isas() {
  std::vector<FusedIsa> isas;
  for (FusedIsa isa : {FusedIsa::Scalar, FusedIsa::Avx2, FusedIsa::Avx512})
    if (static_cast<int>(isa) <= static_cast<int>(fused_best_isa())) isas.push_back(isa);
  return isas;
}

class FusedMasks : public ::testing::TestWithParam<FusedIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(set_fused_isa(GetParam())); }
  void TearDown() override { set_fused_isa(fused_best_isa()); }
};

TEST_P(FusedMasks, ForwardAndWeightsMatchTheReference) {
  Generator gen(77);
  int fully_masked_rows = 0;
  for (uint32_t options : option_sets()) {
    MaskProblem pr(gen, options);
    SCOPED_TRACE(pr.name());
    Tensor out_ref = pr.new_out(), out = pr.new_out();
    Tensor w_ref({pr.B, pr.H, pr.Q, pr.K}), w({pr.B, pr.H, pr.Q, pr.K}, NAN);
    attention_forward_reference(pr.with(out_ref, w_ref.data()));
    const int64_t n = pr.B * pr.H * pr.Q;
    std::vector<float> stats(static_cast<size_t>(2 * n));
    { AttentionForward f = pr.with(out, w.data()); f.stats = {stats.data(), stats.data() + n}; attention_forward_fused(f); }
    ASSERT_TRUE(all_finite(out_ref) && all_finite(w_ref));
    // Fully masked rows get the policy, never NaN.
    ASSERT_TRUE(all_finite(out)) << "NaN or inf in the output";
    ASSERT_TRUE(all_finite(w)) << "NaN or inf in the weights";
    expect_close(out.data(), out_ref.data(), out.numel(), "output");
    expect_close(w.data(), w_ref.data(), w.numel(), "weights");
    for (int64_t r = 0; r < n; ++r) fully_masked_rows += stats[static_cast<size_t>(r)] == -INFINITY;

    // The weights of a subset of rows and heads, from the statistics.
    AttentionWeightsParams wp;
    wp.fwd = pr.p;
    wp.fwd.stats = {stats.data(), stats.data() + n};
    wp.batch_rows = {pr.B - 1};
    wp.heads = {pr.H - 1, 0};
    Tensor sub({1, 2, pr.Q, pr.K});
    wp.out = sub.data();
    attention_weights_fused(wp);
    for (int64_t j = 0; j < 2; ++j)
      expect_close(sub.data() + j * pr.Q * pr.K,
                   w_ref.data() + ((pr.B - 1) * pr.H + wp.heads[static_cast<size_t>(j)]) * pr.Q * pr.K,
                   pr.Q * pr.K, "weights of a subset, head " + std::to_string(wp.heads[static_cast<size_t>(j)]));
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(fully_masked_rows, 100);  // the draw exercises the policy
}

TEST_P(FusedMasks, BitwiseTheSameAtOneAndTwoThreads) {
  Generator gen(5);
  const int saved = omp_get_max_threads();
  for (int trial = 0; trial < 12; ++trial) {
    const uint32_t options = static_cast<uint32_t>(gen.below(1u << 8)) | kPairPerHead |
                             (trial % 2 ? kLensPerQuery : kDropout);
    MaskProblem pr(gen, options);
    SCOPED_TRACE(pr.name());
    const int64_t n = pr.B * pr.H * pr.Q;
    std::vector<float> s1(static_cast<size_t>(2 * n)), s2(static_cast<size_t>(2 * n));
    Tensor o1 = pr.new_out(), o2 = pr.new_out();
    Tensor w1({pr.B, pr.H, pr.Q, pr.K}), w2({pr.B, pr.H, pr.Q, pr.K});
    omp_set_num_threads(1);
    { AttentionForward f = pr.with(o1, w1.data()); f.stats = {s1.data(), s1.data() + n}; attention_forward_fused(f); }
    omp_set_num_threads(2);
    { AttentionForward f = pr.with(o2, w2.data()); f.stats = {s2.data(), s2.data() + n}; attention_forward_fused(f); }
    EXPECT_TRUE(o1 == o2) << "outputs differ between 1 and 2 threads";
    EXPECT_TRUE(w1 == w2) << "weights differ between 1 and 2 threads";
    EXPECT_EQ(s1, s2) << "statistics differ between 1 and 2 threads";
  }
  omp_set_num_threads(saved);
}

// Keys past every query's key limit (padding, causal) are not read: NaN
// there must not reach the output, whatever the masks.
TEST_P(FusedMasks, KeysPastEveryLimitAreNotRead) {
  Generator gen(8);
  for (Causal causal : {Causal::TopLeft, Causal::BottomRight}) {
    MaskProblem pr(gen, kKeyKeep | kCausal);
    pr.p.masks.causal = causal;
    // Padding masks: row b keeps its first 1 + b*7 keys (K >= 1).
    const int64_t kept0 = 1;
    for (int64_t b = 0; b < pr.B; ++b)
      for (int64_t j = 0; j < pr.K; ++j) pr.key_keep[static_cast<size_t>(b * pr.K + j)] = j < kept0 + b * 7;
    Tensor out_ref = pr.new_out(), out = pr.new_out();
    attention_forward_reference(pr.with(out_ref, nullptr));
    for (int64_t b = 0; b < pr.B; ++b)
      for (int64_t j = kept0 + b * 7; j < pr.K; ++j) {
        for (int64_t x = 0; x < pr.Hkv * pr.d; ++x) pr.k.at({b, j, x}) = NAN;
      }
    attention_forward_fused(pr.with(out, nullptr));
    expect_close(out.data(), out_ref.data(), out.numel(), "output");
  }
}

// Gradients of q, k, v by the fused backward (from the fused forward's
// statistics) and by the masked reference backward.
struct Gradients {
  Tensor q, k, v;
  explicit Gradients(const MaskProblem& pr)
      : q({pr.B, pr.Q, pr.H * pr.d}), k({pr.B, pr.K, pr.Hkv * pr.d}), v({pr.B, pr.K, pr.Hkv * pr.dv}) {
    for (Tensor* t : {&q, &k, &v}) t->values().assign(static_cast<size_t>(t->numel()), NAN);
  }
  bool finite() const { return all_finite(q) && all_finite(k) && all_finite(v); }
};

Gradients fused_gradients(const MaskProblem& pr, const Tensor& grad_out) {
  Tensor out = pr.new_out();
  const int64_t n = pr.B * pr.H * pr.Q;
  std::vector<float> stats(static_cast<size_t>(2 * n));
  { AttentionForward f = pr.with(out, nullptr); f.stats = {stats.data(), stats.data() + n}; attention_forward_fused(f); }
  Gradients g(pr);
  AttentionBackward bp;
  bp.fwd = pr.p;
  bp.fwd.out = out.view().split_heads(pr.H);
  bp.fwd.stats = {stats.data(), stats.data() + n};
  bp.grad_out = grad_out.view().split_heads(pr.H);
  bp.grad_q = g.q.view().split_heads(pr.H);
  bp.grad_k = g.k.view().split_heads(pr.Hkv);
  bp.grad_v = g.v.view().split_heads(pr.Hkv);
  attention_backward_fused(bp);
  return g;
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float x : t.values()) m = std::fmax(m, std::fabs(static_cast<double>(x)));
  return m;
}
double max_error(const Tensor& got, const Tensor& want) {
  double err = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i)
    err = std::fmax(err, std::fabs(static_cast<double>(got.data()[i]) - want.data()[i]));
  return err;
}

TEST_P(FusedMasks, BackwardMatchesTheReference) {
  Generator gen(78);
  for (uint32_t options : option_sets()) {
    MaskProblem pr(gen, options);
    SCOPED_TRACE(pr.name());
    Tensor grad_out = pr.new_out();
    for (float& x : grad_out.values()) x = gen.uniform(-1.0f, 1.0f);
    const Gradients got = fused_gradients(pr, grad_out);
    Gradients want(pr);
    Tensor unused = pr.new_out();
    attention_backward_masked_reference(pr.with(unused, nullptr), grad_out.view().split_heads(pr.H),
                                        want.q.view().split_heads(pr.H), want.k.view().split_heads(pr.Hkv),
                                        want.v.view().split_heads(pr.Hkv));
    ASSERT_TRUE(want.finite());
    // Fully masked rows pass no NaN to any gradient.
    ASSERT_TRUE(got.finite()) << "NaN or inf in a gradient";
    const double g = std::fmax(std::fmax(max_abs(want.q), max_abs(want.k)), max_abs(want.v));
    const double tol = 1e-5 * g + 1e-7;
    EXPECT_LE(max_error(got.q, want.q), tol) << "grad_q";
    EXPECT_LE(max_error(got.k, want.k), tol) << "grad_k";
    EXPECT_LE(max_error(got.v, want.v), tol) << "grad_v";
    if (::testing::Test::HasFailure()) return;
  }
}

// Rows with every key masked (batch row 0, by key_keep) or every score -inf
// (query 0 of batch row 1, by a -inf pair bias): both policies, both fills,
// with and without dropout, the gradients are finite and those rows pass
// exactly nothing to their queries (their weights are constants).
TEST_P(FusedMasks, FullyMaskedRowsGiveNoQueryGradientAndNoNaN) {
  Generator gen(9);
  for (auto policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros})
    for (auto fill : {MaskFill::Seed, MaskFill::NegInf})
      for (bool drop : {false, true}) {
        MaskProblem pr(gen, kKeyKeep | kPairBias | kPairPerHead | (drop ? kDropout : 0u));
        const int64_t B = pr.B, H = pr.H, Q = pr.Q, K = pr.K;
        std::fill(pr.key_keep.begin(), pr.key_keep.end(), 1);
        std::fill(pr.key_keep.begin(), pr.key_keep.begin() + K, 0);
        std::fill(pr.pair_bias.begin(), pr.pair_bias.end(), 0.5f);
        if (B > 1)
          for (int64_t h = 0; h < H; ++h)
            std::fill_n(pr.pair_bias.begin() + ((1 * H + h) * Q + 0) * K, K, -INFINITY);
        pr.p.masks.fill = fill;
        pr.p.masks.fully_masked = policy;
        SCOPED_TRACE(pr.name() + (policy == FullyMaskedRows::Zeros ? " zeros" : " uniform") +
                     (fill == MaskFill::Seed ? " seed fill" : " -inf fill"));
        Tensor grad_out = pr.new_out();
        for (float& x : grad_out.values()) x = gen.uniform(-1.0f, 1.0f);
        const Gradients g = fused_gradients(pr, grad_out);
        ASSERT_TRUE(g.finite());
        for (int64_t x = 0; x < Q * H * pr.d; ++x) ASSERT_EQ(g.q.data()[x], 0.0f) << "batch row 0";
        if (B > 1) {
          for (int64_t x = 0; x < H * pr.d; ++x) ASSERT_EQ(g.q.data()[Q * H * pr.d + x], 0.0f) << "row 1, query 0";
        }
      }
}

TEST_P(FusedMasks, BackwardBitwiseTheSameAtOneAndTwoThreads) {
  Generator gen(6);
  const int saved = omp_get_max_threads();
  for (int trial = 0; trial < 12; ++trial) {
    const uint32_t options = static_cast<uint32_t>(gen.below(1u << 8)) | kGroupedHeads |
                             (trial % 2 ? kLensPerQuery : kDropout);
    MaskProblem pr(gen, options);
    SCOPED_TRACE(pr.name());
    Tensor grad_out = pr.new_out();
    for (float& x : grad_out.values()) x = gen.uniform(-1.0f, 1.0f);
    omp_set_num_threads(1);
    const Gradients g1 = fused_gradients(pr, grad_out);
    omp_set_num_threads(2);
    const Gradients g2 = fused_gradients(pr, grad_out);
    EXPECT_TRUE(g1.q == g2.q && g1.k == g2.k && g1.v == g2.v) << "gradients differ between 1 and 2 threads";
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedMasks, ::testing::ValuesIn(supported_isas()),
                         [](const auto& info) { return std::string(fused_isa_name(info.param)); });

}  // namespace
}  // namespace mha::kernels
