// tools/model_io.h: reading a MultiHeadAttention and its inputs from
// safetensors files, shared by `mha run` and `mha viz`.
//
// weights file: W_q.weight (D, Dq), W_k.weight (D, Dk), W_v.weight (D, Dv),
//   W_o.weight (D, D), and the four .bias (D,) when the module has biases.
//   A pruned module's file (mha::save_attention) records its heads as built
//   and those kept in its metadata (mha/prune.h); then W_q/W_k/W_v are
//   (kept*d, .) and W_o (D, kept*d), and --heads may be left out.
// inputs file: queries (B,Q,Dq), keys (B,K,Dk), values (B,K,Dv) as F32 and
//   optionally valid_lens (B,) or (B,Q) as F32, I32 or I64.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mha/mha.h"
#include "run_inputs.h"

namespace mha::tools {

// queries:[B,Q,Dq] keys:[B,K,Dk] values:[B,K,Dv], valid_lens none, [B] or [B,Q].
using AttentionInputs = RunInputs;

// A module in evaluation mode with the file's parameters; num_hiddens comes
// from W_o.weight's rows, biases iff the file has them, heads as built from
// `num_heads` or (when <= 0) the file's metadata, pruned to the file's
// layout. Errors name `op` and the file.
MultiHeadAttention load_attention(const std::string& weights_path, int64_t num_heads, const char* op);

// The inputs file, checked for unexpected tensors (a typo must not be ignored).
AttentionInputs load_inputs(const std::string& path, const char* op);

// The same inputs restricted to batch rows `rows` (in that order), so that
// only they are computed. Every row must be in [0, B).
AttentionInputs select_rows(const AttentionInputs& in, const std::vector<int64_t>& rows);

}  // namespace mha::tools
