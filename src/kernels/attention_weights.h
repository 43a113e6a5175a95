// src/kernels/attention_weights.h: the weights of some (batch row, head)
// pairs, recomputed from the statistics a forward saved.
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] stats:[B,h,Q] -> out:[rows.size(), heads.size(), Q, K]
//
// A module that ran the fused forward keeps two floats per query instead of
// the (B, h, Q, K) weights; a later attention_weights() asks for the pairs it
// wants through kernels::attention_weights (kernels/dispatch.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"

namespace mha::kernels {

struct AttentionWeightsParams {
  // The forward call, as it was made: q, k, lengths, scale and masks, and in
  // fwd.stats the statistics it returned (required). v, out, weights, dropout
  // and read_all_keys are not read: the weights are before dropout.
  AttentionForward fwd;
  std::vector<int64_t> batch_rows;  // each in [0, B)
  std::vector<int64_t> heads;       // each in [0, h)
  float* out = nullptr;             // [rows, heads, Q, K] contiguous
};

}  // namespace mha::kernels
