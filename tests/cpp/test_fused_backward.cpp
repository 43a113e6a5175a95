// The fused attention backward against the reference backward (double, plain
// loops): gradients of q, k and v on awkward shapes, every kind of valid
// length (0, fractional, past K), with and without dropout, on every
// instruction set this CPU supports, and bitwise equal at one and two threads.
//
// Tolerance: max |fused - reference| <= 1e-5 g per gradient, where g is the
// largest reference gradient element of q, k and v together (the measure
// test_attention_backward.cpp uses, over the three at once: each element is
// a sum over Q or K terms with cancellation, so an elementwise relative bound
// is meaningless near zero, and with a single live key the q and k gradients
// are exactly 0 while float32 rounding of dO.O leaves ~1e-7 g).
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_backward.h"
#include "cpu/attention_kernels.h"
#include "cpu/fused/attention_fused.h"
#include "kernels/attention_params.h"
#include "mha/random.h"
#include "mha/tensor.h"
#include "mha/threads.h"

namespace mha::kernels {
namespace {

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

Tensor randn(Shape shape, Generator& g) {
  Tensor t(std::move(shape));
  for (float& x : t.values()) x = static_cast<float>(g.normal());
  return t;
}

struct Case {
  int64_t B, H, Q, K, d, dv;
  LengthKind kind;
  float dropout;
  std::string name() const {
    std::ostringstream s;  // not a chain of std::string +: GCC 12 warns (-Wrestrict) on those
    s << "B" << B << " H" << H << " Q" << Q << " K" << K << " d" << d << " dv" << dv << " lens"
      << static_cast<int>(kind) << " p" << dropout;
    return s.str();
  }
};

struct Grads {
  Tensor q, k, v;
  explicit Grads(const Case& c)
      : q({c.B, c.Q, c.H * c.d}), k({c.B, c.K, c.H * c.d}), v({c.B, c.K, c.H * c.dv}) {}
  void attach(AttentionBackward& p, int64_t H) {
    p.grad_q = q.view().split_heads(H);
    p.grad_k = k.view().split_heads(H);
    p.grad_v = v.view().split_heads(H);
  }
};

// Inputs as the module lays them out: (B, L, H*d) buffers seen as heads.
struct Problem {
  Case c;
  Tensor q, k, v, dO, out;
  std::vector<float> lens, stats;
  AttentionBackward p;

  Problem(const Case& cs, Generator& g, std::vector<float> fixed_lens = {}) : c(cs) {
    q = randn({c.B, c.Q, c.H * c.d}, g);
    k = randn({c.B, c.K, c.H * c.d}, g);
    v = randn({c.B, c.K, c.H * c.dv}, g);
    dO = randn({c.B, c.Q, c.H * c.dv}, g);
    out = Tensor({c.B, c.Q, c.H * c.dv});
    const int64_t n = c.kind == LengthKind::PerBatch ? c.B : c.kind == LengthKind::PerQuery ? c.B * c.Q : 0;
    for (int64_t i = 0; i < n; ++i)  // 0 .. K+1 in halves: empty, fractional, past K
      lens.push_back(static_cast<float>(g.below(static_cast<uint64_t>(2 * c.K + 3))) * 0.5f);
    if (!fixed_lens.empty()) lens = std::move(fixed_lens);
    AttentionForward f;
    f.q = q.view().split_heads(c.H);
    f.k = k.view().split_heads(c.H);
    f.v = v.view().split_heads(c.H);
    f.out = out.view().split_heads(c.H);
    f.length_kind = c.kind;
    f.lens = lens.empty() ? nullptr : lens.data();
    f.scale_divisor = std::sqrt(static_cast<float>(c.d));
    f.dropout = {c.dropout, g.next()};
    const int64_t bhq = c.B * c.H * c.Q;
    stats.resize(static_cast<size_t>(2 * bhq));
    f.stats = {stats.data(), stats.data() + bhq};
    attention_forward_fused(f);
    p.fwd = f;
    p.grad_out = dO.view().split_heads(c.H);
  }
  void fused(Grads& g) {
    AttentionBackward b = p;
    g.attach(b, c.H);
    attention_backward_fused(b);
  }
  void reference(Grads& g) {
    AttentionBackward b = p;
    g.attach(b, c.H);
    attention_backward_reference(b);
  }
};

std::vector<FusedIsa> supported_isas() {
  std::vector<FusedIsa> isas;
  for (FusedIsa isa : {FusedIsa::Scalar, FusedIsa::Avx2, FusedIsa::Avx512})
    if (static_cast<int>(isa) <= static_cast<int>(fused_best_isa())) isas.push_back(isa);
  return isas;
}

class FusedBackwardTest : public ::testing::TestWithParam<FusedIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(set_fused_isa(GetParam())); }
  void TearDown() override { set_fused_isa(fused_best_isa()); }
};

TEST_P(FusedBackwardTest, MatchesTheReferenceBackward) {
  // Lengths one off the tiles (64/48 queries/keys for AVX-512, 16/48 AVX2,
  // 8/32 portable), primes, single query or key; odd head widths.
  const int64_t lengths[] = {1, 2, 5, 15, 17, 31, 47, 48, 49, 63, 65, 97, 130};
  const int64_t widths[] = {1, 3, 8, 17, 20, 33, 64};
  const LengthKind kinds[] = {LengthKind::None, LengthKind::PerBatch, LengthKind::PerQuery};
  Generator g(17);
  for (int i = 0; i < 45; ++i) {
    Case c;
    c.B = 1 + static_cast<int64_t>(g.below(2));
    c.H = 1 + static_cast<int64_t>(g.below(3));
    c.Q = lengths[g.below(std::size(lengths))];
    c.K = lengths[g.below(std::size(lengths))];
    c.d = widths[g.below(std::size(widths))];
    c.dv = g.below(3) == 0 ? widths[g.below(std::size(widths))] : c.d;
    c.kind = kinds[i % 3];
    c.dropout = i % 4 == 3 ? 0.3f : 0.0f;
    SCOPED_TRACE(c.name());
    Problem pr(c, g);
    Grads ref(c), got(c);
    pr.reference(ref);
    pr.fused(got);
    const double g_scale = std::fmax(max_abs(ref.q), std::fmax(max_abs(ref.k), max_abs(ref.v)));
    EXPECT_LE(max_error(got.q, ref.q), 1e-5 * g_scale) << "grad q";
    EXPECT_LE(max_error(got.k, ref.k), 1e-5 * g_scale) << "grad k";
    EXPECT_LE(max_error(got.v, ref.v), 1e-5 * g_scale) << "grad v";
    if (::testing::Test::HasFailure()) return;
  }
}

TEST_P(FusedBackwardTest, ZeroLengthRowsSpreadValueGradientsOverEveryKey) {
  // Every query of row 0 has valid length 0: uniform weights 1/K over all
  // keys, so grad_v of every key is mean(dO) and grad_k is 0.
  Generator g(5);
  Case c{2, 2, 9, 70, 8, 8, LengthKind::PerBatch, 0.0f};
  Problem pr(c, g, {0.0f, 33.0f});
  Grads ref(c), got(c);
  pr.reference(ref);
  pr.fused(got);
  EXPECT_LE(max_error(got.v, ref.v), 1e-5 * max_abs(ref.v));
  EXPECT_LE(max_error(got.q, ref.q), 1e-5 * max_abs(ref.v));
  for (int64_t j = 0; j < c.K; ++j)
    for (int64_t x = 0; x < c.H * c.d; ++x) EXPECT_EQ(got.k.at({0, j, x}), 0.0f);
}

TEST_P(FusedBackwardTest, BitwiseTheSameAtOneAndTwoThreads) {
  Generator g(8);
  Case c{2, 3, 150, 131, 64, 64, LengthKind::PerQuery, 0.2f};
  Problem pr(c, g);
  const int saved = num_threads();
  Grads one(c), two(c);
  set_num_threads(1);
  pr.fused(one);
  set_num_threads(2);
  pr.fused(two);
  set_num_threads(saved);
  EXPECT_TRUE(one.q == two.q && one.k == two.k && one.v == two.v);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedBackwardTest, ::testing::ValuesIn(supported_isas()),
                         [](const auto& info) { return std::string(fused_isa_name(info.param)); });

}  // namespace
}  // namespace mha::kernels
