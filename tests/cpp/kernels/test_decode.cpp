// The decode kernel (few queries over many cached keys) against its
// reference, against the full attention kernels on the same data, in
// bfloat16 storage, at one and two threads (bitwise), on every instruction
// set this CPU supports, and its input checks.
//
// Tolerances (float32 cache): |fast - reference| <= 1e-5 (|reference| + max|v|):
// the reference accumulates in double; the kernel's own rounding (base-2
// exponential, online rescaling, chunk merge) is relative to the values'
// scale, not to an output that may cancel to near 0.
// bfloat16 cache: see BfloatBound below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/blas/attention_blas.h"
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

using Case = test::DecodeShape;
using test::expect_close;
using test::supported_isas;

// The data of one call (decode_problem.h), 5 spare slots past the longest length.
struct Problem : test::DecodeData {
  Problem(const Case& cs, uint64_t seed) : DecodeData(cs, 5, seed) {}
};

std::vector<Case> awkward_cases() {
  const int64_t C = kDecodeMinChunk;  // the chunk size of calls this small
  return {
      {1, 1, 1, 1, 1, {1}},                           // one key, width 1
      {2, 2, 1, 7, 7, {0, 1, 2}},                     // lengths 0 and 1, d odd
      {4, 4, 4, 33, 33, {4, 5, 0, 31}},              // Qn 4, d odd, lengths at Qn
      {6, 2, 4, 17, 9, {C - 1, C, C + 1}},           // grouped heads, dv != d, off by one from a chunk
      {8, 2, 16, 128, 128, {16, 2 * C + 1, 33}},     // Qn 16 x group 4: 64 rows in blocks of 8
      {3, 1, 16, 65, 65, {16, 17}},                  // multi-query, d one past a vector
      {2, 2, 3, 20, 20, {1, 2, 3, 700}, false},      // not causal: any length >= 1
      {32, 8, 1, 128, 128, {3 * C + 31}},            // the benchmark's head layout
  };
}

TEST(Decode, EveryIsaMatchesTheReference) {
  uint64_t seed = 1;
  for (const Case& c : awkward_cases()) {
    Problem pb(c, seed++);
    std::vector<float> want, got;
    decode_attention_reference(pb.params(want));
    for (FusedIsa isa : supported_isas()) {
      decode_attention(pb.params(got), isa);
      expect_close(got, want, 1e-5, 1.0, c.name() + " isa " + fused_isa_name(isa));
    }
  }
}

// The decode kernel is the full attention of the Qn queries over the K
// cached keys of each row, with the chapter's per-query valid lengths
// (K - Qn + i + 1 when causal): the fused and reference attention kernels,
// given those, must agree with it.
TEST(Decode, AgreesWithTheFullAttentionKernels) {
  uint64_t seed = 100;
  for (const Case& c : awkward_cases()) {
    Problem pb(c, seed++);
    std::vector<float> got;
    const DecodeParams dp = pb.params(got);
    decode_attention(dp);
    for (int64_t b = 0; b < pb.B; ++b) {
      const int64_t K = c.lengths[static_cast<size_t>(b)];
      if (K == 0) continue;  // no keys: a case the full kernels do not have
      std::vector<float> lens(static_cast<size_t>(c.Qn)), ref(static_cast<size_t>(c.Hq * c.Qn * c.dv)), fused = ref;
      for (int64_t i = 0; i < c.Qn; ++i) lens[static_cast<size_t>(i)] = static_cast<float>(dp.valid_len(b, K, i));
      auto view = [](float* data, int64_t h, int64_t n, int64_t w, int64_t sh, int64_t sn) {
        TensorView t;
        t.data = data, t.rank = 4;
        t.shape[0] = 1, t.shape[1] = h, t.shape[2] = n, t.shape[3] = w;
        t.stride[0] = 0, t.stride[1] = sh, t.stride[2] = sn, t.stride[3] = 1;
        return t;
      };
      const int64_t cap = pb.capacity;
      for (int which = 0; which < 2; ++which) {
        std::vector<float>& out = which == 0 ? ref : fused;
        AttentionForward p;
        p.q = view(pb.q.data() + b * c.Qn * c.Hq * c.d, c.Hq, c.Qn, c.d, c.d, c.Hq * c.d);
        p.k = view(pb.k.data() + b * c.Hkv * cap * c.d, c.Hkv, K, c.d, cap * c.d, c.d);
        p.v = view(pb.v.data() + b * c.Hkv * cap * c.dv, c.Hkv, K, c.dv, cap * c.dv, c.dv);
        p.out = view(out.data(), c.Hq, c.Qn, c.dv, c.Qn * c.dv, c.dv);
        p.length_kind = LengthKind::PerQuery;
        p.lens = lens.data();
        p.scale_divisor = std::sqrt(static_cast<float>(c.d));
        if (which == 0) attention_forward_reference(p);
        else attention_forward_fused(p);
      }
      const std::vector<float> mine(got.begin() + b * c.Hq * c.Qn * c.dv, got.begin() + (b + 1) * c.Hq * c.Qn * c.dv);
      expect_close(mine, ref, 1e-5, 1.0, c.name() + " vs attention_forward_reference, row " + std::to_string(b));
      expect_close(mine, fused, 1e-5, 1.0, c.name() + " vs attention_forward_fused, row " + std::to_string(b));
    }
  }
}

// bfloat16 cache. Two checks:
// - against the reference reading the same bfloat16 cache: the widening is
//   exact, so the float32 tolerance holds;
// - against the float32 reference on the unrounded cache, within the error
//   rounding to bfloat16 (relative u = 2^-9 per element) can make: each
//   value moves by at most u max|v|, each score by at most
//   e = u max_j sum_c |q_c k_jc| / sqrt(d), so each weight by a factor within
//   exp(+-2e), and the output by at most (u + exp(2e) - 1) max|v|.
TEST(Decode, BfloatBound) {
  uint64_t seed = 200;
  for (const Case& c : awkward_cases()) {
    Problem pb(c, seed++);
    std::vector<float> want16, want32, got;
    decode_attention_reference(pb.params(want16, CacheDtype::BF16));
    decode_attention_reference(pb.params(want32));
    double e = 0;
    for (int64_t b = 0; b < pb.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Qn; ++i)
          for (int64_t j = 0; j < c.lengths[static_cast<size_t>(b)]; ++j) {
            double s = 0;
            for (int64_t x = 0; x < c.d; ++x)
              s += std::fabs(pb.q[static_cast<size_t>((b * c.Qn + i) * c.Hq * c.d + h * c.d + x)]) *
                   std::fabs(pb.k[static_cast<size_t>(((b * c.Hkv + h / (c.Hq / c.Hkv)) * pb.capacity + j) * c.d + x)]);
            e = std::max(e, s);
          }
    const double u = std::ldexp(1.0, -9);
    e *= u / std::sqrt(static_cast<double>(c.d));
    const double bound = (u + std::expm1(2 * e)) * 1.0 /* max|v| */ + 1e-5;
    for (FusedIsa isa : supported_isas()) {
      decode_attention(pb.params(got, CacheDtype::BF16), isa);
      const std::string what = c.name() + " bf16 isa " + fused_isa_name(isa);
      expect_close(got, want16, 1e-5, 1.0, what + " vs the bf16 reference");
      for (size_t x = 0; x < got.size(); ++x)
        ASSERT_LE(std::fabs(got[x] - want32[x]), bound) << what << " vs the float32 reference, element " << x;
    }
  }
}

// The masks beyond causality (kernels/params.h): the chapter's valid
// lengths (per row or per query; fractional, 0, past K) with its -1e6 fill,
// and a key_padding_mask (boolean and additive) with -inf and either
// fully-masked policy. Each against the reference on every instruction set,
// and against the fused attention kernel given the same masks as
// MaskOptions (Causal::BottomRight over each row's K keys).
struct MaskVariant {
  const char* name;
  LengthKind kind;
  bool keep, bias;
  MaskFill fill;
  FullyMaskedRows policy;
  int64_t window_left = -1, window_right = -1;  // a sliding window (none: -1, -1)

  // p (a call on S cache slots per row) with these masks on the test's
  // lengths, key_keep and key_bias ([B, S] each).
  DecodeParams apply(DecodeParams p, const std::vector<float>& lens, const std::vector<uint8_t>& keep,
                     const std::vector<float>& bias, int64_t S) const {
    p.length_kind = kind;
    p.lens = kind == LengthKind::None ? nullptr : lens.data();
    p.masks.key_keep = this->keep ? keep.data() : nullptr;
    p.masks.key_bias = this->bias ? bias.data() : nullptr;
    p.masks.key_stride_b = S;
    p.masks.fill = fill;
    p.masks.fully_masked = policy;
    p.masks.window_left = window_left, p.masks.window_right = window_right;
    return p;
  }
};

TEST(Decode, MasksMatchTheReferenceAndTheFusedKernel) {
  const int64_t C = kDecodeMinChunk;
  const std::vector<Case> cases = {
      {2, 2, 1, 7, 7, {1, 2, 9}},
      {4, 4, 4, 33, 33, {4, 5, 31}},
      {6, 2, 4, 17, 9, {C - 1, C + 1}},
      {8, 2, 16, 64, 64, {16, 2 * C + 1, 33}},
      {2, 2, 3, 20, 20, {3, 700}, false},
  };
  const std::vector<MaskVariant> variants = {
      {"lengths per row", LengthKind::PerBatch, false, false, MaskFill::Seed, FullyMaskedRows::Uniform},
      {"lengths per query", LengthKind::PerQuery, false, false, MaskFill::Seed, FullyMaskedRows::Uniform},
      {"boolean padding, zeros", LengthKind::None, true, false, MaskFill::NegInf, FullyMaskedRows::Zeros},
      {"boolean + additive padding, uniform", LengthKind::None, true, true, MaskFill::NegInf, FullyMaskedRows::Uniform},
      {"additive padding, zeros", LengthKind::None, false, true, MaskFill::NegInf, FullyMaskedRows::Zeros},
      {"window (3, 0)", LengthKind::None, false, false, MaskFill::Seed, FullyMaskedRows::Uniform, 3, 0},
      {"window (5, 2), lengths per query", LengthKind::PerQuery, false, false, MaskFill::Seed, FullyMaskedRows::Uniform, 5, 2},
      {"window (0, 0), boolean padding, zeros", LengthKind::None, true, false, MaskFill::NegInf, FullyMaskedRows::Zeros, 0, 0},
      {"window (600, -1), additive padding", LengthKind::None, false, true, MaskFill::NegInf, FullyMaskedRows::Uniform, 600, -1},
  };
  uint64_t seed = 600;
  for (const Case& c : cases)
    for (const MaskVariant& mv : variants) {
      Problem pb(c, seed++);
      Generator gen(seed);
      const int64_t B = pb.B, S = pb.capacity;  // one mask entry per cache slot
      std::vector<float> lens, bias(static_cast<size_t>(B * S), 0.0f);
      std::vector<uint8_t> keep(static_cast<size_t>(B * S), 1);
      const int64_t n_lens = mv.kind == LengthKind::PerBatch ? B : B * c.Qn;
      for (int64_t x = 0; x < n_lens; ++x) {
        const int64_t K = c.lengths[static_cast<size_t>(mv.kind == LengthKind::PerBatch ? x : x / c.Qn)];
        // 0 (uniform weights), fractional, inside, past K, unbounded.
        const float choices[] = {0.0f, 0.5f, 1.0f, static_cast<float>(K) - 1.5f, static_cast<float>(K) / 2,
                                 static_cast<float>(K + 3), INFINITY};
        lens.push_back(std::max(0.0f, choices[gen.next() % 7]));
      }
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < S; ++j) {
          // Row 0 keeps only its last key: in causal Qn > 1 calls every
          // query before the last has no key left (the policy's case).
          if (mv.keep) keep[static_cast<size_t>(b * S + j)] = b == 0 ? j == c.lengths[0] - 1 : gen.uniform(0.0f, 1.0f) < 0.7f;
          if (mv.bias) bias[static_cast<size_t>(b * S + j)] = gen.uniform(0.0f, 1.0f) < 0.1f ? -INFINITY : gen.uniform(-2.0f, 2.0f);
        }
      auto masked = [&](std::vector<float>& o, CacheDtype dtype) {
        return mv.apply(pb.params(o, dtype), lens, keep, bias, S);
      };
      const std::string what = c.name() + " " + mv.name;
      for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16}) {
        std::vector<float> want, got;
        decode_attention_reference(masked(want, dtype));
        for (FusedIsa isa : supported_isas()) {
          decode_attention(masked(got, dtype), isa);
          expect_close(got, want, 1e-5, 1.0, what + (dtype == CacheDtype::BF16 ? " bf16" : "") + " isa " + fused_isa_name(isa));
        }
      }
      std::vector<float> got;
      const DecodeParams dp = masked(got, CacheDtype::F32);
      decode_attention(dp);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t K = c.lengths[static_cast<size_t>(b)];
        std::vector<float> fused(static_cast<size_t>(c.Hq * c.Qn * c.dv));
        auto view = [](float* data, int64_t h, int64_t n, int64_t w, int64_t sh, int64_t sn) {
          TensorView t;
          t.data = data, t.rank = 4;
          t.shape[0] = 1, t.shape[1] = h, t.shape[2] = n, t.shape[3] = w;
          t.stride[0] = 0, t.stride[1] = sh, t.stride[2] = sn, t.stride[3] = 1;
          return t;
        };
        AttentionForward p;
        p.q = view(pb.q.data() + b * c.Qn * c.Hq * c.d, c.Hq, c.Qn, c.d, c.d, c.Hq * c.d);
        p.k = view(pb.k.data() + b * c.Hkv * S * c.d, c.Hkv, K, c.d, S * c.d, c.d);
        p.v = view(pb.v.data() + b * c.Hkv * S * c.dv, c.Hkv, K, c.dv, S * c.dv, c.dv);
        p.out = view(fused.data(), c.Hq, c.Qn, c.dv, c.Qn * c.dv, c.dv);
        p.length_kind = mv.kind;
        p.lens = mv.kind == LengthKind::None ? nullptr : lens.data() + (mv.kind == LengthKind::PerBatch ? b : b * c.Qn);
        p.scale_divisor = std::sqrt(static_cast<float>(c.d));
        p.masks.causal = c.causal ? Causal::BottomRight : Causal::None;
        p.masks.key_keep = mv.keep ? keep.data() + b * S : nullptr;
        p.masks.key_bias = mv.bias ? bias.data() + b * S : nullptr;
        p.masks.fill = mv.fill;
        p.masks.fully_masked = mv.policy;
        p.masks.window_left = mv.window_left, p.masks.window_right = mv.window_right;
        attention_forward_fused(p);
        const std::vector<float> mine(got.begin() + b * c.Hq * c.Qn * c.dv, got.begin() + (b + 1) * c.Hq * c.Qn * c.dv);
        expect_close(mine, fused, 1e-5, 1.0, what + " vs attention_forward_fused, row " + std::to_string(b));
      }
    }
}

// Long prefills run on the fused kernel (decode_attention_fused, chosen by
// kernels::decode_forward from decode_fused_min_queries(dtype) queries on): the same
// attention as the decode kernel's within float32 rounding, 1e-6 of
// (|output| + max|v|), for every mask the decode interface takes, float32
// and bfloat16 caches, ragged rows (a row of no keys included), grouped heads.
TEST(Decode, FusedPrefillIsTheDecodeKernel) {
  const int64_t C = kDecodeMinChunk;
  const std::vector<Case> cases = {
      {4, 4, 70, 16, 16, {70, 0, 71, 300}},
      {8, 2, 64, 64, 64, {64, C + 7}},
      {6, 3, 65, 33, 9, {65, 2 * C + 1}},
      {2, 1, 80, 20, 20, {80, 700}, false},
      {4, 2, 130, 32, 32, {130, 0, 600}},  // past the bfloat16 switch point too
  };
  const std::vector<MaskVariant> variants = {
      {"no masks", LengthKind::None, false, false, MaskFill::Seed, FullyMaskedRows::Uniform},
      {"lengths per query", LengthKind::PerQuery, false, false, MaskFill::Seed, FullyMaskedRows::Uniform},
      {"lengths per row", LengthKind::PerBatch, false, false, MaskFill::Seed, FullyMaskedRows::Uniform},
      {"boolean + additive padding, zeros", LengthKind::None, true, true, MaskFill::NegInf, FullyMaskedRows::Zeros},
      {"boolean padding, uniform", LengthKind::None, true, false, MaskFill::NegInf, FullyMaskedRows::Uniform},
      {"window (16, 0)", LengthKind::None, false, false, MaskFill::Seed, FullyMaskedRows::Uniform, 16, 0},
      {"window (40, 3), boolean padding, zeros", LengthKind::None, true, false, MaskFill::NegInf, FullyMaskedRows::Zeros, 40, 3},
  };
  uint64_t seed = 900;
  for (const Case& c : cases)
    for (const MaskVariant& mv : variants) {
      Problem pb(c, seed++);
      Generator gen(seed);
      const int64_t B = pb.B, S = pb.capacity;
      std::vector<float> lens;
      std::vector<float> bias(static_cast<size_t>(B * S), 0.0f);
      std::vector<uint8_t> keep(static_cast<size_t>(B * S), 1);
      for (int64_t x = 0; x < (mv.kind == LengthKind::PerBatch ? B : B * c.Qn); ++x) {
        const float K = static_cast<float>(c.lengths[static_cast<size_t>(mv.kind == LengthKind::PerBatch ? x : x / c.Qn)]);
        const float choices[] = {0.0f, 2.5f, K - 3.0f, K / 2, K + 1, INFINITY};
        lens.push_back(std::max(0.0f, choices[gen.next() % 6]));
      }
      for (int64_t j = 0; j < B * S; ++j) {
        keep[static_cast<size_t>(j)] = gen.uniform() < 0.8f;
        bias[static_cast<size_t>(j)] = gen.uniform(-1.0f, 1.0f);
      }
      keep[0] = 0;  // row 0's first key: early queries of a row with few cached keys may have none left
      for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16}) {
        auto masked = [&](std::vector<float>& o) { return mv.apply(pb.params(o, dtype), lens, keep, bias, S); };
        std::vector<float> dec, fus, via;
        decode_attention(masked(dec));
        decode_attention_fused(masked(fus));
        const std::string what = c.name() + " " + mv.name + (dtype == CacheDtype::BF16 ? " bf16" : " f32");
        expect_close(fus, dec, 1e-6, 1.0, what + ": fused vs decode kernel");
        // The dispatcher's choice: the fused kernel from decode_fused_min_queries(dtype) on.
        const DecodeParams p = masked(via);
        const bool fused = c.Qn >= decode_fused_min_queries(dtype);
        ASSERT_EQ(decode_runs_fused(p), fused) << what;
        decode_forward(p);
        const std::vector<float>& chosen = fused ? fus : dec;
        ASSERT_EQ(0, std::memcmp(via.data(), chosen.data(), chosen.size() * sizeof(float))) << what;
      }
    }
  // Short blocks stay on the decode kernel.
  Problem pb({4, 4, kDecodeFusedMinQueries - 1, 8, 8, {kDecodeFusedMinQueries}}, 1);
  std::vector<float> o;
  EXPECT_FALSE(decode_runs_fused(pb.params(o)));
  EXPECT_FALSE(decode_runs_fused(pb.params(o, CacheDtype::BF16)));
}

TEST(Decode, BitwiseTheSameAtOneAndTwoThreads) {
  // 2 rows x 2 cache heads x 5000 keys: many chunks, merged in order.
  Problem pb({8, 2, 4, 64, 64, {5000, 4321}}, 300);
  ASSERT_GT(pb.c.lengths[0], 4 * decode_chunk_keys(pb.params(pb.out)));
  test::expect_bitwise_at_one_and_two_threads(
      [&](std::vector<float>& o, CacheDtype dtype) { return pb.params(o, dtype); });
}

TEST(Decode, ChunksDependOnShapesOnly) {
  // Shapes only: no data is read by these two.
  DecodeParams p;
  p.B = 1, p.Hq = 4, p.Hkv = 4, p.Qn = 1, p.d = 16, p.dv = 16;
  int64_t n = 40000;
  p.lengths = &n;
  const int64_t C = decode_chunk_keys(p);
  EXPECT_EQ(C % kDecodeTile, 0);
  EXPECT_GE(C, kDecodeMinChunk);
  EXPECT_LE((n + C - 1) / C * 4, kDecodeMaxChunks + 4);  // chunks bounded: so are the partials
  const int64_t bytes = decode_working_bytes(p, 2);
  n = 400000;  // ten times the cache: the working memory stays within 2x
  EXPECT_GT(decode_chunk_keys(p), C);
  EXPECT_LE(decode_working_bytes(p, 2), 2 * bytes);
}

TEST(Decode, BadInputsSayWhatIsWrong) {
  Problem pb({4, 2, 4, 8, 8, {6, 9}}, 500);
  std::vector<float> o;
  auto run = [&](auto edit) {
    DecodeParams p = pb.params(o);
    edit(p);
    decode_attention(p);
  };
  EXPECT_TRUE(mha::test::throws_with([&] { run([](DecodeParams& p) { p.Hkv = 3; }); }, "[decode_attention] heads: q has 4 heads and the cache 3"));
  std::vector<int64_t> too_long = {6, 100};
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](DecodeParams& p) { p.lengths = too_long.data(); }); },
                                "lengths[1]: 100; wanted 0 <= length <= the cache capacity"));
  std::vector<int64_t> too_short = {3, 9};
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](DecodeParams& p) { p.lengths = too_short.data(); }); },
                                "lengths[0]: 3 keys cannot hold the 4 new ones"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](DecodeParams& p) { p.k_stride_j = 4; }); }, "strides"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](DecodeParams& p) { p.v = nullptr; }); }, "null pointer"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](DecodeParams& p) { p.Qn = 0; }); }, "wanted B >= 0, Qn >= 1"));
  std::vector<float> lens = {2.0f, NAN};
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](DecodeParams& p) { p.length_kind = LengthKind::PerBatch; }); },
                                "lens: null with length kind PerBatch/PerQuery"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](DecodeParams& p) { p.length_kind = LengthKind::PerBatch, p.lens = lens.data(); }); },
                                "lens[1]: nan; wanted a number >= 0"));
  std::vector<uint8_t> keep(16, 1);
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](DecodeParams& p) { p.masks.key_keep = keep.data(), p.masks.key_stride_b = 8; }); },
                                "key_stride_b: 8 for row 1 of 9 keys"));
}

}  // namespace
}  // namespace mha::kernels

namespace mha::kernels {
namespace {

// The cached form of the one forward struct (AttentionForward with
// cache.lengths set, what the modules fill): kernels::decode_forward gives
// bit for bit what the flat DecodeParams of the same call gives, for both
// cache formats, with lengths, key masks and a chosen chunk length (the
// chunking is then the caller's and the bits still do not depend on the
// thread count); and the forward entry refuses it.
TEST(Decode, CachedForwardIsTheFlatCall) {
  Problem pb({8, 2, 3, 16, 12, {700, 0, 1100}}, 640);
  const Case& c = pb.c;
  const int64_t cap = pb.capacity;
  std::vector<float> lens = {300.5f, 4.0f, 1e9f};
  std::vector<uint8_t> keep(static_cast<size_t>(pb.B * cap), 1);
  for (size_t x = 0; x < keep.size(); x += 7) keep[x] = 0;
  auto view = [](float* data, int64_t n0, int64_t n1, int64_t n2, int64_t n3, int64_t s0, int64_t s1, int64_t s2) {
    TensorView t;
    t.data = data, t.rank = 4;
    t.shape[0] = n0, t.shape[1] = n1, t.shape[2] = n2, t.shape[3] = n3;
    t.stride[0] = s0, t.stride[1] = s1, t.stride[2] = s2, t.stride[3] = 1;
    return t;
  };
  const int saved = num_threads();
  for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16})
    for (int64_t chunk : {int64_t{0}, int64_t{96}}) {
      std::vector<float> flat, cached, cached2;
      DecodeParams d = pb.params(flat, dtype);
      d.length_kind = LengthKind::PerBatch, d.lens = lens.data();
      d.masks.key_keep = keep.data(), d.masks.key_stride_b = cap;
      d.chunk_keys = chunk;
      decode_forward(d);
      for (std::vector<float>* o : {&cached, &cached2}) {
        set_num_threads(o == &cached ? 1 : 2);
        o->assign(flat.size(), -7.0f);
        AttentionForward p;
        // q as (B, Qn, Hq*d) rows, as Problem lays it out.
        p.q = view(pb.q.data(), pb.B, c.Hq, c.Qn, c.d, c.Qn * c.Hq * c.d, c.d, c.Hq * c.d);
        const bool bf16 = dtype == CacheDtype::BF16;
        p.k = view(bf16 ? nullptr : pb.k.data(), pb.B, c.Hkv, cap, c.d, c.Hkv * cap * c.d, cap * c.d, c.d);
        p.v = view(bf16 ? nullptr : pb.v.data(), pb.B, c.Hkv, cap, c.dv, c.Hkv * cap * c.dv, cap * c.dv, c.dv);
        p.out = view(o->data(), pb.B, c.Hq, c.Qn, c.dv, c.Hq * c.Qn * c.dv, c.Qn * c.dv, c.dv);
        p.cache.lengths = c.lengths.data();
        p.cache.dtype = dtype;
        if (bf16) p.cache.k_bf16 = pb.k16.data(), p.cache.v_bf16 = pb.v16.data();
        p.cache.chunk_keys = chunk;
        p.scale_divisor = std::sqrt(static_cast<float>(c.d));
        p.length_kind = LengthKind::PerBatch, p.lens = lens.data();
        p.masks = causal_masks();
        p.masks.key_keep = keep.data(), p.masks.key_stride_b = cap;
        decode_forward(p);
        EXPECT_TRUE(mha::test::throws_with([&] { (void)attention_forward(AttentionKernel::Fused, p); },
                                      "cache.lengths: set (a cached call)"));
      }
      set_num_threads(saved);
      const std::string what = std::string(dtype == CacheDtype::BF16 ? "bf16" : "f32") + " chunk " + std::to_string(chunk);
      ASSERT_EQ(0, std::memcmp(cached.data(), flat.data(), flat.size() * sizeof(float))) << what;
      ASSERT_EQ(0, std::memcmp(cached2.data(), flat.data(), flat.size() * sizeof(float))) << what << " at 2 threads";
    }
}

TEST(Decode, CachedForwardBadInputsSayWhatIsWrong) {
  Problem pb({4, 2, 4, 8, 8, {6, 9}}, 500);
  const Case& c = pb.c;
  const int64_t cap = pb.capacity;
  std::vector<float> o(static_cast<size_t>(pb.B * c.Hq * c.Qn * c.dv));
  auto run = [&](auto edit) {
    AttentionForward p;
    auto view = [](float* data, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
      TensorView t;
      t.data = data, t.rank = 4;
      t.shape[0] = n0, t.shape[1] = n1, t.shape[2] = n2, t.shape[3] = n3;
      t.stride[3] = 1, t.stride[2] = n3, t.stride[1] = n2 * n3, t.stride[0] = n1 * n2 * n3;
      return t;
    };
    p.q = view(pb.q.data(), pb.B, c.Hq, c.Qn, c.d);
    p.k = view(pb.k.data(), pb.B, c.Hkv, cap, c.d);
    p.v = view(pb.v.data(), pb.B, c.Hkv, cap, c.dv);
    p.out = view(o.data(), pb.B, c.Hq, c.Qn, c.dv);
    p.cache.lengths = c.lengths.data();
    p.masks = causal_masks();
    edit(p);
    decode_forward(p, "test");
  };
  run([](AttentionForward&) {});  // the unedited call runs
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.cache.chunk_keys = 40; }); },
                                "[test] chunk_keys: 40; wanted 0 (the kernel's choice) or a positive multiple of 32"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.k.rank = 3; }); }, "[test] k: rank 3; wanted 4"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.cache.lengths = nullptr; }); },
                                "[test] cache.lengths: null; wanted a cached call"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.cache.dtype = CacheDtype::BF16; }); },
                                "[test] cache: bfloat16 storage with no bfloat16 keys"));
  float w = 0;
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](AttentionForward& p) { p.weights = &w; }); },
                                "[test] a cached call with weights; wanted none of weights"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.v.shape[2] = 3; }); },
                                "[test] shapes: k (2, 2, 14, 8), v (2, 2, 3, 8)"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.out.stride[3] = 2; }); },
                                "[test] strides: an innermost stride other than 1"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.masks.window_left = -2, p.masks.window_right = 0; }); },
                                "[test] masks: window (-2, 0); wanted each side -1 (unbounded) or >= 0"));
  const int64_t offsets[2] = {0, 4};
  EXPECT_TRUE(mha::test::throws_with([&] { run([&](AttentionForward& p) { p.masks.doc_offsets = offsets, p.masks.documents = 1; }); },
                                "[test] masks: doc_offsets set (a packed batch of documents); wanted none: a packed batch is not a cache"));
  EXPECT_TRUE(mha::test::throws_with([&] { run([](AttentionForward& p) { p.k.shape[1] = 3, p.v.shape[1] = 3; }); },
                                "[test] heads: q has 4 heads and the cache 3"));
}

}  // namespace
}  // namespace mha::kernels
