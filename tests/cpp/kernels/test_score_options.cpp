// The score options (MaskOptions::softcap, alibi_slopes, sinks; gpt-oss's
// and FlashAttention's conventions, kernels/params.h):
// - the reference forward against a plain double formula written here, and
//   the reference backward's grad_q and grad_sinks against central finite
//   differences of that formula (with dropout, lengths, windows, causal,
//   grouped heads), so that the yardstick is not judged by itself;
// - every kernel (BLAS, fused on each instruction set this CPU supports)
//   against the reference on random cases with the options combined with
//   each other and with every mask (harness.h: forward, weights, weights
//   from statistics, every gradient and grad_sinks);
// - a row with no live key under the -inf fill puts all its weight on the
//   sink: out and weights exactly 0 in every kernel;
// - the fused and BLAS kernels bitwise the same at one and two threads,
//   grad_sinks included; the AMX forward never takes the options;
// - the checks of kernels/validate.h.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/fused/attention_amx.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/case_data.h"
#include "kernels/cases.h"
#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "kernels/validate.h"
#include "mha/error.h"

namespace mha::kernels {
namespace {

// The plain formula, in double, for cases with lengths, causal, a window,
// the fill and policy, grouped heads, dropout and the score options (no
// key or pair masks): loss = sum(out * grad_out); out:[B,H,Q,dv] when
// wanted. q element `dq` (flat in the case's (B, Q, H*d) q buffer) is
// shifted by `eps`; sinks are given here (the ones perturbed).
double plain_loss(const CaseData& data, const std::vector<double>& sinks, int64_t dq, double eps,
                  std::vector<double>* out) {
  const Case& c = data.c;
  const AttentionForward f = data.forward();
  const int64_t B = c.B, H = c.H, Q = c.Q, K = c.K, d = c.d, dv = c.dv, G = H / c.Hkv;
  const double fill = c.fill == MaskFill::NegInf ? -INFINITY : -1e6;
  if (out) out->assign(static_cast<size_t>(B * H * Q * dv), 0.0);
  double loss = 0.0;
  std::vector<double> s(static_cast<size_t>(K));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Q; ++i) {
        const float len = c.length_kind == LengthKind::None       ? INFINITY
                          : c.length_kind == LengthKind::PerBatch ? data.lens[static_cast<size_t>(b)]
                                                                  : data.lens[static_cast<size_t>(b * Q + i)];
        int64_t kept = 0;
        double mx = -INFINITY;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t diag = i + K - Q;
          bool keep = static_cast<float>(j) < len;
          if (c.causal == Causal::TopLeft && j > i) keep = false;
          if (c.causal == Causal::BottomRight && j > diag) keep = false;
          if (c.window_left >= 0 && j < diag - c.window_left) keep = false;
          if (c.window_right >= 0 && j > diag + c.window_right) keep = false;
          double dot = 0.0;
          for (int64_t x = 0; x < d; ++x) {
            const int64_t qi = (b * Q + i) * H * d + h * d + x;
            const double qv = data.q.data()[qi] + (qi == dq ? eps : 0.0);
            dot += qv * data.k.data()[(b * K + j) * c.Hkv * d + (h / G) * d + x];
          }
          double sc = dot / std::sqrt(static_cast<double>(d));
          if (c.softcap > 0) sc = c.softcap * std::tanh(sc / c.softcap);
          if (c.alibi) sc -= data.alibi_slopes[static_cast<size_t>(h)] * std::fabs(static_cast<double>(diag - j));
          s[static_cast<size_t>(j)] = keep ? sc : fill;
          kept += keep;
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        std::vector<double> w(static_cast<size_t>(K));
        if (!c.sinks && kept == 0) {  // the fully-masked policy
          std::fill(w.begin(), w.end(), c.fully_masked == FullyMaskedRows::Uniform ? 1.0 / K : 0.0);
        } else {
          const double sink = c.sinks ? sinks[static_cast<size_t>(h)] : -INFINITY;
          mx = std::max(mx, sink);
          double z = c.sinks ? std::exp(sink - mx) : 0.0;
          for (int64_t j = 0; j < K; ++j) z += (w[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx));
          for (double& x : w) x /= z;
        }
        const uint64_t row = static_cast<uint64_t>(((b * H + h) * Q + i) * K);
        for (int64_t x = 0; x < dv; ++x) {
          double o = 0.0;
          for (int64_t j = 0; j < K; ++j)
            o += w[static_cast<size_t>(j)] * f.dropout.multiplier(row + static_cast<uint64_t>(j)) *
                 data.v.data()[(b * K + j) * c.Hkv * dv + (h / G) * dv + x];
          if (out) (*out)[static_cast<size_t>(((b * H + h) * Q + i) * dv + x)] = o;
          loss += o * data.grad_out.data()[(b * Q + i) * H * dv + h * dv + x];
        }
      }
  return loss;
}

// The score cases without key or pair masks (the plain formula above takes none).
std::vector<Case> plain_cases(uint64_t seed, int n) {
  std::vector<Case> cases = score_cases(seed, n);
  for (Case& c : cases) {
    c.key_keep = c.key_bias = c.pair_keep = c.pair_bias = c.pair_per_head = false;
    if (c.Q > 100) c.Q = 37;  // keep the finite differences quick
    if (c.K > 100) c.K = 53;
  }
  return cases;
}

struct Reference {
  Tensor out, w, gq, gk, gv;
  std::vector<float> gs;
};
Reference reference(const CaseData& data) {
  const Case& c = data.c;
  Reference r{data.new_out(), data.new_weights(), Tensor(data.q.shape(), NAN), Tensor(data.k.shape(), NAN),
              Tensor(data.v.shape(), NAN), std::vector<float>(static_cast<size_t>(c.H), NAN)};
  AttentionForward f = data.forward();
  f.out = r.out.view().split_heads(c.H);
  f.weights = r.w.data();
  EXPECT_TRUE(attention_forward(AttentionKernel::Reference, f).empty());
  AttentionBackward p;
  p.fwd = f;
  p.grad_out = data.grad_out.view().split_heads(c.H);
  p.grad_q = r.gq.view().split_heads(c.H);
  p.grad_k = r.gk.view().split_heads(c.Hkv);
  p.grad_v = r.gv.view().split_heads(c.Hkv);
  if (c.sinks) p.grad_sinks = r.gs.data();
  attention_backward(AttentionKernel::Reference, p);
  return r;
}

TEST(ScoreOptions, TheReferenceForwardIsThePlainFormula) {
  int capped = 0, alibi = 0, sinks = 0;
  for (const Case& c : plain_cases(301, 40)) {
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    const std::vector<double> s(data.sinks.begin(), data.sinks.end());
    std::vector<double> want;
    plain_loss(data, s, -1, 0.0, &want);
    const Reference r = reference(data);
    // out in the (B, Q, H*dv) layout, want in [B,H,Q,dv].
    std::vector<float> got_bhqd(want.size()), want_f(want.begin(), want.end());
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t i = 0; i < c.Q; ++i)
          for (int64_t x = 0; x < c.dv; ++x)
            got_bhqd[static_cast<size_t>(((b * c.H + h) * c.Q + i) * c.dv + x)] =
                r.out.data()[(b * c.Q + i) * c.H * c.dv + h * c.dv + x];
    EXPECT_LE(test::normalised_error(got_bhqd.data(), want_f.data(), static_cast<int64_t>(want.size())), 2e-6);
    capped += c.softcap > 0, alibi += c.alibi, sinks += c.sinks;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GE(std::min({capped, alibi, sinks}), 10);
}

// grad_sinks and grad_q (through the softcap and ALiBi) by central finite
// differences of the plain formula in double.
TEST(ScoreOptions, TheReferenceGradientsAreTheFormulasDerivatives) {
  const double eps = 1e-4;
  int sink_checks = 0, cap_checks = 0;
  for (const Case& c : plain_cases(302, 24)) {
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    const Reference r = reference(data);
    const std::vector<double> s(data.sinks.begin(), data.sinks.end());
    auto near = [](double got, double want) { return std::fabs(got - want) <= 2e-5 * (1.0 + std::fabs(want)); };
    for (int64_t h = 0; c.sinks && h < c.H; ++h) {
      std::vector<double> up = s, down = s;
      up[static_cast<size_t>(h)] += eps;
      down[static_cast<size_t>(h)] -= eps;
      const double fd = (plain_loss(data, up, -1, 0, nullptr) - plain_loss(data, down, -1, 0, nullptr)) / (2 * eps);
      EXPECT_TRUE(near(r.gs[static_cast<size_t>(h)], fd)) << "grad_sinks[" << h << "] " << r.gs[static_cast<size_t>(h)]
                                                         << " against " << fd;
      ++sink_checks;
    }
    Generator g(c.seed);
    for (int t = 0; t < 4; ++t) {
      const auto x = static_cast<int64_t>(g.below(static_cast<uint64_t>(data.q.numel())));
      const double fd = (plain_loss(data, s, x, eps, nullptr) - plain_loss(data, s, x, -eps, nullptr)) / (2 * eps);
      EXPECT_TRUE(near(r.gq.data()[x], fd)) << "grad_q element " << x << ": " << r.gq.data()[x] << " against " << fd;
      cap_checks += c.softcap > 0;
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GE(sink_checks, 10);
  EXPECT_GE(cap_checks, 20);
}

// Every kernel and instruction set against the reference, in parts that
// ctest runs side by side.
class ScoreKernelCases : public ::testing::TestWithParam<int> {};

TEST_P(ScoreKernelCases, MatchTheReference) {
  const int part = GetParam();
  const std::vector<Case> cases = score_cases(400 + static_cast<uint64_t>(part), 36);
  const test::Tally t = test::run_cases(cases, ("score options part " + std::to_string(part)).c_str());
  EXPECT_EQ(t.cases, static_cast<int>(cases.size()));
  int capped_small = 0, capped_large = 0, alibi = 0, sinks = 0, dominant = 0, with_window = 0;
  for (const Case& c : cases) {
    capped_small += c.softcap > 0 && c.softcap < 1;
    capped_large += c.softcap >= 50;
    alibi += c.alibi;
    sinks += c.sinks;
    with_window += c.window_left >= 0 || c.window_right >= 0;
    if (c.sinks) {
      const CaseData data(c);
      dominant += std::count(data.sinks.begin(), data.sinks.end(), 20.0f) > 0;
    }
  }
  EXPECT_GE(capped_small, 2);
  EXPECT_GE(capped_large, 2);
  EXPECT_GE(alibi, 8);
  EXPECT_GE(sinks, 8);
  EXPECT_GE(dominant, 2);
  EXPECT_GE(with_window, 6);
  EXPECT_GE(t.grouped, 6);
  EXPECT_GE(t.dropout, 6);
}

INSTANTIATE_TEST_SUITE_P(Parts, ScoreKernelCases, ::testing::Values(0, 1, 2, 3));

// Under the -inf fill a row with no live key puts all its weight on the
// sink: out and weights exactly 0, whatever the fully-masked policy.
TEST(ScoreOptions, ARowWithNoLiveKeyGivesItsWeightToTheSink) {
  Case c;
  c.family = "sink-only";
  c.B = 2, c.H = 3, c.Hkv = 3, c.Q = 20, c.K = 70, c.d = 16, c.dv = 16;
  c.length_kind = LengthKind::PerBatch;
  c.lens = {0.0f, 0.0f};
  c.fill = MaskFill::NegInf;
  c.sinks = true;
  c.softcap = 5.0f;
  for (FullyMaskedRows policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros}) {
    c.fully_masked = policy;
    const CaseData data(c);
    std::vector<std::pair<AttentionKernel, FusedIsa>> runs{{AttentionKernel::Reference, fused_best_isa()},
                                                           {AttentionKernel::Blas, fused_best_isa()}};
    for (FusedIsa isa : test::supported_isas()) runs.emplace_back(AttentionKernel::Fused, isa);
    for (const auto& [kernel, isa] : runs) {
      ASSERT_TRUE(set_fused_isa(isa));
      Tensor out = data.new_out(), w = data.new_weights();
      AttentionForward f = data.forward();
      f.out = out.view().split_heads(c.H);
      f.weights = w.data();
      (void)attention_forward(kernel, f);
      for (float x : out.values()) ASSERT_EQ(x, 0.0f);
      for (float x : w.values()) ASSERT_EQ(x, 0.0f);
    }
    set_fused_isa(fused_best_isa());
  }
}

// A NaN in a query reaches its output row through the softcap, as through
// the plain softmax (the d2l chapter's NaN in, NaN out), in every kernel.
TEST(ScoreOptions, ANanQueryStaysNanThroughTheSoftcap) {
  Case c;
  c.family = "nan";
  c.B = 1, c.H = c.Hkv = 1, c.Q = 5, c.K = 40, c.d = c.dv = 8;
  c.softcap = 20.0f;
  c.alibi = true;
  CaseData data(c);
  data.q.data()[2 * c.d + 3] = NAN;  // query 2
  std::vector<std::pair<AttentionKernel, FusedIsa>> runs{{AttentionKernel::Reference, fused_best_isa()},
                                                         {AttentionKernel::Blas, fused_best_isa()}};
  for (FusedIsa isa : test::supported_isas()) runs.emplace_back(AttentionKernel::Fused, isa);
  for (const auto& [kernel, isa] : runs) {
    ASSERT_TRUE(set_fused_isa(isa));
    Tensor out = data.new_out();
    AttentionForward f = data.forward();
    f.out = out.view().split_heads(c.H);
    (void)attention_forward(kernel, f);
    for (int64_t i = 0; i < c.Q; ++i)
      for (int64_t x = 0; x < c.dv; ++x)
        EXPECT_EQ(std::isnan(out.data()[i * c.dv + x]), i == 2) << "query " << i << " kernel " << static_cast<int>(kernel)
                                                                << " isa " << fused_isa_name(isa);
  }
  set_fused_isa(fused_best_isa());
}

// The fused kernel (forward, weights, backward) and the BLAS backward give
// the same bits at one and two threads, grad_sinks included.
TEST(ScoreOptions, BitwiseTheSameAtOneAndTwoThreads) {
  struct Run {
    Tensor out, w, gq, gk, gv;
    std::vector<float> stats, gs;
  };
  auto run = [](const CaseData& data, AttentionKernel kernel) {
    const Case& c = data.c;
    Run r{data.new_out(), data.new_weights(), Tensor(data.q.shape()), Tensor(data.k.shape()), Tensor(data.v.shape()),
          data.new_stats(), std::vector<float>(static_cast<size_t>(c.H))};
    AttentionForward f = data.forward();
    f.out = r.out.view().split_heads(c.H);
    f.weights = r.w.data();
    f.stats = {r.stats.data(), r.stats.data() + c.B * c.H * c.Q};
    f.stats = attention_forward(kernel, f);
    AttentionBackward p;
    p.fwd = f;
    p.fwd.weights = nullptr;
    p.grad_out = data.grad_out.view().split_heads(c.H);
    p.grad_q = r.gq.view().split_heads(c.H);
    p.grad_k = r.gk.view().split_heads(c.Hkv);
    p.grad_v = r.gv.view().split_heads(c.Hkv);
    if (c.sinks) p.grad_sinks = r.gs.data();
    attention_backward(kernel, p);
    return r;
  };
  const int saved = omp_get_max_threads();
  for (Case c : score_cases(77, 6)) {
    c.B = 3, c.Q = 150, c.K = 170;  // several chunks per thread
    c.sinks = true;
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    for (AttentionKernel kernel : {AttentionKernel::Fused, AttentionKernel::Blas}) {
      omp_set_num_threads(1);
      const Run one = run(data, kernel);
      omp_set_num_threads(2);
      const Run two = run(data, kernel);
      EXPECT_TRUE(one.out == two.out);
      EXPECT_TRUE(one.w == two.w);
      EXPECT_TRUE(one.gq == two.gq && one.gk == two.gk && one.gv == two.gv);
      EXPECT_EQ(one.gs, two.gs);
      if (kernel == AttentionKernel::Fused) {
        EXPECT_EQ(one.stats, two.stats);
      }
    }
  }
  omp_set_num_threads(saved);
}

// The AMX bfloat16 forward has no score pass: calls with an option take the
// AVX-512 kernel (on a machine with AMX, where it would otherwise run).
TEST(ScoreOptions, TheAmxForwardLeavesThemToTheAvx512Kernel) {
  Case c;
  c.B = 1, c.H = c.Hkv = 2, c.Q = c.K = 64, c.d = c.dv = 32;
  for (int option = 0; option < 3; ++option) {
    c.softcap = option == 0 ? 30.0f : 0.0f;
    c.alibi = option == 1;
    c.sinks = option == 2;
    const CaseData data(c);
    AttentionForward f = data.forward();
    f.precision = Precision::BFloat16;
    EXPECT_FALSE(fused::amx_forward_supports(f)) << c.name();
  }
}

TEST(ScoreOptions, ValidationNamesEachBadOption) {
  const Case c = [] {
    Case x;
    x.B = 1, x.H = 2, x.Hkv = 2, x.Q = 3, x.K = 4, x.d = 5, x.dv = 5, x.sinks = true, x.alibi = true;
    return x;
  }();
  const CaseData data(c);
  Tensor out = data.new_out(), gq(data.q.shape()), gk(data.k.shape()), gv(data.v.shape());
  AttentionForward f = data.forward();
  f.out = out.view().split_heads(c.H);
  auto names = [](const std::string& why, const char* what) {
    return why.find(what) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << "'" << why << "' lacks " << what;
  };
  EXPECT_EQ(validate(f), "");
  for (float cap : {-1.0f, NAN, INFINITY}) {
    AttentionForward g = f;
    g.masks.softcap = cap;
    EXPECT_TRUE(names(validate(g), "masks.softcap"));
  }
  std::vector<float> bad = {0.5f, NAN};
  AttentionForward g = f;
  g.masks.alibi_slopes = bad.data();
  EXPECT_TRUE(names(validate(g), "masks.alibi_slopes[1]"));
  bad = {INFINITY, 0.0f};
  g = f;
  g.masks.sinks = bad.data();
  EXPECT_TRUE(names(validate(g), "masks.sinks[0]"));
  AttentionBackward p;
  p.fwd = f;
  p.grad_out = data.grad_out.view().split_heads(c.H);
  p.grad_q = gq.view().split_heads(c.H);
  p.grad_k = gk.view().split_heads(c.Hkv);
  p.grad_v = gv.view().split_heads(c.Hkv);
  EXPECT_TRUE(names(validate(p), "grad_sinks"));
  EXPECT_THROW(attention_backward(AttentionKernel::Reference, p), Error);
  std::vector<float> gs(2);
  p.grad_sinks = gs.data();
  EXPECT_EQ(validate(p), "");
}

}  // namespace
}  // namespace mha::kernels
