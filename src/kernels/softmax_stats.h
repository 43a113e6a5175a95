// src/kernels/softmax_stats.h: the two numbers per query row from which a
// forward's softmax weights are recomputed without storing a (Q, K) matrix.
//
// The fused kernel works in base 2 (exp2 is the cheaper vector exponential):
//   t_k      = score_k * log2(e), masked keys at the fill * log2(e)
//   row_max2 = max_k t_k          over the keys the kernel included
//   row_sum  = sum_k 2^(t_k - row_max2)
//   weight_k = 2^(t_k - row_max2) / row_sum
// so that a row of masked keys (every t_k equal to the fill) recomputes to
// exactly uniform weights. With an additive mask the statistics are in
// natural units instead (cpu/fused/fused_job.h says why). A fully masked row
// (kernels/masked_row.h) has row_max2 = -inf, row_sum = 1.
//
// Only the kernel that wrote them can read them back: they are opaque to
// everyone else, and kernels::attention_forward says whether it wrote them.
#pragma once

namespace mha::kernels {

// Where a forward writes its statistics (both set, or both null: not
// wanted), and where the backward and the weights read them back.
struct SoftmaxStats {
  float* row_max2 = nullptr;  // [B,h,Q]
  float* row_sum = nullptr;   // [B,h,Q]

  bool empty() const { return row_max2 == nullptr; }
};

}  // namespace mha::kernels
