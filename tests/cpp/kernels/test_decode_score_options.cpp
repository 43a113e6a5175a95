// The score options in cached calls (kernels/params.h, MaskOptions: softcap,
// ALiBi slopes, attention sinks): the decode kernel against its reference on
// every instruction set, alone and in pairs, with grouped heads, windows,
// key padding, both fills, bfloat16 caches and several split-K chunk
// lengths; the reference against the plain formula written out here; the
// bits at one and two threads; the fused prefill path; the input checks.
//
// Tolerance as test_decode.cpp's, |fast - reference| <= tol (|reference| +
// max|v|), tol = 1e-5 plus the float32 rounding of the scores: the kernel
// rounds a score of magnitude S (ALiBi's biases reach |slope| * K) to
// within S 2^-24 in base 2, which moves each weight by that factor, so tol
// grows by S 2^-21 (Problem::tolerance). The kernel works in float32, base
// 2, with a polynomial tanh; the reference in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/decode/decode.h"
#include "cpu/fused/attention_fused.h"
#include "cpu/reference/reference.h"
#include "decode_problem.h"
#include "harness.h"
#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "mha/error.h"
#include "mha/random.h"
#include "mha/threads.h"
#include "test_util.h"

namespace mha::kernels {
namespace {

using Shape = test::DecodeShape;
using test::supported_isas;

// The options of one call, and the masks they combine with.
struct Options {
  const char* name;
  float softcap = 0.0f;
  bool alibi = false, sinks = false;
  float slope_scale = 0.5f;  // slopes drawn in [-scale, scale] (both signs)
  float sink_at = 0.0f;      // sinks drawn in sink_at + [-1, 1]
  int64_t window_left = -1, window_right = -1;
  bool keep = false;  // a boolean key padding mask
  MaskFill fill = MaskFill::Seed;
};

// The data of one call (decode_problem.h; 3 spare slots past the longest
// length), the options' per-head arrays and a key mask, drawn after it.
struct Problem : test::DecodeData {
  std::vector<float> slopes, sinks;
  std::vector<uint8_t> keep;
  Options o;

  Problem(const Shape& cs, const Options& opt, uint64_t seed) : DecodeData(cs, 3, seed), o(opt) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      slopes.push_back(gen.uniform(-o.slope_scale, o.slope_scale));
      sinks.push_back(o.sink_at + gen.uniform(-1.0f, 1.0f));
    }
    keep.assign(static_cast<size_t>(B * capacity), 1);
    if (o.keep)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < capacity; ++j)  // row 0 keeps only its first key: most queries see none
          keep[static_cast<size_t>(b * capacity + j)] = b == 0 ? j == 0 : gen.uniform(0.0f, 1.0f) < 0.6f;
  }

  // 1e-5 plus 2^-21 times a bound on |score| (the header says why).
  double tolerance() const {
    double S = 2.25 * std::sqrt(static_cast<double>(c.d));  // |q.k| / sqrt(d), |q|, |k| <= 1.5
    if (o.softcap > 0) S = std::min(S, static_cast<double>(o.softcap));
    const double K = static_cast<double>(*std::max_element(c.lengths.begin(), c.lengths.end()));
    double slope = 0;
    for (float x : slopes) slope = std::max(slope, static_cast<double>(std::fabs(x)));
    if (o.alibi) S += slope * K;
    if (o.sinks)
      for (float x : sinks) S = std::max(S, static_cast<double>(std::fabs(x)));
    return 1e-5 + S * std::ldexp(1.0, -21);
  }

  DecodeParams params(std::vector<float>& out, CacheDtype dtype = CacheDtype::F32, int64_t chunk_keys = 0) {
    DecodeParams p = DecodeData::params(out, dtype);
    p.chunk_keys = chunk_keys;
    p.masks.window_left = o.window_left, p.masks.window_right = o.window_right;
    p.masks.softcap = o.softcap;
    p.masks.alibi_slopes = o.alibi ? slopes.data() : nullptr;
    p.masks.sinks = o.sinks ? sinks.data() : nullptr;
    p.masks.fill = o.fill;
    if (o.keep) p.masks.key_keep = keep.data(), p.masks.key_stride_b = capacity;
    return p;
  }

  // The plain formula, written out from the definitions (not from
  // DecodeParams' helpers): query i of row b sits at pos = K - Qn + i; key j
  // takes part iff (not causal or j <= pos), pos - left <= j (left >= 0),
  // j <= pos + right (right >= 0) and the key mask keeps it; the score is
  // s = q.k / sqrt(d), softcap * tanh(s / softcap), minus slope * |pos - j|;
  // a key not taking part scores the fill; softmax with exp(sink) in the
  // denominator. Without sinks a row whose scores are all -inf is
  // uniform (the default policy); with them, 0.
  std::vector<double> plain() const {
    std::vector<double> out(static_cast<size_t>(B * c.Hq * c.Qn * c.dv), 0.0);
    const int64_t G = c.Hq / c.Hkv;
    const double fill = o.fill == MaskFill::Seed ? -1e6 : -INFINITY;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t K = c.lengths[static_cast<size_t>(b)];
      if (K == 0) continue;
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Qn; ++i) {
          const int64_t pos = K - c.Qn + i;
          std::vector<double> s(static_cast<size_t>(K));
          for (int64_t j = 0; j < K; ++j) {
            bool in = (!c.causal || j <= pos) && (o.window_left < 0 || j >= pos - o.window_left) &&
                      (o.window_right < 0 || j <= pos + o.window_right) &&
                      (!o.keep || keep[static_cast<size_t>(b * capacity + j)]);
            double dot = 0;
            for (int64_t x = 0; x < c.d; ++x)
              dot += static_cast<double>(q[static_cast<size_t>((b * c.Qn + i) * c.Hq * c.d + h * c.d + x)]) *
                     k[static_cast<size_t>(((b * c.Hkv + h / G) * capacity + j) * c.d + x)];
            double x = dot / std::sqrt(static_cast<double>(c.d));
            if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
            if (o.alibi) x -= slopes[static_cast<size_t>(h)] * std::fabs(static_cast<double>(pos - j));
            s[static_cast<size_t>(j)] = in ? x : fill;
          }
          double mx = o.sinks ? sinks[static_cast<size_t>(h)] : -INFINITY;
          for (double x : s) mx = std::max(mx, x);
          double* row = out.data() + ((b * c.Hq + h) * c.Qn + i) * c.dv;
          if (mx == -INFINITY) {  // uniform over the K keys
            for (int64_t j = 0; j < K; ++j)
              for (int64_t x = 0; x < c.dv; ++x)
                row[x] += v[static_cast<size_t>(((b * c.Hkv + h / G) * capacity + j) * c.dv + x)] / static_cast<double>(K);
            continue;
          }
          double sum = o.sinks ? std::exp(sinks[static_cast<size_t>(h)] - mx) : 0.0;
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int64_t j = 0; j < K; ++j)
            for (int64_t x = 0; x < c.dv; ++x)
              row[x] += s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(((b * c.Hkv + h / G) * capacity + j) * c.dv + x)];
        }
    }
    return out;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, const std::string& what) {
  test::expect_close(got, want, rtol, 1.0, what);
}

std::vector<Shape> shapes() {
  return {
      {2, 2, 1, 7, 7, {1, 2, 9}},              // one query, d odd
      {4, 4, 4, 33, 33, {4, 5, 0, 31}},       // Qn 4, an empty row
      {6, 2, 4, 17, 9, {100, 301}},           // grouped heads, dv != d, several chunks at 64 keys
      {8, 2, 16, 64, 64, {16, 200}},          // 64 rows in blocks of 8
      {3, 1, 3, 20, 20, {1, 3, 250}, false},  // multi-query, not causal
  };
}

std::vector<Options> option_sets() {
  std::vector<Options> o;
  o.push_back({"softcap 0.5 (small)"});
  o.back().softcap = 0.5f;
  o.push_back({"softcap 30 (large)"});
  o.back().softcap = 30.0f;
  o.push_back({"alibi"});
  o.back().alibi = true;
  o.push_back({"alibi steep"});
  o.back().alibi = true, o.back().slope_scale = 4.0f;
  o.push_back({"sinks"});
  o.back().sinks = true;
  o.push_back({"sinks that dominate"});
  o.back().sinks = true, o.back().sink_at = 12.0f;
  o.push_back({"softcap + alibi"});
  o.back().softcap = 2.0f, o.back().alibi = true;
  o.push_back({"softcap + sinks"});
  o.back().softcap = 1.0f, o.back().sinks = true;
  o.push_back({"alibi + sinks, window (5, 0)"});
  o.back().alibi = true, o.back().sinks = true, o.back().window_left = 5, o.back().window_right = 0;
  o.push_back({"all three, window (3, 2)"});
  o.back().softcap = 5.0f, o.back().alibi = true, o.back().sinks = true, o.back().window_left = 3, o.back().window_right = 2;
  o.push_back({"sinks, window (0, 0), padding, -inf"});
  o.back().sinks = true, o.back().window_left = 0, o.back().window_right = 0, o.back().keep = true, o.back().fill = MaskFill::NegInf;
  o.push_back({"alibi + sinks, padding, -1e6"});
  o.back().alibi = true, o.back().sinks = true, o.back().keep = true;
  o.push_back({"softcap + alibi, padding, -inf (no sinks: the policy)"});
  o.back().softcap = 3.0f, o.back().alibi = true, o.back().keep = true, o.back().fill = MaskFill::NegInf;
  return o;
}

TEST(DecodeScoreOptions, ReferenceIsThePlainFormula) {
  uint64_t seed = 1000;
  for (const Shape& c : shapes())
    for (const Options& o : option_sets()) {
      Problem pb(c, o, seed++);
      std::vector<float> got;
      decode_attention_reference(pb.params(got));
      const std::vector<double> want = pb.plain();
      const std::string what = c.name() + " " + o.name;
      for (size_t x = 0; x < got.size(); ++x)
        ASSERT_NEAR(got[x], want[x], 1e-6 * (std::fabs(want[x]) + 1.0)) << what << " element " << x;
    }
}

TEST(DecodeScoreOptions, EveryIsaMatchesTheReference) {
  uint64_t seed = 2000;
  for (const Shape& c : shapes())
    for (const Options& o : option_sets()) {
      Problem pb(c, o, seed++);
      const std::string what = c.name() + " " + o.name;
      for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16}) {
        std::vector<float> want, got;
        decode_attention_reference(pb.params(want, dtype));
        for (int64_t chunk : {int64_t{0}, int64_t{32}, int64_t{64}})
          for (FusedIsa isa : supported_isas()) {
            decode_attention(pb.params(got, dtype, chunk), isa);
            expect_close(got, want, pb.tolerance(),
                         what + (dtype == CacheDtype::BF16 ? " bf16" : "") + " chunk " + std::to_string(chunk) +
                             " isa " + fused_isa_name(isa));
          }
      }
    }
}

// Each option changes the output (so the tests above compare something),
// and a dominant sink takes nearly all the weight: the output shrinks
// towards 0 by exp(sink - max score) at least.
TEST(DecodeScoreOptions, OptionsTakeEffect) {
  const Shape c{4, 2, 2, 16, 16, {40, 70}};
  std::vector<float> plain_out, out;
  Problem base(c, Options{"none"}, 7);
  decode_attention(base.params(plain_out));
  for (const Options& o : option_sets()) {
    Problem pb(c, o, 7);  // same seed: same q, k, v
    decode_attention(pb.params(out));
    double diff = 0;
    for (size_t x = 0; x < out.size(); ++x) diff = std::max(diff, static_cast<double>(std::fabs(out[x] - plain_out[x])));
    EXPECT_GT(diff, 1e-4) << o.name << " made no difference";
  }
  Options big{"sinks at 40"};
  big.sinks = true, big.sink_at = 40.0f;  // scores here are below 10: weight left e^-29 at most
  Problem pb(c, big, 7);
  decode_attention(pb.params(out));
  for (float x : out) ASSERT_LE(std::fabs(x), 1e-9f);
}

// Under -inf with sinks, a row with no live key gets 0 (the sink takes
// everything), not the fully-masked policy; without sinks, the policy.
TEST(DecodeScoreOptions, SinkRowWithNoLiveKeyIsZero) {
  Options o{"sinks, nothing kept"};
  o.sinks = true, o.keep = true, o.fill = MaskFill::NegInf;
  Problem pb({2, 1, 1, 8, 8, {5}}, o, 9);
  std::fill(pb.keep.begin(), pb.keep.end(), 0);
  for (FusedIsa isa : supported_isas()) {
    std::vector<float> out;
    decode_attention(pb.params(out), isa);
    for (float x : out) EXPECT_EQ(x, 0.0f) << fused_isa_name(isa);
    DecodeParams p = pb.params(out);
    p.masks.sinks = nullptr;  // now the uniform policy: the mean of the values
    decode_attention(p, isa);
    for (int64_t x = 0; x < 8; ++x) {
      double mean = 0;
      for (int64_t j = 0; j < 5; ++j) mean += pb.v[static_cast<size_t>(j * 8 + x)] / 5.0;
      EXPECT_NEAR(out[static_cast<size_t>(x)], mean, 1e-6) << fused_isa_name(isa);
    }
  }
}

TEST(DecodeScoreOptions, BitwiseTheSameAtOneAndTwoThreads) {
  Options o{"all three, window"};
  o.softcap = 4.0f, o.alibi = true, o.sinks = true, o.window_left = 3000, o.window_right = 0;
  Problem pb({8, 2, 4, 64, 64, {5000, 4321}}, o, 300);
  test::expect_bitwise_at_one_and_two_threads(
      [&](std::vector<float>& out, CacheDtype dtype) { return pb.params(out, dtype); });
}

// Whether the fused kernel honours the score options (it does once they
// are built into it): a softcap of 1e-3 squeezes every score to about 0.
bool fused_takes_score_options() {
  Options o{"probe"};
  o.softcap = 1e-3f;
  Problem pb({1, 1, 2, 8, 8, {2}, false}, o, 5);
  std::vector<float> out;
  const DecodeParams p = pb.params(out);
  decode_attention_fused(p);
  std::vector<double> want = pb.plain();
  for (size_t x = 0; x < out.size(); ++x)
    if (std::fabs(out[x] - want[x]) > 1e-4) return false;
  return true;
}

// Long prefills take the fused kernel (decode_attention_fused): the options
// pass through to it, per query head (a bfloat16 call's heads in batches).
TEST(DecodeScoreOptions, FusedPrefillMatchesTheReference) {
  if (!fused_takes_score_options()) GTEST_SKIP() << "the fused kernel does not take the score options in this build";
  const std::vector<Shape> cases = {{4, 4, 70, 16, 16, {70, 0, 71, 300}}, {6, 2, 40, 17, 9, {40, 200}}};
  uint64_t seed = 3000;
  for (const Shape& c : cases)
    for (const Options& o : option_sets()) {
      Problem pb(c, o, seed++);
      for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16}) {
        std::vector<float> want, got;
        decode_attention_reference(pb.params(want, dtype));
        decode_attention_fused(pb.params(got, dtype));
        expect_close(got, want, pb.tolerance(), c.name() + " " + o.name + (dtype == CacheDtype::BF16 ? " bf16" : "") + " fused");
      }
    }
}

TEST(DecodeScoreOptions, BadOptionsSayWhatIsWrong) {
  Problem pb({4, 2, 1, 8, 8, {6, 9}}, Options{"none"}, 500);
  std::vector<float> o;
  std::vector<float> bad = {0.5f, 0.25f, NAN, 1.0f};
  auto run = [&](auto edit) {
    DecodeParams p = pb.params(o);
    edit(p);
    decode_attention(p);
  };
  EXPECT_TRUE(mha::test::throws_with([&] { run([](DecodeParams& p) { p.masks.softcap = -1.0f; }); },
                                "[decode_attention] masks: softcap -1; wanted a finite number >= 0 (0: off)"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](DecodeParams& p) { p.masks.softcap = INFINITY; }); },
                                "masks: softcap inf; wanted a finite number >= 0"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](DecodeParams& p) { p.masks.alibi_slopes = bad.data(); }); },
                                "[decode_attention] masks: alibi_slopes[2]: nan; wanted a finite number per query head"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](DecodeParams& p) { p.masks.sinks = bad.data(); }); },
                                "[decode_attention] masks: sinks[2]: nan; wanted a finite logit per query head"));
}

}  // namespace
}  // namespace mha::kernels
