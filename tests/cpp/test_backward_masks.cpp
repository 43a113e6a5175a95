// AttentionBackward with MaskOptions and grouped heads: the BLAS backward
// against the reference on random combinations of every option (saved
// weights or recomputed, dropout or not), the two references against each
// other on the seed's case, fully masked rows (no NaN, the policy's
// gradients).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_backward.h"
#include "kernels/attention_backward_masked.h"
#include "kernels/dispatch.h"
#include "cpu/attention_kernels.h"
#include "kernels/masked_row.h"
#include "mha/error.h"
#include "test_util.h"

using namespace mha;
using mha::test::random_tensor;

namespace {

// An attention problem with its buffers: q (B, Q, H*d), k (B, K, Hkv*d),
// v (B, K, Hkv*dv), grad_out (B, Q, H*dv), seen as heads; masks drawn at
// random over every option.
struct Problem {
  int64_t B, H, Hkv, Q, K, d, dv;
  Tensor q, k, v, grad_out;
  std::vector<uint8_t> key_keep, pair_keep;
  std::vector<float> key_bias, pair_bias, lens;
  kernels::AttentionBackward p;

  Problem(Generator& gen, int trial) {
    const int64_t sizes[] = {1, 2, 3, 7, 16, 33};
    const int64_t dims[] = {1, 3, 8, 17};
    B = 1 + static_cast<int64_t>(gen.below(3));
    Hkv = 1 + static_cast<int64_t>(gen.below(3));
    H = Hkv * (1 + static_cast<int64_t>(gen.below(3)));
    Q = sizes[gen.below(6)];
    K = sizes[gen.below(6)];
    d = dims[gen.below(4)];
    dv = gen.below(2) ? d : dims[gen.below(4)];
    q = random_tensor({B, Q, H * d}, gen, -2.0f, 2.0f);
    k = random_tensor({B, K, Hkv * d}, gen, -2.0f, 2.0f);
    v = random_tensor({B, K, Hkv * dv}, gen);
    grad_out = random_tensor({B, Q, H * dv}, gen);
    p.fwd.scale_divisor = std::sqrt(static_cast<float>(d));
    auto coin = [&](double prob) { return gen.uniform() < prob; };
    kernels::MaskOptions& m = p.fwd.masks;
    if (coin(0.5)) {
      for (int64_t x = 0; x < B * K; ++x) key_keep.push_back(coin(0.75));
      m.key_keep = key_keep.data();
    }
    if (coin(0.4)) {
      for (int64_t x = 0; x < B * K; ++x) key_bias.push_back(coin(0.2) ? -INFINITY : gen.uniform(-2, 2));
      m.key_bias = key_bias.data();
    }
    if (coin(0.5)) {
      const bool per_head = coin(0.5);  // (B*h, Q, K) or a broadcast (Q, K)
      m.pair_stride_h = per_head ? Q * K : 0;
      m.pair_stride_b = per_head ? H * Q * K : 0;
      const int64_t n = per_head ? B * H * Q * K : Q * K;
      for (int64_t x = 0; x < n; ++x) {
        pair_keep.push_back(coin(0.8));
        pair_bias.push_back(coin(0.1) ? -INFINITY : gen.uniform(-1, 1));
      }
      if (coin(0.7)) m.pair_keep = pair_keep.data();
      if (coin(0.5)) m.pair_bias = pair_bias.data();
    }
    if (coin(0.3)) {
      const bool per_query = coin(0.5);
      for (int64_t x = 0; x < (per_query ? B * Q : B); ++x)
        lens.push_back(static_cast<float>(gen.below(K + 1)) + (coin(0.2) ? 0.5f : 0.0f));
      p.fwd.length_kind = per_query ? kernels::LengthKind::PerQuery : kernels::LengthKind::PerBatch;
      p.fwd.lens = lens.data();
    }
    m.causal = static_cast<Causal>(gen.below(3));
    m.fill = coin(0.5) ? kernels::MaskFill::Seed : kernels::MaskFill::NegInf;
    m.fully_masked = coin(0.5) ? FullyMaskedRows::Uniform : FullyMaskedRows::Zeros;
    if (trial % 3 == 0) p.fwd.dropout = {0.3f, gen.next()};
    p.fwd.q = q.view().split_heads(H);
    p.fwd.k = k.view().split_heads(Hkv);
    p.fwd.v = v.view().split_heads(Hkv);
    p.grad_out = grad_out.view().split_heads(H);
  }

  // The forward's parameter struct for the same call.
  kernels::AttentionForward forward(float* weights, Tensor& out) const {
    kernels::AttentionForward f = p.fwd;
    f.out = out.view().split_heads(H);
    f.weights = weights;
    return f;
  }

  struct Grads {
    Tensor q, k, v;
  };
  // Runs `kernel`'s backward, outputs pre-filled with NaN (they must be overwritten).
  Grads run(AttentionKernel kernel, const float* weights) {
    Grads g{Tensor(q.shape(), NAN), Tensor(k.shape(), NAN), Tensor(v.shape(), NAN)};
    kernels::AttentionBackward b = p;
    b.fwd.weights = const_cast<float*>(weights);
    b.grad_q = g.q.view().split_heads(H);
    b.grad_k = g.k.view().split_heads(Hkv);
    b.grad_v = g.v.view().split_heads(Hkv);
    if (kernel == AttentionKernel::Reference) kernels::attention_backward_reference(b);
    else kernels::attention_backward_blas(b);
    return g;
  }

  // Whether some (b, h, i) row has no live key.
  bool has_fully_masked_row() const {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Q; ++i)
          if (kernels::fully_masked_row(p.fwd.masks, p.length(b, i), b, h, i, Q, K)) return true;
    return false;
  }
};

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float x : t.values()) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// |got - want| <= 1e-5 |want| + 1e-5 max|want|, elementwise, finite: float32
// against double, as the Python parity tests bound gradients. The measured
// worst is 6e-6 of max|want| (printed by the first test), in a grad_q much
// smaller than the terms it sums: dP - rowsum(dP * P) cancels, and the
// float32 rounding of its terms stays.
::testing::AssertionResult close_scaled(const Tensor& got, const Tensor& want, double& worst) {
  const double scale = max_abs(want);
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.data()[i], b = want.data()[i];
    if (!std::isfinite(a)) return ::testing::AssertionFailure() << "element " << i << " is " << a;
    const double err = std::fabs(a - b);
    if (err > 1e-5 * std::fabs(b) + 1e-5 * scale)
      return ::testing::AssertionFailure() << "element " << i << ": " << a << " vs " << b
                                           << " (scale " << scale << ")";
    if (scale > 0) worst = std::max(worst, err / scale);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(BackwardMasks, BlasMatchesReferenceOnEveryOptionAndGroupedHeads) {
  Generator gen(2024);
  int grouped = 0, empty = 0, dropout = 0, saved = 0;
  double worst = 0.0;
  for (int trial = 0; trial < 300; ++trial) {
    Problem pr(gen, trial);
    const auto ref = pr.run(AttentionKernel::Reference, nullptr);
    // Half the trials hand the BLAS backward the forward's saved weights.
    Tensor weights({pr.B, pr.H, pr.Q, pr.K}), out({pr.B, pr.Q, pr.H * pr.dv});
    const bool use_saved = trial % 2 == 1;
    if (use_saved) kernels::attention_forward_blas(pr.forward(weights.data(), out));
    const auto blas = pr.run(AttentionKernel::Blas, use_saved ? weights.data() : nullptr);
    const std::string where = "trial " + std::to_string(trial);
    EXPECT_TRUE(close_scaled(blas.q, ref.q, worst)) << "grad_q " << where;
    EXPECT_TRUE(close_scaled(blas.k, ref.k, worst)) << "grad_k " << where;
    EXPECT_TRUE(close_scaled(blas.v, ref.v, worst)) << "grad_v " << where;
    grouped += pr.Hkv < pr.H;
    empty += pr.has_fully_masked_row();
    dropout += pr.p.fwd.dropout.active();
    saved += use_saved;
  }
  std::printf("worst |blas - reference| / max|reference|: %.2e\n", worst);
  EXPECT_GT(grouped, 100);
  EXPECT_GT(empty, 60);
  EXPECT_GT(dropout, 80);
  EXPECT_GT(saved, 100);
}

TEST(BackwardMasks, TheTwoReferencesAgreeOnTheSeedsCase) {
  // The seed's loops (attention_backward_reference without options) and the
  // reference written with every option must compute the same gradients
  // when no option is set: the second generalises the first.
  Generator gen(5);
  for (int trial = 0; trial < 40; ++trial) {
    Problem pr(gen, trial);
    pr.p.fwd.masks = kernels::MaskOptions{};
    const int64_t H = pr.H;
    // One kv head per query head: the seed has no grouping.
    pr.k = random_tensor({pr.B, pr.K, H * pr.d}, gen, -2.0f, 2.0f);
    pr.v = random_tensor({pr.B, pr.K, H * pr.dv}, gen);
    pr.Hkv = H;
    pr.p.fwd.k = pr.k.view().split_heads(H);
    pr.p.fwd.v = pr.v.view().split_heads(H);
    const auto seed = pr.run(AttentionKernel::Reference, nullptr);
    Tensor gq(pr.q.shape()), gk(pr.k.shape()), gv(pr.v.shape()), out({pr.B, pr.Q, H * pr.dv});
    kernels::attention_backward_masked_reference(pr.forward(nullptr, out), pr.p.grad_out,
                                                 gq.view().split_heads(H), gk.view().split_heads(H),
                                                 gv.view().split_heads(H));
    double worst = 0.0;
    EXPECT_TRUE(close_scaled(seed.q, gq, worst)) << trial;
    EXPECT_TRUE(close_scaled(seed.k, gk, worst)) << trial;
    EXPECT_TRUE(close_scaled(seed.v, gv, worst)) << trial;
    EXPECT_LT(worst, 1e-6) << trial;  // both in double: only the final rounding differs
  }
}

TEST(BackwardMasks, FullyMaskedRowsGiveNoNaNAndFollowThePolicy) {
  // Batch row 0: every key masked out by key_keep. Batch row 1: query 0's
  // keys all take part but carry -inf, so that row is fully masked too,
  // which a backward reading saved weights must see without the scores.
  const int64_t B = 2, H = 2, Q = 3, K = 5, d = 4;
  Generator gen(9);
  const Tensor q = random_tensor({B, Q, H * d}, gen), k = random_tensor({B, K, H * d}, gen),
               v = random_tensor({B, K, H * d}, gen), dO = random_tensor({B, Q, H * d}, gen);
  std::vector<uint8_t> key_keep(B * K, 1);
  std::fill(key_keep.begin(), key_keep.begin() + K, 0);
  std::vector<float> pair_bias(B * H * Q * K, 0.5f);
  for (int64_t h = 0; h < H; ++h)
    std::fill_n(pair_bias.begin() + ((1 * H + h) * Q + 0) * K, K, -INFINITY);
  for (auto policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros})
    for (auto fill : {kernels::MaskFill::Seed, kernels::MaskFill::NegInf})
      for (float p_drop : {0.0f, 0.4f})
        for (auto kernel : {AttentionKernel::Reference, AttentionKernel::Blas})
          for (bool use_saved : {false, true}) {
            kernels::AttentionBackward p;
            p.fwd.q = q.view().split_heads(H);
            p.fwd.k = k.view().split_heads(H);
            p.fwd.v = v.view().split_heads(H);
            p.grad_out = dO.view().split_heads(H);
            p.fwd.scale_divisor = 2.0f;
            p.fwd.dropout = {p_drop, 77};
            p.fwd.masks.key_keep = key_keep.data();
            p.fwd.masks.pair_bias = pair_bias.data();
            p.fwd.masks.pair_stride_h = Q * K;
            p.fwd.masks.pair_stride_b = H * Q * K;
            p.fwd.masks.fill = fill;
            p.fwd.masks.fully_masked = policy;
            Tensor weights({B, H, Q, K}), out({B, Q, H * d});
            if (use_saved) {
              kernels::AttentionForward f = p.fwd;
              f.out = out.view().split_heads(H);
              f.weights = weights.data();
              kernels::attention_forward_blas(f);
              p.fwd.weights = weights.data();
            }
            Tensor gq(q.shape(), NAN), gk(k.shape(), NAN), gv(v.shape(), NAN);
            p.grad_q = gq.view().split_heads(H);
            p.grad_k = gk.view().split_heads(H);
            p.grad_v = gv.view().split_heads(H);
            if (kernel == AttentionKernel::Reference) kernels::attention_backward_reference(p);
            else kernels::attention_backward_blas(p);
            const std::string where = std::string(policy == FullyMaskedRows::Zeros ? "zeros" : "uniform") +
                                      (fill == kernels::MaskFill::Seed ? " seed fill" : " -inf fill") +
                                      " dropout " + std::to_string(p_drop) +
                                      (kernel == AttentionKernel::Blas ? " blas" : " reference") +
                                      (use_saved ? " saved" : "");
            for (const Tensor* t : {&gq, &gk, &gv})
              for (float x : t->values()) ASSERT_TRUE(std::isfinite(x)) << where;
            // No fully masked row gives q or k a gradient: batch row 0 entirely,
            // and query 0 of batch row 1.
            for (int64_t x = 0; x < Q * H * d; ++x) EXPECT_EQ(gq.data()[x], 0.0f) << where;
            for (int64_t x = 0; x < H * d; ++x) EXPECT_EQ(gq.data()[Q * H * d + x], 0.0f) << where;
            for (int64_t x = 0; x < K * H * d; ++x) EXPECT_EQ(gk.data()[x], 0.0f) << where;
            // Batch row 0's values: nothing under zeros, sum_i M/K dO under uniform.
            for (int64_t j = 0; j < K; ++j)
              for (int64_t h = 0; h < H; ++h)
                for (int64_t c = 0; c < d; ++c) {
                  double want = 0.0;
                  if (policy == FullyMaskedRows::Uniform)
                    for (int64_t i = 0; i < Q; ++i)
                      want += p.fwd.dropout.multiplier(static_cast<uint64_t>(((0 * H + h) * Q + i) * K + j)) /
                              K * dO.at({0, i, h * d + c});
                  EXPECT_NEAR(gv.at({0, j, h * d + c}), want, 1e-6) << where;
                }
            // Batch row 1's other rows are live: some gradient reaches its keys.
            EXPECT_GT(max_abs(gk), 0.0) << where;
          }
}
