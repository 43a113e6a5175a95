// mha::attention (mha/functional.h) against a float64 reference written
// here from the documented formulas (mha/masks.h, mha/functional.h): random
// shapes with grouped heads, Q != K, every mask (lengths per row and per
// query, key padding and pair masks, boolean and additive, causal both
// ways, windows), softcap, ALiBi, sinks, both fully-masked policies, a given
// scale, and every kernel; within 2e-5 of the output's scale. Bad arguments
// are refused naming them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mha/error.h"
#include "mha/functional.h"

namespace mha {
namespace {

struct Case {
  int64_t B, H, Hkv, Q, K, d, dv;
  AttentionOptions o;
  std::vector<float> lens;  // as given (per batch or per query), for the reference
  bool per_query = false;
};

// out[b,h,i,:] in float64 from the formulas.
std::vector<double> reference(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v) {
  const double inf = std::numeric_limits<double>::infinity();
  const CallMasks& m = c.o.masks;
  const bool masks_any = !m.key_padding_mask.is_none() || !m.attn_mask.is_none() || m.causal != Causal::None ||
                         m.window.any();
  const double fill = masks_any ? -inf : -1e6;
  const double scale = c.o.scale > 0 ? c.o.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> out(static_cast<size_t>(c.B * c.H * c.Q * c.dv), 0.0);
  const int64_t group = c.H / c.Hkv;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.Q; ++i) {
        const int64_t hk = h / group, diag = i + c.K - c.Q;
        std::vector<double> s(static_cast<size_t>(c.K));
        for (int64_t j = 0; j < c.K; ++j) {
          double x = 0;
          for (int64_t e = 0; e < c.d; ++e)
            x += static_cast<double>(q.data()[((b * c.H + h) * c.Q + i) * c.d + e]) *
                 k.data()[((b * c.Hkv + hk) * c.K + j) * c.d + e];
          x *= scale;
          const ScoreOptions& so = m.scores;
          if (so.softcap > 0) x = so.softcap * std::tanh(x / so.softcap);
          if (!so.alibi_slopes.empty()) x -= so.alibi_slopes[static_cast<size_t>(h)] * std::abs(static_cast<double>(diag - j));
          bool masked = false;
          if (const uint8_t* keep = m.key_padding_mask.keep_data()) masked |= keep[b * c.K + j] == 0;
          if (const float* bias = m.key_padding_mask.bias_data()) x += bias[b * c.K + j];
          const int64_t pair = m.attn_mask.dim() == 3 ? ((b * c.H + h) * c.Q + i) * c.K + j : i * c.K + j;
          if (const uint8_t* keep = m.attn_mask.keep_data()) masked |= keep[pair] == 0;
          if (const float* bias = m.attn_mask.bias_data()) x += bias[pair];
          if (m.causal == Causal::TopLeft) masked |= j > i;
          if (m.causal == Causal::BottomRight) masked |= j > diag;
          if (m.window.left >= 0) masked |= j < diag - m.window.left;
          if (m.window.right >= 0) masked |= j > diag + m.window.right;
          if (!c.lens.empty()) masked |= j >= c.lens[static_cast<size_t>(c.per_query ? b * c.Q + i : b)];
          s[static_cast<size_t>(j)] = masked ? fill : x;
        }
        const bool has_sink = !m.scores.sinks.empty();
        const double sink = has_sink ? m.scores.sinks[static_cast<size_t>(h)] : -inf;
        double M = sink;
        for (double x : s) M = std::max(M, x);
        double* o = out.data() + ((b * c.H + h) * c.Q + i) * c.dv;
        std::vector<double> w(s.size(), 0.0);
        if (M == -inf) {  // no live key, no sink: the policy
          if (m.fully_masked_rows == FullyMaskedRows::Uniform) std::fill(w.begin(), w.end(), 1.0 / static_cast<double>(c.K));
        } else {
          double S = has_sink ? std::exp(sink - M) : 0.0;
          for (size_t j = 0; j < s.size(); ++j) S += w[j] = std::exp(s[j] - M);
          for (double& x : w) x /= S;
        }
        for (int64_t j = 0; j < c.K; ++j)
          for (int64_t e = 0; e < c.dv; ++e)
            o[e] += w[static_cast<size_t>(j)] * v.data()[((b * c.Hkv + hk) * c.K + j) * c.dv + e];
      }
  return out;
}

TEST(Functional, AttentionMatchesTheFormulasWithEveryOption) {
  std::mt19937_64 gen(20261207);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  auto random = [&](Shape s) {
    Tensor t(s);
    for (float& x : t.values()) x = normal(gen);
    return t;
  };
  int checked = 0;
  for (int trial = 0; trial < 120; ++trial) {
    Case c;
    c.Hkv = 1 + pick(gen) % 2;
    c.H = c.Hkv * (1 + pick(gen) % 3);
    c.B = 1 + pick(gen) % 2, c.Q = 1 + pick(gen) % 7, c.K = 1 + pick(gen) % 9;
    c.d = 1 + pick(gen) % 9, c.dv = 1 + pick(gen) % 6;
    const Tensor q = random({c.B, c.H, c.Q, c.d}), k = random({c.B, c.Hkv, c.K, c.d}),
                 v = random({c.B, c.Hkv, c.K, c.dv});
    AttentionOptions& o = c.o;
    const int bits = pick(gen);
    if (bits & 1) {  // lengths, per row or per query (0 included)
      c.per_query = bits & 2;
      for (int64_t x = 0; x < (c.per_query ? c.B * c.Q : c.B); ++x) c.lens.push_back(static_cast<float>(pick(gen) % (c.K + 1)));
      o.valid_lens = c.per_query ? ValidLens::per_query(c.B, c.Q, c.lens) : ValidLens::per_batch(c.lens);
    }
    if (bits & 4) {  // key padding: boolean or additive
      if (bits & 8) {
        std::vector<uint8_t> keep;
        for (int64_t x = 0; x < c.B * c.K; ++x) keep.push_back(pick(gen) % 4 != 0);
        o.masks.key_padding_mask = Mask::keep({c.B, c.K}, keep);
      } else {
        o.masks.key_padding_mask = Mask::additive(random({c.B, c.K}));
      }
    }
    if (bits & 16) {  // a pair mask, (Q, K) boolean or (B*H, Q, K) additive
      if (bits & 32) {
        std::vector<uint8_t> keep;
        for (int64_t x = 0; x < c.Q * c.K; ++x) keep.push_back(pick(gen) % 5 != 0);
        o.masks.attn_mask = Mask::keep({c.Q, c.K}, keep);
      } else {
        o.masks.attn_mask = Mask::additive(random({c.B * c.H, c.Q, c.K}));
      }
    }
    o.masks.causal = static_cast<Causal>(pick(gen) % 3);
    if (bits & 64) o.masks.window = {static_cast<int64_t>(pick(gen) % 4) - 1, static_cast<int64_t>(pick(gen) % 4) - 1};
    if (bits & 128) o.masks.scores.softcap = 0.5f + static_cast<float>(pick(gen) % 8);
    for (int64_t h = 0; h < c.H && (bits & 256); ++h) o.masks.scores.alibi_slopes.push_back(0.25f * static_cast<float>(h + 1));
    for (int64_t h = 0; h < c.H && (bits & 512); ++h) o.masks.scores.sinks.push_back(normal(gen));
    o.masks.fully_masked_rows = bits & 1024 ? FullyMaskedRows::Zeros : FullyMaskedRows::Uniform;
    if (bits & 2048) o.scale = 0.3f;
    const std::vector<double> want = reference(c, q, k, v);
    double top = 1.0;
    for (double x : want) top = std::max(top, std::abs(x));
    for (AttentionKernel kernel : {AttentionKernel::Fused, AttentionKernel::Reference, AttentionKernel::Blas}) {
      o.kernel = kernel;
      const Tensor got = attention(q, k, v, o);
      ASSERT_EQ(got.shape(), (Shape{c.B, c.H, c.Q, c.dv}));
      for (size_t e = 0; e < want.size(); ++e)
        ASSERT_NEAR(got.data()[e], want[e], 2e-5 * top)
            << "trial " << trial << " kernel " << static_cast<int>(kernel) << " element " << e << " (B" << c.B << " H"
            << c.H << " Hkv" << c.Hkv << " Q" << c.Q << " K" << c.K << " d" << c.d << " bits " << bits << ")";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 360);
}

std::string error_of(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o = {}) {
  try {
    (void)attention(q, k, v, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Functional, BadArgumentsAreRefusedNamingThem) {
  const Tensor q({1, 4, 3, 8}), k({1, 2, 5, 8}), v({1, 2, 5, 6});
  EXPECT_NE(error_of(Tensor({4, 3, 8}), k, v).find("[mha::attention] q: shape (4, 3, 8) is not (B, H, Q, d)"),
            std::string::npos);
  EXPECT_NE(error_of(q, Tensor({1, 3, 5, 8}), Tensor({1, 3, 5, 6})).find("k: 3 key/value heads do not divide q's 4 heads"),
            std::string::npos);
  EXPECT_NE(error_of(q, Tensor({1, 2, 5, 7}), v).find("k: shape (1, 2, 5, 7) does not match q (1, 4, 3, 8)"),
            std::string::npos);
  EXPECT_NE(error_of(q, Tensor({1, 2, 0, 8}), Tensor({1, 2, 0, 6})).find("has no keys to attend to"), std::string::npos);
  AttentionOptions o;
  o.scale = -1.0f;
  EXPECT_NE(error_of(q, k, v, o).find("options.scale: -1; wanted 0 (1/sqrt(d)) or a finite number > 0"),
            std::string::npos);
  o = {};
  o.masks.scores.alibi_slopes = {1.0f, 2.0f};
  EXPECT_NE(error_of(q, k, v, o).find("alibi_slopes"), std::string::npos);
  o = {};
  o.masks.key_padding_mask = Mask::keep({1, 4}, {1, 1, 1, 1});
  EXPECT_NE(error_of(q, k, v, o).find("key_padding_mask"), std::string::npos);
  o = {};
  o.valid_lens = ValidLens::per_batch({1.0f, 2.0f});
  EXPECT_NE(error_of(q, k, v, o).find("valid_lens"), std::string::npos);
  Tensor big({1, 4, 3, 8}, 1e20f);
  EXPECT_NE(error_of(big, Tensor({1, 2, 5, 8}, 1e20f), v).find("overflow float32"), std::string::npos);
}

}  // namespace
}  // namespace mha
