// tests/cpp/kernels/harness.h: every kernel, every direction, on a Case
// (kernels/cases.h), against the reference kernel. In the spirit of ggml's
// test-backend-ops: one description of a call, one runner, one bound per
// direction.
//
// Kernels: Reference (the yardstick), Blas, and Fused on each instruction set
// this CPU supports (forced with set_fused_isa), all through the dispatcher
// (kernels/dispatch.h), as modules call them.
//
// Directions, each compared with one normalised error
//   e = max_i |x_i - ref_i| / (max_i |ref_i| + floor)
// over the whole result, and every element required finite:
//   forward   out:[B,H,Q,dv]                               e <= kForwardBound
//   weights   the forward's p.weights:[B,H,Q,K], and for the fused kernel
//             the weights of a subset of (row, head) pairs recomputed from
//             its statistics by kernels::attention_weights   e <= kWeightsBound
//   backward  grad_q, grad_k, grad_v, each on its own:     e <= kBackwardBound
//             BLAS from the forward's saved weights and recomputing them,
//             fused from its statistics.
// The reference computes in double and rounds once, so e bounds the other
// kernels' own float32 rounding. Floors: 1e-6 for forward and weights (a
// result that is all zeros, e.g. fully masked rows under the zeros policy,
// must come out within 1e-6 of zero); for a gradient, 1e-1 of the largest
// element of the three reference gradients, because where a gradient is
// exactly 0 (a single live key) or small next to the others, float32
// rounding of dO . out, which all three share, leaves ~1e-7 of the largest.
// With ALiBi slopes the forward and weight bounds grow by max|slope|(K+Q)/32
// past 1 (a score of 300 carries float32 rounding of ~2e-5 in every kernel);
// grad_sinks (with sinks) is held to the backward bound with a floor of a
// tenth of its largest element.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/fused/isa.h"
#include "kernels/cases.h"
#include "mha/kernel.h"

namespace mha::kernels::test {

// Float32 rounding of sums of up to a few hundred products: ~32 ulp of the
// largest element (2^-24 ~ 6e-8 each); the worst seen on the families is
// about half of it, in the BLAS and the fused kernels alike.
inline constexpr double kForwardBound = 2e-6;
inline constexpr double kWeightsBound = 2e-6;
// Gradients sum differences (dP - rowsum(dP * P)) that cancel. 5e-6 with the
// floor above keeps every gradient within 5.5e-6 of the largest reference
// gradient element, and each one within 1e-5 of its own largest element
// unless it is under a tenth of the largest of the three.
inline constexpr double kBackwardBound = 5e-6;

// max_i |got_i - want_i| / (max_i |want_i| + floor) over n elements; +inf
// when any element of `got` is not finite. The one closeness measure of the
// kernel tests.
double normalised_error(const float* got, const float* want, int64_t n, double floor = 1e-6);

// One kernel as the runner calls it.
struct KernelUnderTest {
  AttentionKernel kernel;
  FusedIsa isa;  // for Fused: the instruction set forced while it runs
  std::string name;
};
// Blas, then Fused on each instruction set this CPU supports.
std::vector<KernelUnderTest> kernels_under_test();
std::vector<FusedIsa> supported_isas();

// What the runs covered and the worst error seen per direction.
struct Tally {
  int cases = 0, runs = 0;  // runs: (case, kernel, direction) comparisons
  double flops = 0;         // of every kernel call made, by the Case's count
  double worst_forward = 0, worst_weights = 0, worst_backward = 0;
  // Coverage of the draw: cases with grouped heads, dropout, a mask option,
  // and (b, h, q) rows fully masked in the reference's weights.
  int grouped = 0, dropout = 0, masked = 0, with_fully_masked_row = 0;
  int64_t fully_masked_rows = 0;
};

// Runs case c on every kernel and direction; fails (EXPECT) naming the case,
// kernel, direction and error on any result over its bound or not finite.
void run_case(const Case& c, Tally& tally);

// Runs every case, then prints the tally (cases, runs, GFLOP, worst errors).
Tally run_cases(const std::vector<Case>& cases, const char* what);

}  // namespace mha::kernels::test
