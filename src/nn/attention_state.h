// src/nn/attention_state.h: what MultiHeadAttention keeps from its last call
// so that attention_weights() can be produced on first access.
//
// A fused forward never forms the (B, h, Q, K) weights. It keeps instead the
// projected q and k (views into the projection buffers, which it owns), the
// lengths, and two floats per (b, head, query): the softmax statistics of
// kernels/softmax_stats.h. The weights of any rows and heads are then one
// score product away: 2*Q*K*d multiply-adds and Q*K exponentials per (row,
// head), about half the forward's attention work, plus the Q*K floats of the
// result. Paths that form the weights anyway (reference, BLAS) store them
// here directly.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "mha/tensor.h"
#include "mha/valid_lens.h"
#include "nn/projections.h"

namespace mha::nn {

struct AttentionState {
  int64_t B = 0, H = 0, Q = 0, K = 0;
  Projected proj;              // q:(B,Q,D) and k:(B,K,D) views (fused path only)
  ValidLens lens;
  float scale_divisor = 1.0f;
  std::vector<float> stats;    // [2,B,H,Q]: row_max2, then row_sum (fused path only)
  Tensor concat;               // (B, Q, D) heads' outputs (W_o's input, backward's `out`)
  // All (B, H, Q, K) weights once `have_all`: set by forward() for the
  // non-fused kernels, else on the first all_weights(). Once the state is
  // published, read and written under `weights_mutex` only.
  mutable std::mutex weights_mutex;
  mutable bool have_all = false;
  mutable Tensor weights;
};

// [B, H, Q, K]: every weight, computed on the first call (thread-safe) and
// returned as a copy.
Tensor all_weights(const AttentionState& s);

// [rows.size(), heads.size(), Q, K]: the weights of those batch rows and
// heads, from `weights` when it holds them all, else by the fused kernel.
// Indices must be valid.
Tensor weights_of(const AttentionState& s, const std::vector<int64_t>& rows,
                  const std::vector<int64_t>& heads);

}  // namespace mha::nn
