// head_offsets (mha/inspect.h): on weights built with a known diagonal per
// head, with every kind of valid_lens, and on a model trained on the
// offset-pair task, whose heads must find both of the task's offsets.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mha/mha.h"

namespace mha {
namespace {

// weights:[B,H,T,T] where head h of row b puts all of query t's weight on key
// t - offsets[h] when that key is one of the row's first lens[b], and spreads
// it uniformly over those keys otherwise. Padded queries (t >= lens[b]) put
// all their weight on key 0, which head_offsets must ignore.
Tensor diagonal_weights(const std::vector<int64_t>& offsets, const std::vector<int64_t>& lens, int64_t T) {
  const int64_t B = static_cast<int64_t>(lens.size()), H = static_cast<int64_t>(offsets.size());
  Tensor w({B, H, T, T});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = lens[b], k = t - offsets[h];
        if (t >= n) w.at({b, h, t, 0}) = 1.0f;
        else if (k >= 0 && k < n) w.at({b, h, t, k}) = 1.0f;
        else
          for (int64_t j = 0; j < n; ++j) w.at({b, h, t, j}) = 1.0f / static_cast<float>(n);
      }
  return w;
}

std::vector<float> as_floats(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

TEST(HeadOffsets, FindsEachHeadsDiagonalWithPerBatchLengths) {
  const std::vector<int64_t> offsets{1, 5, 0, -2, 6};
  const std::vector<int64_t> lens{9, 7, 4};
  const int64_t T = 9;
  const HeadOffsets o = head_offsets(diagonal_weights(offsets, lens, T), ValidLens::per_batch(as_floats(lens)));
  EXPECT_EQ(o.min_offset, -(T - 1));
  EXPECT_EQ(o.max_offset, T - 1);
  ASSERT_EQ(o.mean.shape(), (Shape{5, 2 * T - 1}));
  for (size_t h = 0; h < offsets.size(); ++h) {
    EXPECT_EQ(o.offset[h], offsets[h]) << "head " << h;
    // Every query that has a key at that offset puts all its weight there.
    EXPECT_DOUBLE_EQ(o.weight[h], 1.0) << "head " << h;
  }
  // A row of length n has n - |d| pairs at offset d; padded queries add none.
  for (int64_t d = o.min_offset; d <= o.max_offset; ++d) {
    int64_t want = 0;
    for (int64_t n : lens) want += std::max<int64_t>(0, n - std::abs(d));
    EXPECT_EQ(o.pairs[o.index_of(d)], want) << "offset " << d;
  }
  // Offset 6 exists only in the rows of length 9 and 7; the mean is over those pairs alone.
  EXPECT_FLOAT_EQ(o.mean.at({4, o.index_of(6)}), 1.0f);
  // Head 0 (offset 1): query 0 has no key at offset 1 and spreads 1/n over
  // its keys, so offset 0 gets 1/n from each row's query 0 and 0 elsewhere.
  const double at0 = (1.0 / 9 + 1.0 / 7 + 1.0 / 4) / (9 + 7 + 4);
  EXPECT_NEAR(o.mean.at({0, o.index_of(0)}), at0, 1e-7);
}

TEST(HeadOffsets, QueriesBeforeFirstQueryAreLeftOut) {
  // Offset 4, lengths 9 and 6: queries 0..3 have no key at offset 4 and
  // spread their weight; from first_query 4 on, every query has one.
  const std::vector<int64_t> lens{9, 6};
  const Tensor w = diagonal_weights({4}, lens, 9);
  const HeadOffsets all = head_offsets(w, ValidLens::per_batch(as_floats(lens)));
  const HeadOffsets late = head_offsets(w, ValidLens::per_batch(as_floats(lens)), /*first_query=*/4);
  EXPECT_EQ(all.offset[0], 4);
  EXPECT_EQ(late.offset[0], 4);
  for (int64_t d = late.min_offset; d <= late.max_offset; ++d) {
    int64_t want = 0;  // pairs (t, t - d) with 4 <= t < n and 0 <= t - d < n
    for (int64_t n : lens)
      for (int64_t t = 4; t < n; ++t) want += (t - d >= 0 && t - d < n);
    EXPECT_EQ(late.pairs[late.index_of(d)], want) << d;
  }
  // Offset 0 drew 1/n from each row's queries 0..3; none of them is left.
  EXPECT_GT(all.mean.at({0, all.index_of(0)}), 0.0f);
  EXPECT_EQ(late.mean.at({0, late.index_of(0)}), 0.0f);
}

TEST(HeadOffsets, OffsetsNoPairHasAreNaN) {
  const HeadOffsets o = head_offsets(diagonal_weights({2}, {3}, 6), ValidLens::per_batch({3}));
  // Lengths 3 in a 6-long batch: only offsets -2 .. 2 have pairs.
  for (int64_t d = o.min_offset; d <= o.max_offset; ++d) {
    const bool has = std::abs(d) <= 2;
    EXPECT_EQ(o.pairs[o.index_of(d)] > 0, has) << d;
    EXPECT_EQ(std::isnan(o.mean.at({0, o.index_of(d)})), !has) << d;
  }
  EXPECT_EQ(o.offset[0], 2);
}

TEST(HeadOffsets, WithoutValidLensEveryPairCounts) {
  // Q != K: offsets run from -(K-1) to Q-1.
  const int64_t B = 2, H = 3, Q = 3, K = 5;
  Tensor w({B, H, Q, K});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Q; ++t) {
      w.at({b, 0, t, t + 2}) = 1.0f;  // offset -2
      w.at({b, 1, t, 0}) = 1.0f;      // key 0: offset t
      for (int64_t k = 0; k < K; ++k) w.at({b, 2, t, k}) = 0.5f;  // flat (0.5: exact sums): every offset ties
    }
  const HeadOffsets o = head_offsets(w);
  EXPECT_EQ(o.min_offset, -4);
  EXPECT_EQ(o.max_offset, 2);
  EXPECT_EQ(o.offset[0], -2);
  EXPECT_DOUBLE_EQ(o.weight[0], 1.0);
  // Head 1: offset d has queries d..Q-1, of which only query d looks at key 0.
  for (int64_t d = 0; d <= 2; ++d) EXPECT_FLOAT_EQ(o.mean.at({1, o.index_of(d)}), 1.0f / (Q - d));
  EXPECT_EQ(o.offset[1], 2);
  // Head 2 ties everywhere: the smallest offset wins.
  EXPECT_EQ(o.offset[2], -4);
  EXPECT_DOUBLE_EQ(o.weight[2], 0.5);
  EXPECT_EQ(o.pairs[o.index_of(-4)], B * 1);  // only query 0 on key 4
  EXPECT_EQ(o.pairs[o.index_of(0)], B * 3);
}

TEST(HeadOffsets, PerQueryLengthsMaskKeysAndPaddedQueries) {
  // Causal lengths t + 1 in row 0; row 1 is 3 long, its queries 3.. padding (length 0).
  const int64_t T = 5, H = 1;
  std::vector<float> lens{1, 2, 3, 4, 5, 3, 3, 3, 0, 0};
  Tensor w({2, H, T, T});
  for (int64_t t = 0; t < T; ++t) {
    w.at({0, 0, t, std::max<int64_t>(0, t - 3)}) = 1.0f;  // offset 3 when it can, else key 0
    w.at({1, 0, t, t < 3 ? std::max<int64_t>(0, t - 3) : 4}) = 1.0f;  // padded queries: key 4, offset < 0
  }
  const HeadOffsets o = head_offsets(w, ValidLens::per_query(2, T, lens));
  // Row 0: pairs (t, k <= t); row 1: t < 3, k < 3.
  EXPECT_EQ(o.pairs[o.index_of(-1)], 2);  // row 1: (0, 1), (1, 2)
  EXPECT_EQ(o.pairs[o.index_of(0)], 5 + 3);
  EXPECT_EQ(o.pairs[o.index_of(3)], 2);   // row 0: (3, 0), (4, 1)
  EXPECT_EQ(o.pairs[o.index_of(4)], 1);
  // Offset 3: both row-0 pairs carry weight 1; offset 4: query 4 looks at key 1, not 0.
  EXPECT_FLOAT_EQ(o.mean.at({0, o.index_of(3)}), 1.0f);
  EXPECT_FLOAT_EQ(o.mean.at({0, o.index_of(4)}), 0.0f);
  EXPECT_EQ(o.offset[0], 3);
}

TEST(HeadOffsets, BadInputIsRefusedWithTheArgumentNamed) {
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { head_offsets(Tensor({2, 3, 4})); }).find("[head_offsets] weights: shape (2, 3, 4), wanted (B, H, Q, K)"),
            std::string::npos);
  EXPECT_NE(message([] { head_offsets(Tensor({1, 0, 4, 4})); }).find("empty axis"), std::string::npos);
  EXPECT_NE(message([] { head_offsets(Tensor({2, 1, 3, 3}, 0.3f), ValidLens::per_batch({1, 2, 3})); })
                .find("[head_offsets] valid_lens"),
            std::string::npos);
  EXPECT_NE(message([] { head_offsets(Tensor({1, 1, 3, 3}, 0.3f), {}, 3); })
                .find("[head_offsets] first_query: 3 is outside the 3 queries (0 .. 2)"),
            std::string::npos);
  EXPECT_NE(message([] { head_offsets(Tensor({1, 1, 3, 3}, 0.3f), {}, -1); }).find("first_query: -1"),
            std::string::npos);
  EXPECT_NE(message([] { head_offsets(Tensor({1, 1, 3, 3}, 0.3f), ValidLens::per_batch({2}), 2); })
                .find("every query t >= 2"),
            std::string::npos);
  Tensor nan({1, 1, 2, 2}, 0.5f);
  nan.at({0, 0, 1, 0}) = NAN;
  EXPECT_NE(message([&] { head_offsets(nan); }).find("element (0, 0, 1, 0) is nan"), std::string::npos);
  EXPECT_NE(message([] { head_offsets(Tensor({2, 1, 3, 3}, 0.3f), ValidLens::per_batch({0, 0})); })
                .find("every query t >= 0 of the (2, 1, 3, 3) weights is padding"),
            std::string::npos);
}

// Trains the model of mha/trainer.h on the task until its held-out accuracy
// passes 99%, then reads the dominant offsets of its heads on fresh sequences.
HeadOffsets trained_offsets(const OffsetPairTaskConfig& task, uint64_t seed, double* accuracy) {
  TrainConfig cfg;
  cfg.task = task;
  cfg.seed = seed;
  cfg.steps = 600;
  Trainer trainer(cfg);
  *accuracy = 0.0;
  while (trainer.step_count() < cfg.steps && *accuracy < 0.99) {
    const TrainPoint p = trainer.step();
    if (p.held_out_accuracy >= 0) *accuracy = p.held_out_accuracy;
  }
  Generator gen(seed + 1000);
  const TokenBatch b = trainer.task().sample(64, gen);
  AttentionModel& model = trainer.model();
  model.eval();
  model.forward(b.tokens, b.batch, b.length, b.valid_lens());
  // Over the scored queries (t >= far): before them a head has nothing to find.
  return head_offsets(model.layer(0).attention_weights(), b.valid_lens(), task.far);
}

// "Most of the weight": a head that looked at the offset only part of the
// time would not let the model reach 99% accuracy.
constexpr double kSubstantial = 0.5;

void expect_heads_at(const HeadOffsets& o, const OffsetPairTaskConfig& task) {
  std::printf("near %lld, far %lld:", static_cast<long long>(task.near), static_cast<long long>(task.far));
  for (size_t h = 0; h < o.offset.size(); ++h)
    std::printf(" head %zu: offset %lld (%.3f)", h, static_cast<long long>(o.offset[h]), o.weight[h]);
  std::printf("\n");
  for (int64_t want : {task.near, task.far}) {
    bool found = false;
    for (size_t h = 0; h < o.offset.size(); ++h) found |= o.offset[h] == want && o.weight[h] > kSubstantial;
    EXPECT_TRUE(found) << "no head has offset " << want << " with mean weight > " << kSubstantial << " (above)";
  }
}

TEST(HeadOffsets, TrainedHeadsFindBothOffsetsOfTheTask) {
  // The default task (offsets 1 and 10) and another pair, so nothing here
  // depends on the named example.
  for (const OffsetPairTaskConfig& task :
       {OffsetPairTaskConfig{}, OffsetPairTaskConfig{.vocab = 6, .near = 3, .far = 7, .min_len = 9, .max_len = 20}}) {
    double accuracy = 0.0;
    const HeadOffsets o = trained_offsets(task, /*seed=*/1, &accuracy);
    ASSERT_GE(accuracy, 0.99) << "near " << task.near << ", far " << task.far;
    expect_heads_at(o, task);
  }
}

}  // namespace
}  // namespace mha
