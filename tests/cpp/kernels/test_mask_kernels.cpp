// The kernel options beyond the d2l chapter (masks, causal, fill, fully
// masked rows, grouped heads): small cases worked out by hand, run on every
// kernel. (Every kernel against the reference on random combinations of all
// of them: test_kernel_cases.cpp.)
#include <cmath>
#include <optional>

#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "mha/error.h"
#include "test_util.h"

using namespace mha;

namespace {

const AttentionKernel kKernels[] = {AttentionKernel::Reference, AttentionKernel::Blas,
                                   AttentionKernel::Fused};

// One head, d = 1, q = 1, keys k_j = j, values v_j = 10^j: the scaled score of
// key j is j, and the output is sum_j w_j 10^j, so weights and output can be
// written down from the masks alone.
struct Tiny {
  int64_t Q, K;
  Tensor q, k, v, out, w;
  kernels::AttentionForward p;
  Tiny(int64_t Q_, int64_t K_, float q_value = 1.0f) : Q(Q_), K(K_) {
    q = Tensor({1, Q, 1}, q_value);
    k = Tensor({1, K, 1});
    v = Tensor({1, K, 1});
    for (int64_t j = 0; j < K; ++j) {
      k.at({0, j, 0}) = static_cast<float>(j);
      v.at({0, j, 0}) = std::pow(10.0f, static_cast<float>(j));
    }
    out = Tensor({1, Q, 1}, NAN);
    w = Tensor({1, 1, Q, K}, NAN);
    p.q = q.view().split_heads(1);
    p.k = k.view().split_heads(1);
    p.v = v.view().split_heads(1);
    p.out = out.view().split_heads(1);
    p.weights = w.data();
    p.masks.fill = kernels::MaskFill::NegInf;
  }
  void run(AttentionKernel kernel) { (void)kernels::attention_forward(kernel, p); }
  // Checks query row i's weights against `expected` (unnormalised; all zero
  // means "a row of zeros") and its output against the weighted values.
  void expect_row(int64_t i, std::vector<double> expected, const char* what) {
    double sum = 0;
    for (double e : expected) sum += e;
    double o = 0;
    for (int64_t j = 0; j < K; ++j) {
      const double want = sum > 0 ? expected[j] / sum : 0.0;
      EXPECT_NEAR(w.at({0, 0, i, j}), want, 1e-6) << what << ": row " << i << " key " << j;
      o += want * std::pow(10.0, static_cast<double>(j));
    }
    EXPECT_NEAR(out.at({0, i, 0}), o, 1e-5 * (1 + std::fabs(o))) << what << ": row " << i;
  }
};

const double e = std::exp(1.0);

}  // namespace

TEST(MaskKernels, KeyKeepAndKeyBias) {
  for (AttentionKernel kernel : kKernels) {
    Tiny t(1, 3);
    const uint8_t keep[] = {1, 0, 1};
    t.p.masks.key_keep = keep;
    t.run(kernel);
    t.expect_row(0, {1, 0, e * e}, "key_keep");

    Tiny a(1, 3);
    const float bias[] = {0.0f, -INFINITY, std::log(2.0f)};
    a.p.masks.key_bias = bias;
    a.run(kernel);
    a.expect_row(0, {1, 0, 2 * e * e}, "key_bias");
  }
}

TEST(MaskKernels, PairMasksBroadcastAndPerHead) {
  for (AttentionKernel kernel : kKernels) {
    // A (Q, K) keep mask shared by all (b, h): row 0 keeps keys 1, 2; row 1 key 0.
    Tiny t(2, 3);
    const uint8_t keep[] = {0, 1, 1, 1, 0, 0};
    t.p.masks.pair_keep = keep;
    t.run(kernel);
    t.expect_row(0, {0, e, e * e}, "pair_keep row 0");
    t.expect_row(1, {1, 0, 0}, "pair_keep row 1");

    // Two heads with per-head additive masks (pair_stride_h = Q*K): head 1
    // gets -1 on key 2, head 0 nothing. Heads share q, k, v (width 2 = 2 x 1).
    Tensor q({1, 1, 2}, 1.0f), k({1, 2, 2}), v({1, 2, 2}), out({1, 1, 2}), w({1, 2, 1, 2});
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t c = 0; c < 2; ++c) {
        k.at({0, j, c}) = static_cast<float>(j);
        v.at({0, j, c}) = static_cast<float>(j);
      }
    const float bias[] = {0.0f, 0.0f, 0.0f, -1.0f};
    kernels::AttentionForward p;
    p.q = q.view().split_heads(2);
    p.k = k.view().split_heads(2);
    p.v = v.view().split_heads(2);
    p.out = out.view().split_heads(2);
    p.weights = w.data();
    p.masks.pair_bias = bias;
    p.masks.pair_stride_h = 2;
    p.masks.pair_stride_b = 4;
    (void)kernels::attention_forward(kernel, p);
    EXPECT_NEAR(w.at({0, 0, 0, 1}), e / (1 + e), 1e-6);    // head 0: scores 0, 1
    EXPECT_NEAR(w.at({0, 1, 0, 1}), 0.5, 1e-6);            // head 1: scores 0, 1 - 1
    EXPECT_NEAR(out.at({0, 0, 1}), 0.5, 1e-6);
  }
}

TEST(MaskKernels, CausalAlignments) {
  for (AttentionKernel kernel : kKernels) {
    Tiny tl(2, 3);
    tl.p.masks.causal = Causal::TopLeft;  // query i sees keys j <= i
    tl.run(kernel);
    tl.expect_row(0, {1, 0, 0}, "top-left");
    tl.expect_row(1, {1, e, 0}, "top-left");

    Tiny br(2, 3);
    br.p.masks.causal = Causal::BottomRight;  // query i sees keys j <= i + 1
    br.run(kernel);
    br.expect_row(0, {1, e, 0}, "bottom-right");
    br.expect_row(1, {1, e, e * e}, "bottom-right");

    // More queries than keys: bottom-right leaves query 0 no key at all.
    Tiny tall(3, 2);
    tall.p.masks.causal = Causal::BottomRight;
    tall.p.masks.fully_masked = FullyMaskedRows::Zeros;
    tall.run(kernel);
    tall.expect_row(0, {0, 0}, "bottom-right, Q > K");
    tall.expect_row(1, {1, 0}, "bottom-right, Q > K");
    tall.expect_row(2, {1, e}, "bottom-right, Q > K");
  }
}

TEST(MaskKernels, FullyMaskedRowsFollowThePolicyAndNeverGiveNaN) {
  for (AttentionKernel kernel : kKernels) {
    for (FullyMaskedRows policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros}) {
      const std::vector<double> want = policy == FullyMaskedRows::Uniform
                                           ? std::vector<double>{1, 1, 1}
                                           : std::vector<double>{0, 0, 0};
      for (kernels::MaskFill fill : {kernels::MaskFill::Seed, kernels::MaskFill::NegInf}) {
        // Masked by a boolean mask ...
        Tiny t(1, 3);
        const uint8_t none[] = {0, 0, 0};
        t.p.masks.key_keep = none;
        t.p.masks.fill = fill;
        t.p.masks.fully_masked = policy;
        t.run(kernel);
        t.expect_row(0, want, "every key masked");
        // ... or by -inf on every key, which PyTorch turns into NaN.
        Tiny a(1, 3);
        const float minus_inf[] = {-INFINITY, -INFINITY, -INFINITY};
        a.p.masks.key_bias = minus_inf;
        a.p.masks.fill = fill;
        a.p.masks.fully_masked = policy;
        a.run(kernel);
        a.expect_row(0, want, "every score -inf");
        // ... or by a zero valid length (the seed's own case).
        Tiny l(1, 3);
        const float zero = 0.0f;
        l.p.length_kind = kernels::LengthKind::PerBatch;
        l.p.lens = &zero;
        l.p.masks.fill = fill;
        l.p.masks.fully_masked = policy;
        l.run(kernel);
        l.expect_row(0, want, "valid length 0");
      }
    }
  }
}

TEST(MaskKernels, SeedFillAndNegInfFillDifferWhereTheSeedSaysSo) {
  // Live keys 0, 1 carry an additive -2e6 and key 2 is masked. The seed's
  // fill replaces the masked score by -1e6, which then dominates; -inf drops
  // it and the softmax runs over the two live keys (scores -2e6, -2e6 + 1).
  for (AttentionKernel kernel : kKernels) {
    const float bias[] = {-2e6f, -2e6f, 0.0f};
    const uint8_t keep[] = {1, 1, 0};
    Tiny seed(1, 3);
    seed.p.masks.key_bias = bias;
    seed.p.masks.key_keep = keep;
    seed.p.masks.fill = kernels::MaskFill::Seed;
    seed.run(kernel);
    seed.expect_row(0, {0, 0, 1}, "seed fill");
    Tiny neg(1, 3);
    neg.p.masks.key_bias = bias;
    neg.p.masks.key_keep = keep;
    neg.run(kernel);
    neg.expect_row(0, {1, e, 0}, "-inf fill");
  }
}

TEST(MaskKernels, LengthsAndMasksCombine) {
  for (AttentionKernel kernel : kKernels) {
    // Row 0: length 3 keeps keys 0-2, the key mask drops key 1, bottom-right
    // causal keeps j <= 2. Row 1: length 1.5 keeps keys 0, 1; key 1 dropped.
    Tiny t(2, 4);
    const float lens[] = {3.0f, 1.5f};
    const uint8_t keep[] = {1, 0, 1, 1};
    t.p.length_kind = kernels::LengthKind::PerQuery;
    t.p.lens = lens;
    t.p.masks.key_keep = keep;
    t.p.masks.causal = Causal::BottomRight;
    t.run(kernel);
    t.expect_row(0, {1, 0, e * e, 0}, "lengths + keep + causal");
    t.expect_row(1, {1, 0, 0, 0}, "lengths + keep + causal");
  }
}

TEST(MaskKernels, GroupedHeadsReadTheirKvHead) {
  // Four query heads over two kv heads (d = 1): head h reads kv head h / 2.
  // kv head 0 has keys (0, 1) and values (1, 2); kv head 1 keys (1, 0) and
  // values (3, 5). Every query is 1, so head h's weights are the softmax of
  // its kv head's keys.
  for (AttentionKernel kernel : kKernels) {
    Tensor q({1, 1, 4}, 1.0f), k({1, 2, 2}, std::vector<float>{0, 1, 1, 0}),
        v({1, 2, 2}, std::vector<float>{1, 3, 2, 5}), out({1, 1, 4}), w({1, 4, 1, 2});
    kernels::AttentionForward p;
    p.q = q.view().split_heads(4);
    p.k = k.view().split_heads(2);
    p.v = v.view().split_heads(2);
    p.out = out.view().split_heads(4);
    p.weights = w.data();
    (void)kernels::attention_forward(kernel, p);
    const double a = 1 / (1 + e), b = e / (1 + e);  // softmax(0, 1)
    for (int64_t h = 0; h < 4; ++h) {
      const bool first = h < 2;
      EXPECT_NEAR(w.at({0, h, 0, 0}), first ? a : b, 1e-6) << "head " << h;
      EXPECT_NEAR(out.at({0, 0, h}), first ? a * 1 + b * 2 : b * 3 + a * 5, 1e-6) << "head " << h;
    }
  }
}
