// Every kernel (BLAS, fused on each instruction set) against the reference,
// forward, weights and backward, on the case families of kernels/cases.h
// (harness.h has the runner and the bounds). These replace the per-file
// "kernel vs reference" loops the kernel tests had; each family below says
// what it covers, and the random draw asserts that it exercises what it
// claims to.
#include <gtest/gtest.h>

#include "harness.h"
#include "kernels/cases.h"

namespace mha::kernels::test {
namespace {

// Tile edges: lengths one off every instruction set's query and key tiles,
// odd widths, dv != d, each kind of length, dropout.
TEST(KernelCases, TileEdges) {
  const Tally t = run_cases(tile_edge_cases(), "tile edges");
  EXPECT_EQ(t.cases, 90);
}

// Small Q x K grid, the backward's classic sweep.
TEST(KernelCases, BackwardGrid) {
  const Tally t = run_cases(backward_grid_cases(), "backward grid");
  EXPECT_EQ(t.cases, 96);
}

// Each mask option, grouped heads and dropout alone, with each kind of length.
TEST(KernelCases, EveryOptionAlone) {
  const Tally t = run_cases(single_option_cases(), "every option alone");
  EXPECT_EQ(t.cases, 36);
  EXPECT_GT(t.fully_masked_rows, 0);
}

// Named shapes: more than one tile each way, zero lengths.
TEST(KernelCases, Named) {
  const Tally t = run_cases(named_cases(), "named");
  EXPECT_EQ(t.cases, 7);
}

// Random shapes with every option combination, in four parts so that ctest
// runs them side by side. Each part must exercise grouped heads, dropout,
// masks and fully masked rows.
class RandomKernelCases : public ::testing::TestWithParam<int> {};

TEST_P(RandomKernelCases, MatchTheReference) {
  const int part = GetParam();
  const Tally t = run_cases(random_cases(0x5eed0000u + static_cast<uint64_t>(part), 150),
                            ("random part " + std::to_string(part)).c_str());
  EXPECT_EQ(t.cases, 150);
  EXPECT_GT(t.grouped, 50);
  EXPECT_GT(t.dropout, 40);
  EXPECT_GT(t.masked, 100);
  EXPECT_GT(t.fully_masked_rows, 100);
  EXPECT_GT(t.with_fully_masked_row, 30);
}

INSTANTIATE_TEST_SUITE_P(Parts, RandomKernelCases, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace mha::kernels::test
