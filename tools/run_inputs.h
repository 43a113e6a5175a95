// tools/run_inputs.h: how `mha run` turns its files into a module and inputs.
//
// Kept apart from the command so that the fuzzer (tests/fuzz) and the tests
// feed it bytes directly. Every error is an mha::Error naming "run", the file
// and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "mha/mha.h"

namespace mha::tools {

// queries:[B,Q,Dq] keys:[B,K,Dk] values:[B,K,Dv] and valid_lens none/(B,)/(B,Q).
struct RunInputs {
  Tensor queries, keys, values;
  ValidLens valid_lens;
  int64_t batch() const { return queries.size(0); }
};

// The inputs file of `mha run`, parsed: queries, keys and values as F32,
// valid_lens (optional) as F32, I32 or I64, nothing else. `origin` names the
// file in errors, `op` the command.
RunInputs run_inputs_from(const SafetensorsFile& file, const std::string& origin, const char* op = "run");

// An evaluation-mode module with `heads` heads holding the parameters in
// `state` (W_q.weight (D, Dq) ... W_o.weight (D, D), and four .bias (D,) or
// none); num_hiddens (W_o's rows) and bias are read off the parameters. A
// pruned module's file (mha/prune.h) records in `metadata` its heads as
// built ("num_heads", used when `heads` is 0, else it must agree) and those
// kept ("heads_kept"); its W_q/W_k/W_v are then (kept*d, .), W_o (D, kept*d).
MultiHeadAttention run_module_from(const StateDict& state, int64_t heads, const std::string& origin,
                                   const char* op = "run",
                                   const std::map<std::string, std::string>& metadata = {});

}  // namespace mha::tools
