// The fused attention kernel against the reference kernel: outputs, softmax
// weights (any subset of rows and heads) and dropout, on awkward shapes, every
// kind of valid length, every instruction set this CPU supports, and at one
// and two threads (bitwise).
//
// Tolerance: float32, |fused - reference| <= 1e-5 |reference| + 1e-6. The
// reference accumulates in double, so this bounds the fused kernel's own
// float32 rounding (online rescaling, base-2 exponential, tile order).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/attention_kernels.h"
#include "cpu/fused/attention_fused.h"
#include "kernels/attention_params.h"
#include "mha/random.h"
#include "mha/tensor.h"

namespace mha::kernels {
namespace {

constexpr float kRtol = 1e-5f, kAtol = 1e-6f;

// Fails with the first few mismatches, naming the flat index.
void expect_close(const float* got, const float* want, int64_t n, const std::string& what,
                  float rtol = kRtol, float atol = kAtol) {
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const float tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << want[i]
                    << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

enum class Lens { None, PerBatch, PerQuery };

struct Case {
  int64_t B, H, Q, K, d, dv;
  Lens lens;
  float dropout = 0.0f;
  std::string name() const {
    std::ostringstream s;  // not a chain of std::string +: GCC 12 warns (-Wrestrict) on those
    s << "B" << B << " H" << H << " Q" << Q << " K" << K << " d" << d << " dv" << dv << " lens"
      << static_cast<int>(lens) << " p" << dropout;
    return s.str();
  }
};

// Inputs laid out as the module lays them out: (B, L, H*d) buffers seen as
// (B, H, L, d) strided views, so rows of one head are not contiguous.
struct Problem {
  Case c;
  Tensor q, k, v;
  std::vector<float> lens;
  Tensor out_ref, out_fused, w_ref;

  Problem(const Case& cs, Generator& gen) : c(cs) {
    q = Tensor({c.B, c.Q, c.H * c.d});
    k = Tensor({c.B, c.K, c.H * c.d});
    v = Tensor({c.B, c.K, c.H * c.dv});
    for (Tensor* t : {&q, &k, &v})
      for (float& x : t->values()) x = gen.uniform(-1.5f, 1.5f);
    const int64_t n = c.lens == Lens::PerBatch ? c.B : c.lens == Lens::PerQuery ? c.B * c.Q : 0;
    for (int64_t i = 0; i < n; ++i) {
      // Every kind of length: 0 (uniform over all keys), fractional, exact,
      // at and past K.
      const uint64_t kind = gen.below(6);
      float len = 0.0f;
      if (kind == 1) len = static_cast<float>(gen.below(static_cast<uint64_t>(c.K)) + 1);
      if (kind == 2) len = static_cast<float>(gen.below(static_cast<uint64_t>(c.K))) + 0.5f;
      if (kind == 3) len = static_cast<float>(c.K);
      if (kind == 4) len = static_cast<float>(c.K) + 7.25f;
      if (kind == 5) len = static_cast<float>(gen.below(static_cast<uint64_t>(c.K) + 1)) * 0.999f;
      lens.push_back(len);
    }
    out_ref = Tensor({c.B, c.Q, c.H * c.dv});
    out_fused = Tensor({c.B, c.Q, c.H * c.dv});
    w_ref = Tensor({c.B, c.H, c.Q, c.K});
  }

  AttentionForward params(Tensor& out, float* weights, uint64_t key) const {
    AttentionForward p;
    p.q = q.view().split_heads(c.H);
    p.k = k.view().split_heads(c.H);
    p.v = v.view().split_heads(c.H);
    p.out = out.view().split_heads(c.H);
    p.weights = weights;
    p.length_kind = c.lens == Lens::None       ? LengthKind::None
                    : c.lens == Lens::PerBatch ? LengthKind::PerBatch
                                               : LengthKind::PerQuery;
    p.lens = lens.empty() ? nullptr : lens.data();
    p.scale_divisor = std::sqrt(static_cast<float>(c.d));
    if (c.dropout > 0) p.dropout = {c.dropout, key};
    return p;
  }
};

std::vector<Case> awkward_cases() {
  std::vector<Case> cases;
  // Lengths one off the tile sizes (64 queries and 48 keys for AVX-512, 16
  // and 48 for AVX2, 8 and 32 for the portable path, and their 16-, 8- and
  // 4-query vectors), primes, a single query or key.
  const int64_t lengths[] = {1, 2, 5, 7, 15, 16, 17, 31, 47, 48, 49, 63, 64, 65, 97, 129, 211, 300};
  const int64_t widths[] = {1, 3, 8, 17, 20, 33, 64, 65};
  Generator g(1234);
  for (int i = 0; i < 90; ++i) {
    Case c;
    c.B = 1 + static_cast<int64_t>(g.below(3));
    c.H = 1 + static_cast<int64_t>(g.below(3));
    c.Q = lengths[g.below(std::size(lengths))];
    c.K = lengths[g.below(std::size(lengths))];
    c.d = widths[g.below(std::size(widths))];
    c.dv = g.below(3) == 0 ? widths[g.below(std::size(widths))] : c.d;
    c.lens = static_cast<Lens>(i % 3);
    c.dropout = i % 5 == 4 ? 0.3f : 0.0f;
    cases.push_back(c);
  }
  return cases;
}

std::vector<FusedIsa> supported_isas() {
  std::vector<FusedIsa> isas;
  for (FusedIsa isa : {FusedIsa::Scalar, FusedIsa::Avx2, FusedIsa::Avx512})
    if (static_cast<int>(isa) <= static_cast<int>(fused_best_isa())) isas.push_back(isa);
  return isas;
}

class FusedIsaTest : public ::testing::TestWithParam<FusedIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(set_fused_isa(GetParam())); }
  void TearDown() override { set_fused_isa(fused_best_isa()); }
};

TEST_P(FusedIsaTest, OutputsAndWeightsMatchTheReference) {
  Generator gen(42);
  for (const Case& c : awkward_cases()) {
    SCOPED_TRACE(c.name());
    Problem pr(c, gen);
    const uint64_t key = gen.next();
    attention_forward_reference(pr.params(pr.out_ref, pr.w_ref.data(), key));
    Tensor w_fused({c.B, c.H, c.Q, c.K});
    attention_forward_fused(pr.params(pr.out_fused, w_fused.data(), key));
    expect_close(pr.out_fused.data(), pr.out_ref.data(), pr.out_ref.numel(), "output");
    expect_close(w_fused.data(), pr.w_ref.data(), pr.w_ref.numel(), "weights");
    if (::testing::Test::HasFailure()) return;
  }
}

TEST_P(FusedIsaTest, WeightsOfAnySubsetComeFromTheSavedStatistics) {
  Generator gen(7);
  const Case cases[] = {{3, 4, 50, 67, 16, 16, Lens::PerQuery},
                        {2, 3, 129, 33, 20, 20, Lens::PerBatch},
                        {2, 2, 5, 300, 7, 7, Lens::None}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    Problem pr(c, gen);
    attention_forward_reference(pr.params(pr.out_ref, pr.w_ref.data(), 0));
    std::vector<float> stats(static_cast<size_t>(2 * c.B * c.H * c.Q));
    const int64_t n = c.B * c.H * c.Q;
    { AttentionForward f = pr.params(pr.out_fused, nullptr, 0); f.stats = {stats.data(), stats.data() + n}; attention_forward_fused(f); }
    expect_close(pr.out_fused.data(), pr.out_ref.data(), pr.out_ref.numel(), "output");

    AttentionWeightsParams w;
    w.fwd = pr.params(pr.out_fused, nullptr, 0);
    w.fwd.stats = {stats.data(), stats.data() + n};
    w.batch_rows = {c.B - 1, 0};  // any order, any subset
    w.heads = {c.H - 1};
    if (c.H > 1) w.heads.push_back(0);
    Tensor got({static_cast<int64_t>(w.batch_rows.size()), static_cast<int64_t>(w.heads.size()), c.Q, c.K});
    w.out = got.data();
    attention_weights_fused(w);
    for (size_t i = 0; i < w.batch_rows.size(); ++i)
      for (size_t j = 0; j < w.heads.size(); ++j) {
        const float* want = pr.w_ref.data() + (w.batch_rows[i] * c.H + w.heads[j]) * c.Q * c.K;
        const float* have = got.data() + (i * w.heads.size() + j) * c.Q * c.K;
        expect_close(have, want, c.Q * c.K,
                     "weights of row " + std::to_string(w.batch_rows[i]) + " head " + std::to_string(w.heads[j]));
      }
  }
}

TEST_P(FusedIsaTest, BitwiseTheSameAtOneAndTwoThreads) {
  Generator gen(99);
  const Case cases[] = {{2, 3, 200, 150, 64, 64, Lens::PerQuery, 0.2f},
                        {1, 2, 97, 211, 33, 17, Lens::PerBatch},
                        {3, 2, 130, 64, 20, 20, Lens::None}};
  const int saved = omp_get_max_threads();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    Problem pr(c, gen);
    const int64_t n = c.B * c.H * c.Q;
    std::vector<float> s1(2 * n), s2(2 * n);
    Tensor w1({c.B, c.H, c.Q, c.K}), w2({c.B, c.H, c.Q, c.K});
    omp_set_num_threads(1);
    { AttentionForward f = pr.params(pr.out_ref, w1.data(), 5); f.stats = {s1.data(), s1.data() + n}; attention_forward_fused(f); }
    omp_set_num_threads(2);
    { AttentionForward f = pr.params(pr.out_fused, w2.data(), 5); f.stats = {s2.data(), s2.data() + n}; attention_forward_fused(f); }
    EXPECT_TRUE(pr.out_ref == pr.out_fused) << "outputs differ between 1 and 2 threads";
    EXPECT_TRUE(w1 == w2) << "weights differ between 1 and 2 threads";
    EXPECT_EQ(s1, s2) << "softmax statistics differ between 1 and 2 threads";
  }
  omp_set_num_threads(saved);
}

// Keys past every query's length are never read (the module leaves their
// projections uncomputed): NaN there must not reach the output.
TEST_P(FusedIsaTest, PaddedKeysAndValuesAreNotRead) {
  Generator gen(3);
  Case c{2, 2, 70, 130, 24, 24, Lens::PerQuery};
  Problem pr(c, gen);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = 0; i < c.Q; ++i)
      pr.lens[b * c.Q + i] = static_cast<float>(1 + gen.below(b == 0 ? 40 : 100));
  attention_forward_reference(pr.params(pr.out_ref, nullptr, 0));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = b == 0 ? 40 : 100; j < c.K; ++j) {
      for (int64_t x = 0; x < c.H * c.d; ++x) pr.k.at({b, j, x}) = NAN;
      for (int64_t x = 0; x < c.H * c.dv; ++x) pr.v.at({b, j, x}) = NAN;
    }
  attention_forward_fused(pr.params(pr.out_fused, nullptr, 0));
  expect_close(pr.out_fused.data(), pr.out_ref.data(), pr.out_ref.numel(), "output");
}

// Valid length 0 gives uniform weights over all K keys, exactly as the seed's
// -1e6 fill does.
TEST_P(FusedIsaTest, ZeroLengthRowsAttendUniformlyToEveryKey) {
  Generator gen(11);
  Case c{2, 1, 3, 77, 8, 8, Lens::PerBatch};
  Problem pr(c, gen);
  pr.lens = {0.0f, 0.0f};
  Tensor w({c.B, c.H, c.Q, c.K});
  attention_forward_fused(pr.params(pr.out_fused, w.data(), 0));
  for (float x : w.values()) EXPECT_EQ(x, 1.0f / 77.0f);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t x = 0; x < c.dv; ++x) {
      double mean = 0;
      for (int64_t j = 0; j < c.K; ++j) mean += pr.v.at({b, j, x});
      mean /= c.K;
      EXPECT_NEAR(pr.out_fused.at({b, 1, x}), mean, 1e-6 + 1e-5 * std::fabs(mean));
    }
}

// A real score equal to the fill (-1e6) ties with the masked keys, so the
// masked keys keep their weight and the kernel must not skip them.
TEST_P(FusedIsaTest, ScoresAtTheFillKeepTheMaskedKeys) {
  Case c{1, 1, 2, 5, 1, 3, Lens::PerBatch};
  Generator gen(5);
  Problem pr(c, gen);
  pr.q.values() = {1000.0f, 1000.0f};
  pr.k.values() = {-1000.0f, 1.0f, 2.0f, 3.0f, 4.0f};  // score of key 0: exactly -1e6
  pr.lens = {1.0f};
  Tensor w({1, 1, 2, 5});
  attention_forward_reference(pr.params(pr.out_ref, pr.w_ref.data(), 0));
  attention_forward_fused(pr.params(pr.out_fused, w.data(), 0));
  for (float x : pr.w_ref.values()) EXPECT_FLOAT_EQ(x, 0.2f);
  expect_close(w.data(), pr.w_ref.data(), w.numel(), "weights");
  expect_close(pr.out_fused.data(), pr.out_ref.data(), pr.out_ref.numel(), "output");
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedIsaTest, ::testing::ValuesIn(supported_isas()),
                         [](const auto& info) { return std::string(fused_isa_name(info.param)); });

}  // namespace
}  // namespace mha::kernels
