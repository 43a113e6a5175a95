// AttentionBackward with MaskOptions: the two references agree on the d2l
// chapter's case, and fully masked rows give no NaN and the policy's
// gradients. (The BLAS and fused backwards against the reference on every
// option: test_kernel_cases.cpp.)
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/blas/attention_blas.h"
#include "cpu/reference/attention_backward_masked.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/case_data.h"
#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "mha/error.h"
#include "test_util.h"

using namespace mha;
using mha::test::random_tensor;

namespace {

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float x : t.values()) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

}  // namespace

TEST(BackwardMasks, TheTwoReferencesAgreeOnTheChaptersCase) {
  // The chapter's loops (attention_backward_reference without options) and
  // the reference written with every option must compute the same gradients
  // when no option is set: the second generalises the first.
  for (kernels::Case c : kernels::random_cases(5, 40)) {
    // No mask option, one kv head per query head: the chapter's call.
    c.key_keep = c.key_bias = c.pair_keep = c.pair_bias = false;
    c.causal = Causal::None;
    c.fill = kernels::MaskFill::Seed;
    c.fully_masked = FullyMaskedRows::Uniform;
    c.Hkv = c.H;
    SCOPED_TRACE(c.name());
    const kernels::CaseData data(c);
    const int64_t H = c.H;
    Tensor q1(data.q.shape()), k1(data.k.shape()), v1(data.v.shape());
    Tensor q2(data.q.shape()), k2(data.k.shape()), v2(data.v.shape());
    kernels::AttentionBackward p;
    p.fwd = data.forward();
    p.grad_out = data.grad_out.view().split_heads(H);
    p.grad_q = q1.view().split_heads(H);
    p.grad_k = k1.view().split_heads(H);
    p.grad_v = v1.view().split_heads(H);
    kernels::attention_backward_reference(p);
    kernels::attention_backward_masked_reference(p.fwd, p.grad_out, q2.view().split_heads(H),
                                                 k2.view().split_heads(H), v2.view().split_heads(H));
    // Both in double: only the final rounding differs.
    using kernels::test::normalised_error;
    EXPECT_LE(normalised_error(q1.data(), q2.data(), q1.numel(), 1e-30), 1e-6) << "grad_q";
    EXPECT_LE(normalised_error(k1.data(), k2.data(), k1.numel(), 1e-30), 1e-6) << "grad_k";
    EXPECT_LE(normalised_error(v1.data(), v2.data(), v1.numel(), 1e-30), 1e-6) << "grad_v";
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
            kernels::attention_backward(kernel, p);
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
