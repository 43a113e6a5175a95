// kernels::attention_forward decides fused-or-not in one place and tells the
// caller whether it saved statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/fused/limits.h"
#include "kernels/case_data.h"
#include "kernels/dispatch.h"

namespace mha::kernels {
namespace {

TEST(KernelDispatch, TheFusedKernelRunsUpToItsKeyLimit) {
  EXPECT_TRUE(runs_fused(AttentionKernel::Fused, 1));
  EXPECT_TRUE(runs_fused(AttentionKernel::Fused, kFusedMaxKeys));
  EXPECT_FALSE(runs_fused(AttentionKernel::Fused, kFusedMaxKeys + 1));  // float key indices: BLAS
  EXPECT_FALSE(runs_fused(AttentionKernel::Blas, 1));
  EXPECT_FALSE(runs_fused(AttentionKernel::Reference, 1));
}

TEST(KernelDispatch, StatisticsComeBackOnlyFromTheKernelThatSavedThem) {
  Case c;
  c.B = 2, c.H = c.Hkv = 2, c.Q = 5, c.K = 9, c.d = 4, c.dv = 4;
  c.seed = 3;
  const CaseData data(c);
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Blas, AttentionKernel::Fused}) {
    Tensor out = data.new_out();
    std::vector<float> stats(data.new_stats().size(), NAN);
    AttentionForward p = data.forward();
    p.out = out.view().split_heads(c.H);
    const int64_t n = c.B * c.H * c.Q;
    p.stats = {stats.data(), stats.data() + n};
    const SoftmaxStats saved = attention_forward(kernel, p);
    if (kernel == AttentionKernel::Fused) {
      EXPECT_EQ(saved.row_max2, stats.data());
      EXPECT_EQ(saved.row_sum, stats.data() + n);
      for (float x : stats) EXPECT_TRUE(std::isfinite(x));  // written
    } else {
      EXPECT_TRUE(saved.empty());
      for (float x : stats) EXPECT_TRUE(std::isnan(x));  // untouched: nothing to hand a backward
    }
    // Without p.stats nothing comes back, whatever ran.
    p.stats = {};
    EXPECT_TRUE(attention_forward(kernel, p).empty());
  }
}

}  // namespace
}  // namespace mha::kernels
