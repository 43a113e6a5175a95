// The fused attention forward's own promises, on every instruction set this
// CPU supports: bitwise the same at one and two threads, key and value rows
// past every length never read, zero lengths exactly uniform, scores equal
// to the fill keeping the masked keys. (Its results against the reference on
// every case family: test_kernel_cases.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/blas/attention_blas.h"
#include "cpu/fused/attention_fused.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/case_data.h"

namespace mha::kernels {
namespace {

using test::kForwardBound;
using test::kWeightsBound;
using test::normalised_error;

Case forward_case(int64_t B, int64_t H, int64_t Q, int64_t K, int64_t d, int64_t dv, LengthKind kind,
                  float dropout, uint64_t seed) {
  Case c;
  c.family = "fused forward";
  c.B = B, c.H = c.Hkv = H, c.Q = Q, c.K = K, c.d = d, c.dv = dv;
  c.length_kind = kind;
  c.dropout = dropout;
  c.seed = seed;
  return c;
}

// Runs the fused forward on `data` into out (and weights, stats when given).
void run_fused(const CaseData& data, Tensor& out, float* weights, std::vector<float>* stats) {
  AttentionForward p = data.forward();
  p.out = out.view().split_heads(data.c.H);
  p.weights = weights;
  if (stats) {
    const int64_t n = data.c.B * data.c.H * data.c.Q;
    p.stats = {stats->data(), stats->data() + n};
  }
  attention_forward_fused(p);
}

void run_reference(const CaseData& data, Tensor& out, float* weights) {
  AttentionForward p = data.forward();
  p.out = out.view().split_heads(data.c.H);
  p.weights = weights;
  attention_forward_reference(p);
}

class FusedIsaTest : public ::testing::TestWithParam<FusedIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(set_fused_isa(GetParam())); }
  void TearDown() override { set_fused_isa(fused_best_isa()); }
};

TEST_P(FusedIsaTest, BitwiseTheSameAtOneAndTwoThreads) {
  const Case cases[] = {forward_case(2, 3, 200, 150, 64, 64, LengthKind::PerQuery, 0.2f, 1),
                        forward_case(1, 2, 97, 211, 33, 17, LengthKind::PerBatch, 0.0f, 2),
                        forward_case(3, 2, 130, 64, 20, 20, LengthKind::None, 0.0f, 3)};
  const int saved = omp_get_max_threads();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    std::vector<float> s1 = data.new_stats(), s2 = data.new_stats();
    Tensor o1 = data.new_out(), o2 = data.new_out(), w1 = data.new_weights(), w2 = data.new_weights();
    omp_set_num_threads(1);
    run_fused(data, o1, w1.data(), &s1);
    omp_set_num_threads(2);
    run_fused(data, o2, w2.data(), &s2);
    EXPECT_TRUE(o1 == o2) << "outputs differ between 1 and 2 threads";
    EXPECT_TRUE(w1 == w2) << "weights differ between 1 and 2 threads";
    EXPECT_EQ(s1, s2) << "softmax statistics differ between 1 and 2 threads";
  }
  omp_set_num_threads(saved);
}

// Keys past every query's length are never read (the module leaves their
// projections uncomputed): NaN there must not reach the output.
TEST_P(FusedIsaTest, PaddedKeysAndValuesAreNotRead) {
  Case c = forward_case(2, 2, 70, 130, 24, 24, LengthKind::PerQuery, 0.0f, 3);
  Generator gen(3);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = 0; i < c.Q; ++i) c.lens.push_back(static_cast<float>(1 + gen.below(b == 0 ? 40 : 100)));
  CaseData data(c);
  Tensor ref = data.new_out(), out = data.new_out();
  run_reference(data, ref, nullptr);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = b == 0 ? 40 : 100; j < c.K; ++j) {
      for (int64_t x = 0; x < c.H * c.d; ++x) data.k.at({b, j, x}) = NAN;
      for (int64_t x = 0; x < c.H * c.dv; ++x) data.v.at({b, j, x}) = NAN;
    }
  run_fused(data, out, nullptr, nullptr);
  EXPECT_LE(normalised_error(out.data(), ref.data(), out.numel()), kForwardBound);
}

// Valid length 0 gives uniform weights over all K keys, exactly as the
// chapter's -1e6 fill does.
TEST_P(FusedIsaTest, ZeroLengthRowsAttendUniformlyToEveryKey) {
  Case c = forward_case(2, 1, 3, 77, 8, 8, LengthKind::PerBatch, 0.0f, 11);
  c.lens = {0.0f, 0.0f};
  const CaseData data(c);
  Tensor out = data.new_out(), w = data.new_weights();
  run_fused(data, out, w.data(), nullptr);
  for (float x : w.values()) EXPECT_EQ(x, 1.0f / 77.0f);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t x = 0; x < c.dv; ++x) {
      double mean = 0;
      for (int64_t j = 0; j < c.K; ++j) mean += data.v.at({b, j, x});
      mean /= c.K;
      EXPECT_NEAR(out.at({b, 1, x}), mean, 1e-6 + 1e-5 * std::fabs(mean));
    }
}

// A real score equal to the fill (-1e6) ties with the masked keys, so the
// masked keys keep their weight and the kernel must not skip them.
TEST_P(FusedIsaTest, ScoresAtTheFillKeepTheMaskedKeys) {
  Case c = forward_case(1, 1, 2, 5, 1, 3, LengthKind::PerBatch, 0.0f, 5);
  c.lens = {1.0f};
  CaseData data(c);
  data.q.values() = {1000.0f, 1000.0f};
  data.k.values() = {-1000.0f, 1.0f, 2.0f, 3.0f, 4.0f};  // score of key 0: exactly -1e6
  Tensor ref = data.new_out(), out = data.new_out(), w_ref = data.new_weights(), w = data.new_weights();
  run_reference(data, ref, w_ref.data());
  run_fused(data, out, w.data(), nullptr);
  for (float x : w_ref.values()) EXPECT_FLOAT_EQ(x, 0.2f);
  EXPECT_LE(normalised_error(w.data(), w_ref.data(), w.numel()), kWeightsBound);
  EXPECT_LE(normalised_error(out.data(), ref.data(), out.numel()), kForwardBound);
}

// Keys and values are read where they are (contiguous rows) or from each
// thread's packed copy (strided rows): the same operations on the same
// values, so every output bit agrees, at 1 and 2 threads, and with the
// reference within its bound. Slices shorter and longer than L2, with
// lengths, causal, a packed batch and dropout.
TEST_P(FusedIsaTest, KeysReadInPlaceOrPackedGiveTheSameBits) {
  Case cases[] = {forward_case(2, 2, 70, 2100, 64, 64, LengthKind::PerQuery, 0.1f, 5),
                  forward_case(1, 3, 40, 2600, 48, 80, LengthKind::None, 0.0f, 6),
                  forward_case(2, 2, 90, 900, 64, 64, LengthKind::PerBatch, 0.0f, 7),
                  forward_case(1, 2, 2300, 2300, 64, 64, LengthKind::None, 0.0f, 8)};  // a packed batch, causal
  cases[0].causal = Causal::TopLeft;
  cases[3].causal = Causal::TopLeft;
  cases[3].doc_offsets = {0, 700, 2250, 2300};
  const int saved = omp_get_max_threads();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    AttentionForward strided = data.forward();
    ASSERT_NE(strided.k.stride[2], c.d) << "the case must have strided key rows";
    // The same keys and values as contiguous (B, Hkv, K, width) tensors.
    Tensor k({c.B, c.Hkv, c.K, c.d}), v({c.B, c.Hkv, c.K, c.dv});
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hkv; ++h)
        for (int64_t j = 0; j < c.K; ++j) {
          for (int64_t x = 0; x < c.d; ++x) k.at({b, h, j, x}) = *strided.k.ptr(b, h, j, x);
          for (int64_t x = 0; x < c.dv; ++x) v.at({b, h, j, x}) = *strided.v.ptr(b, h, j, x);
        }
    AttentionForward in_place = strided;
    in_place.k = k.view();
    in_place.v = v.view();
    Tensor ref = data.new_out();
    run_reference(data, ref, nullptr);
    // kForwardBound holds sums of a few hundred terms; rounding over K keys
    // grows like sqrt(K) (2.3e-6 seen at K = 2600).
    const double bound = kForwardBound * std::max(1.0, std::sqrt(static_cast<double>(c.K) / 256.0));
    Tensor first;
    for (int threads : {1, 2})
      for (AttentionForward* p : {&strided, &in_place}) {
        omp_set_num_threads(threads);
        Tensor out = data.new_out();
        p->out = out.view().split_heads(c.H);
        attention_forward_fused(*p);
        EXPECT_LE(normalised_error(out.data(), ref.data(), out.numel()), bound);
        if (first.numel() == 0) first = out;
        else EXPECT_TRUE(out == first) << (p == &strided ? "packed" : "in place") << " at " << threads
                                       << " threads differs from packed at 1 thread";
      }
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FusedIsaTest, ::testing::ValuesIn(test::supported_isas()),
                         [](const auto& info) { return std::string(fused_isa_name(info.param)); });

}  // namespace
}  // namespace mha::kernels
