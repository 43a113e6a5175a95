// The kernel test runner (harness.h).
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kernels/case_data.h"
#include "kernels/dispatch.h"

namespace mha::kernels::test {

double normalised_error(const float* got, const float* want, int64_t n, double floor) {
  double err = 0.0, scale = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / (scale + floor);
}

namespace {

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float x : t.values()) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

bool all_finite(const Tensor& t) {
  return std::all_of(t.values().begin(), t.values().end(), [](float x) { return std::isfinite(x); });
}

// Gradients in the module layout, NaN until a kernel writes them (a kernel
// must overwrite every element).
struct Grads {
  Tensor q, k, v;  // (B, Q, H*d), (B, K, Hkv*d), (B, K, Hkv*dv)
  Tensor sinks;    // [H] with sinks, else empty
  explicit Grads(const Case& c)
      : q({c.B, c.Q, c.H * c.d}, NAN), k({c.B, c.K, c.Hkv * c.d}, NAN), v({c.B, c.K, c.Hkv * c.dv}, NAN),
        sinks({c.sinks ? c.H : 0}, NAN) {}
  void attach(AttentionBackward& p, const Case& c) {
    p.grad_q = q.view().split_heads(c.H);
    p.grad_k = k.view().split_heads(c.Hkv);
    p.grad_v = v.view().split_heads(c.Hkv);
    if (c.sinks) p.grad_sinks = sinks.data();
  }
};

Grads backward(AttentionKernel kernel, const AttentionForward& fwd, const CaseData& data) {
  Grads g(data.c);
  AttentionBackward p;
  p.fwd = fwd;
  p.grad_out = data.grad_out.view().split_heads(data.c.H);
  g.attach(p, data.c);
  attention_backward(kernel, p);
  return g;
}

// Checks one result against the reference: e <= bound (and records the worst).
void check(const char* direction, const std::string& what, const float* got, const float* want, int64_t n,
           double floor, double bound, double& worst, Tally& tally) {
  const double e = normalised_error(got, want, n, floor);
  ++tally.runs;
  if (std::isfinite(e)) worst = std::max(worst, e);
  EXPECT_LE(e, bound) << direction << ": " << what;
}

// Restores the best instruction set however a run ends.
struct IsaScope {
  explicit IsaScope(FusedIsa isa) { set = set_fused_isa(isa); }
  ~IsaScope() { set_fused_isa(fused_best_isa()); }
  bool set = false;
};

}  // namespace

std::vector<FusedIsa> supported_isas() {
  std::vector<FusedIsa> isas;
  for (FusedIsa isa : {FusedIsa::Scalar, FusedIsa::Avx2, FusedIsa::Avx512})
    if (static_cast<int>(isa) <= static_cast<int>(fused_best_isa())) isas.push_back(isa);
  return isas;
}

std::vector<KernelUnderTest> kernels_under_test() {
  std::vector<KernelUnderTest> ks{{AttentionKernel::Blas, fused_best_isa(), "blas"}};
  for (FusedIsa isa : supported_isas())
    ks.push_back({AttentionKernel::Fused, isa, std::string("fused/") + fused_isa_name(isa)});
  return ks;
}

void run_case(const Case& c, Tally& tally) {
  SCOPED_TRACE(c.name());
  const CaseData data(c);
  const AttentionForward base = data.forward();
  const int64_t n_out = c.B * c.Q * c.H * c.dv, n_w = c.B * c.H * c.Q * c.K;
  ++tally.cases;
  tally.grouped += c.grouped();
  tally.dropout += c.dropout > 0;
  tally.masked += c.any_mask();

  // The yardstick: the reference forward (out and weights) and backward.
  Tensor ref_out = data.new_out(), ref_w = data.new_weights();
  AttentionForward ref = base;
  ref.out = ref_out.view().split_heads(c.H);
  ref.weights = ref_w.data();
  EXPECT_TRUE(attention_forward(AttentionKernel::Reference, ref).empty()) << "the reference saved statistics";
  const Grads ref_g = backward(AttentionKernel::Reference, ref, data);
  tally.flops += c.forward_flops() + c.backward_flops();
  ASSERT_TRUE(all_finite(ref_out) && all_finite(ref_w)) << "the reference forward is not finite";
  ASSERT_TRUE(all_finite(ref_g.q) && all_finite(ref_g.k) && all_finite(ref_g.v) && all_finite(ref_g.sinks))
      << "the reference backward is not finite";
  // ALiBi's bias reaches slope * (K + Q): a score that large carries float32
  // rounding of ulp(score) in every kernel, the reference's float forward
  // too (~2^-24 of 300 is 2e-5), so the forward and weight bounds grow with
  // it past 32 (the other options leave scores near the chapter's).
  double alibi_max = 0.0;
  for (float x : data.alibi_slopes) alibi_max = std::max(alibi_max, std::fabs(static_cast<double>(x)) * (c.K + c.Q));
  const double fw_bound = kForwardBound * std::max(1.0, alibi_max / 32.0);
  const double w_bound = kWeightsBound * std::max(1.0, alibi_max / 32.0);
  const double g_scale = std::max({max_abs(ref_g.q), max_abs(ref_g.k), max_abs(ref_g.v)});
  const double g_floor = 1e-1 * g_scale + 1e-30;

  bool counted_rows = false;
  for (const KernelUnderTest& k : kernels_under_test()) {
    IsaScope isa(k.isa);
    ASSERT_TRUE(isa.set) << k.name;
    const bool fused = k.kernel == AttentionKernel::Fused;
    // Forward with weights and statistics asked for; outputs NaN until written.
    Tensor out(ref_out.shape(), NAN), w(ref_w.shape(), NAN);
    std::vector<float> stats = data.new_stats();
    const int64_t bhq = c.B * c.H * c.Q;
    AttentionForward p = base;
    p.out = out.view().split_heads(c.H);
    p.weights = w.data();
    p.stats = {stats.data(), stats.data() + bhq};
    const SoftmaxStats saved = attention_forward(k.kernel, p);
    tally.flops += c.forward_flops();
    EXPECT_EQ(saved.empty(), !fused) << k.name << ": statistics saved iff the fused kernel ran";
    check("forward", k.name + " out", out.data(), ref_out.data(), n_out, 1e-6, fw_bound,
          tally.worst_forward, tally);
    check("weights", k.name + " weights", w.data(), ref_w.data(), n_w, 1e-6, w_bound,
          tally.worst_weights, tally);
    p.stats = saved;

    if (fused && !saved.empty()) {
      if (!counted_rows) {  // a fully masked row has row_max2 = -inf (kernels/params.h)
        const int64_t before = tally.fully_masked_rows;
        for (int64_t r = 0; r < bhq; ++r) tally.fully_masked_rows += stats[static_cast<size_t>(r)] == -INFINITY;
        tally.with_fully_masked_row += tally.fully_masked_rows > before;
      }
      counted_rows = true;
      // The weights of a subset of (row, head) pairs, any order, from the statistics.
      AttentionWeightsParams wp;
      wp.fwd = p;
      wp.batch_rows = {c.B - 1, 0};
      wp.heads = {c.H - 1};
      if (c.H > 1) wp.heads.push_back(0);
      const auto nr = static_cast<int64_t>(wp.batch_rows.size()), nh = static_cast<int64_t>(wp.heads.size());
      Tensor sub({nr, nh, c.Q, c.K}, NAN);
      wp.out = sub.data();
      attention_weights(wp);
      tally.flops += c.weights_flops() * static_cast<double>(nr * nh) / static_cast<double>(c.B * c.H);
      Tensor want({nr, nh, c.Q, c.K});  // the reference's weights of the same pairs
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nh; ++j) {
          const int64_t b = wp.batch_rows[static_cast<size_t>(i)], h = wp.heads[static_cast<size_t>(j)];
          std::copy_n(ref_w.data() + (b * c.H + h) * c.Q * c.K, c.Q * c.K, want.data() + (i * nh + j) * c.Q * c.K);
        }
      check("weights", k.name + " from statistics, rows (B-1, 0), heads (H-1, 0)", sub.data(), want.data(),
            sub.numel(), 1e-6, w_bound, tally.worst_weights, tally);
    }

    // Backward: BLAS from the saved weights and recomputing them; fused from
    // its statistics.
    std::vector<std::pair<std::string, AttentionForward>> backwards;
    if (fused) {
      AttentionForward f = p;
      f.weights = nullptr;
      backwards.emplace_back(k.name + " from statistics", f);
    } else {
      backwards.emplace_back(k.name + " from saved weights", p);
      AttentionForward f = p;
      f.weights = nullptr;
      backwards.emplace_back(k.name + " recomputing the weights", f);
    }
    for (const auto& [what, f] : backwards) {
      const Grads g = backward(k.kernel, f, data);
      tally.flops += c.backward_flops();
      check("backward", what + " grad_q", g.q.data(), ref_g.q.data(), g.q.numel(), g_floor, kBackwardBound,
            tally.worst_backward, tally);
      check("backward", what + " grad_k", g.k.data(), ref_g.k.data(), g.k.numel(), g_floor, kBackwardBound,
            tally.worst_backward, tally);
      check("backward", what + " grad_v", g.v.data(), ref_g.v.data(), g.v.numel(), g_floor, kBackwardBound,
            tally.worst_backward, tally);
      if (c.sinks)  // a sum over every row and query: its own scale
        check("backward", what + " grad_sinks", g.sinks.data(), ref_g.sinks.data(), g.sinks.numel(),
              1e-1 * max_abs(ref_g.sinks) + g_floor, kBackwardBound, tally.worst_backward, tally);
    }
  }
}

Tally run_cases(const std::vector<Case>& cases, const char* what) {
  Tally tally;
  for (const Case& c : cases) {
    run_case(c, tally);
    if (::testing::Test::HasFailure()) break;  // the first failing case says enough
  }
  std::printf("%s: %d cases, %d comparisons, %.2f GFLOP; worst normalised error forward %.2e, "
              "weights %.2e, backward %.2e\n",
              what, tally.cases, tally.runs, tally.flops / 1e9, tally.worst_forward, tally.worst_weights,
              tally.worst_backward);
  return tally;
}

}  // namespace mha::kernels::test
