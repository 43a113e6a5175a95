// tests/cpp/kernels/test_softmax_merge.cpp: the fused kernel run block by
// block over the keys and merged (kernels/softmax_merge.h) equals one call
// over every key: the output, the statistics, and the backward run per block
// from the merged statistics (AttentionBackward::stats_span_more_keys),
// summed, equals the whole backward. Random shapes, grouped heads, blocks of
// one key, per-query lengths over global positions (a block's lengths are
// the global ones minus its first key), every instruction set.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/fused/isa.h"
#include "kernels/dispatch.h"
#include "kernels/softmax_merge.h"
#include "mha/random.h"

namespace mha::kernels {
namespace {

// rows [B * L, H * d] seen as (B, H, L, d).
TensorView heads(const float* data, int64_t B, int64_t H, int64_t L, int64_t d) {
  TensorView v;
  v.data = const_cast<float*>(data);
  v.rank = 4;
  v.shape[0] = B, v.stride[0] = L * H * d;
  v.shape[1] = H, v.stride[1] = d;
  v.shape[2] = L, v.stride[2] = H * d;
  v.shape[3] = d, v.stride[3] = 1;
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  double scale = 1e-30, err = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    scale = std::max(scale, static_cast<double>(std::fabs(want[e])));
    err = std::max(err, static_cast<double>(std::fabs(got[e] - want[e])));
  }
  EXPECT_LE(err, 2e-5 * scale) << what;
}

class SoftmaxMergeTest : public ::testing::TestWithParam<FusedIsa> {};

TEST_P(SoftmaxMergeTest, BlocksMergedEqualOneCallForwardAndBackward) {
  const FusedIsa saved = fused_isa();
  if (!set_fused_isa(GetParam())) GTEST_SKIP() << "CPU lacks the instruction set";
  Generator g(11);
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t B = 1 + g.below(2), Hkv = 1 + g.below(2), H = Hkv * (1 + g.below(2)), Q = 1 + g.below(9),
                  K = 2 + g.below(20), d = 1 + g.below(9), E = H * d, Ekv = Hkv * d;
    std::vector<float> q(B * Q * E), k(B * K * Ekv), v(B * K * Ekv), dO(B * Q * E);
    for (auto* t : {&q, &k, &v, &dO})
      for (float& x : *t) x = g.uniform(-2.0f, 2.0f);
    // Per-query lengths that leave every row a live key (a row with none is
    // the caller's: the policy over every key).
    const bool lengths = g.below(2) == 0;
    std::vector<float> lens(B * Q);
    for (float& x : lens) x = 1.0f + static_cast<float>(g.below(static_cast<uint32_t>(K))) + (g.below(2) ? 0.5f : 0.0f);
    auto params = [&](int64_t k0, int64_t n, std::vector<float>& local) {
      AttentionForward p;
      p.q = heads(q.data(), B, H, Q, d);
      p.k = heads(k.data() + k0 * Ekv, B, Hkv, n, d);
      p.v = heads(v.data() + k0 * Ekv, B, Hkv, n, d);
      p.v.stride[0] = p.k.stride[0] = K * Ekv;
      p.scale_divisor = std::sqrt(static_cast<float>(d));
      if (lengths) {
        local.resize(lens.size());
        for (size_t x = 0; x < lens.size(); ++x) local[x] = lens[x] - static_cast<float>(k0);
        p.length_kind = LengthKind::PerQuery;
        p.lens = local.data();
      }
      return p;
    };
    // One call over every key.
    std::vector<float> out(q.size()), st(2 * B * H * Q), gq(q.size()), gk(k.size()), gv(v.size()), l0;
    AttentionForward whole = params(0, K, l0);
    whole.out = heads(out.data(), B, H, Q, d);
    whole.stats = {st.data(), st.data() + B * H * Q};
    ASSERT_FALSE(attention_forward(AttentionKernel::Fused, whole).empty());
    AttentionBackward wb;
    wb.fwd = whole;
    wb.grad_out = heads(dO.data(), B, H, Q, d);
    wb.grad_q = heads(gq.data(), B, H, Q, d);
    wb.grad_k = heads(gk.data(), B, Hkv, K, d);
    wb.grad_v = heads(gv.data(), B, Hkv, K, d);
    wb.grad_k.stride[0] = wb.grad_v.stride[0] = K * Ekv;
    attention_backward(AttentionKernel::Fused, wb);

    // The same keys in blocks (one key wide at times), merged in order.
    std::vector<int64_t> starts = {0};
    while (starts.back() < K) starts.push_back(std::min<int64_t>(K, starts.back() + 1 + g.below(6)));
    const int64_t rows = B * H * Q;
    std::vector<float> acc(out.size(), 0.0f), M(rows, -INFINITY), S(rows, 0.0f), bo(out.size()), bs(2 * rows), lb;
    for (size_t x = 0; x + 1 < starts.size(); ++x) {
      AttentionForward f = params(starts[x], starts[x + 1] - starts[x], lb);
      f.out = heads(bo.data(), B, H, Q, d);
      f.stats = {bs.data(), bs.data() + rows};
      ASSERT_FALSE(attention_forward(AttentionKernel::Fused, f).empty());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < Q; ++i) {
            const int64_t r = (b * H + h) * Q + i, at = (b * Q + i) * E + h * d;
            merge_block({acc.data() + at, M[r], S[r]}, bo.data() + at, bs[r], bs[rows + r], d);
          }
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Q; ++i) {
          const int64_t r = (b * H + h) * Q + i;
          ASSERT_TRUE(finish_row({acc.data() + (b * Q + i) * E + h * d, M[r], S[r]}, d));
        }
    expect_close(acc, out, "output");
    for (int64_t r = 0; r < rows; ++r) {
      // The same softmax: weights 2^(t - M) / S equal 2^(t - m) / s.
      EXPECT_NEAR(M[r], st[r], 1e-4f * std::max(1.0f, std::fabs(st[r])));
      EXPECT_NEAR(S[r] * std::exp2(M[r] - st[r]), st[rows + r], 1e-4f * st[rows + r]);
    }
    std::vector<float> tq(q.size(), 0.0f), tk(k.size()), tv(v.size()), bq(q.size());
    for (size_t x = 0; x + 1 < starts.size(); ++x) {
      const int64_t k0 = starts[x], n = starts[x + 1] - k0;
      AttentionBackward b;
      b.fwd = params(k0, n, lb);
      b.fwd.out = heads(acc.data(), B, H, Q, d);
      b.fwd.stats = {M.data(), S.data()};
      b.stats_span_more_keys = true;
      b.grad_out = wb.grad_out;
      b.grad_q = heads(bq.data(), B, H, Q, d);
      b.grad_k = heads(tk.data() + k0 * Ekv, B, Hkv, n, d);
      b.grad_v = heads(tv.data() + k0 * Ekv, B, Hkv, n, d);
      b.grad_k.stride[0] = b.grad_v.stride[0] = K * Ekv;
      std::fill(bq.begin(), bq.end(), 0.0f);
      attention_backward(AttentionKernel::Fused, b);
      for (size_t e = 0; e < tq.size(); ++e) tq[e] += bq[e];
    }
    SCOPED_TRACE(testing::Message() << "B" << B << " H" << H << " Hkv" << Hkv << " Q" << Q << " K" << K << " d" << d
                                    << " blocks " << starts.size() - 1 << (lengths ? " lengths" : ""));
    expect_close(tq, gq, "grad_q");
    expect_close(tk, gk, "grad_k");
    expect_close(tv, gv, "grad_v");
  }
  set_fused_isa(saved);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, SoftmaxMergeTest,
                         ::testing::Values(FusedIsa::Scalar, FusedIsa::Avx2, FusedIsa::Avx512),
                         [](const auto& info) { return std::string(fused_isa_name(info.param)); });

}  // namespace
}  // namespace mha::kernels

namespace mha::kernels {
namespace {

// Split-K's form: blocks given as unnormalised sums (merge_partial) merge to
// the softmax over all keys written out in double, whatever the order of
// the blocks' maxima; a block with no live key (m = -inf) adds nothing, and
// a row with none anywhere is reported to the caller (finish_row false).
TEST(SoftmaxMerge, PartialSumsEqualTheWholeSoftmax) {
  Generator gen(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t width = 1 + trial % 9, blocks = 1 + trial % 5;
    std::vector<std::vector<double>> scores(static_cast<size_t>(blocks));
    std::vector<std::vector<std::vector<double>>> values(static_cast<size_t>(blocks));
    std::vector<float> acc(static_cast<size_t>(width), 0.0f);
    float M = -INFINITY, S = 0.0f;
    const SoftmaxMergeRow row{acc.data(), M, S};
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n = (trial + b) % 4;  // 0: a block without keys
      std::vector<float> part(static_cast<size_t>(width), 0.0f);
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        scores[b].push_back(20.0 * gen.uniform(-1.0f, 1.0f) + 10.0 * b);
        m = std::max(m, static_cast<float>(scores[b].back()));
        values[b].emplace_back();
        for (int64_t x = 0; x < width; ++x) values[b].back().push_back(gen.uniform(-1.0f, 1.0f));
      }
      float s = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float w = std::exp2(static_cast<float>(scores[b][j]) - m);
        s += w;
        for (int64_t x = 0; x < width; ++x) part[x] += w * static_cast<float>(values[b][j][x]);
      }
      merge_partial(row, part.data(), m, s, width);
    }
    double mx = -INFINITY, sum = 0;
    for (const auto& sc : scores)
      for (double t : sc) mx = std::max(mx, t);
    std::vector<double> want(static_cast<size_t>(width), 0.0);
    for (int64_t b = 0; b < blocks; ++b)
      for (size_t j = 0; j < scores[b].size(); ++j) {
        const double w = std::exp2(scores[b][j] - mx);
        sum += w;
        for (int64_t x = 0; x < width; ++x) want[x] += w * values[b][j][x];
      }
    const bool live = finish_row(row, width);
    ASSERT_EQ(live, sum > 0) << "trial " << trial;
    if (!live) continue;
    for (int64_t x = 0; x < width; ++x) EXPECT_NEAR(acc[x], want[x] / sum, 1e-5) << "trial " << trial;
    EXPECT_NEAR(S * std::exp2(static_cast<double>(M) - mx), sum, 1e-5 * sum);
  }
}

}  // namespace
}  // namespace mha::kernels
