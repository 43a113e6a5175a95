#include <limits>

#include "mha/error.h"
#include "mha/tensor.h"
#include "test_util.h"

using namespace mha;
using mha::test::throws_with;

TEST(Tensor, RowMajorIndexing) {
  Tensor t({2, 3, 4});
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(i);
  EXPECT_EQ(t.at({1, 2, 3}), 23.0f);
  EXPECT_EQ(t.at({0, 1, 0}), 4.0f);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.numel(), 24);
}

TEST(Tensor, RejectsBadShapesAndIndices) {
  EXPECT_TRUE(throws_with([] { Tensor({2, -1}); }, "negative"));
  EXPECT_TRUE(throws_with([] { Tensor({2, 3}, std::vector<float>(5)); }, "5 values given for shape (2, 3)"));
  Tensor t({2, 3});
  EXPECT_TRUE(throws_with([&] { t.at({2, 0}); }, "out of range"));
  EXPECT_TRUE(throws_with([&] { t.at({0}); }, "rank 2"));
  EXPECT_TRUE(throws_with([&] { t.reshape({4, 2}); }, "cannot reshape (2, 3) to (4, 2)"));
}

TEST(Tensor, ElementCountOverflowIsRejectedBeforeAllocation) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_TRUE(throws_with([&] { checked_numel({big, big}); }, "64 bits"));
  EXPECT_TRUE(throws_with([&] { Tensor({big, big, 4}); }, "64 bits"));
}

TEST(TensorView, SplitHeadsIsTheSeedsTransposeQkv) {
  // (B, L, h*d) viewed as (B, h, L, d): element (b, h, l, c) is column h*d + c.
  const int64_t B = 2, L = 3, H = 4, d = 5;
  Tensor x({B, L, H * d});
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(i);
  TensorView v = x.view().split_heads(H);
  ASSERT_EQ(v.rank, 4);
  EXPECT_EQ(v.shape[1], H);
  EXPECT_EQ(v.shape[2], L);
  EXPECT_EQ(v.shape[3], d);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t c = 0; c < d; ++c) EXPECT_EQ(*v.ptr(b, h, l, c), x.at({b, l, h * d + c}));
}
