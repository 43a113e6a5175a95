#include "run_inputs.h"

#include <cstdlib>

namespace mha::tools {

MultiHeadAttention run_module_from(const StateDict& state, int64_t heads, const std::string& origin,
                                   const char* op, const std::map<std::string, std::string>& metadata) {
  auto wq = state.find("W_q.weight");
  if (wq == state.end()) fail(op, "weights '", origin, "': no tensor 'W_q.weight'");
  if (wq->second.dim() != 2)
    fail(op, "weights '", origin, "': W_q.weight has shape ", shape_str(wq->second.shape()),
         ", wanted (num_hiddens, Dq)");
  // The output width: W_o's rows (W_q has fewer once heads are pruned).
  auto wo = state.find("W_o.weight");
  const int64_t num_hiddens = wo != state.end() && wo->second.dim() == 2 ? wo->second.size(0) : wq->second.size(0);
  const bool bias = state.count("W_q.bias") > 0;
  // Heads as built: --heads, or the file's record (mha/prune.h); both must agree.
  if (auto it = metadata.find("num_heads"); it != metadata.end()) {
    const int64_t recorded = std::atoll(it->second.c_str());
    if (recorded <= 0 || std::to_string(recorded) != it->second)
      fail(op, "weights '", origin, "': metadata 'num_heads' = '", it->second, "' is not a positive integer");
    if (heads > 0 && heads != recorded)
      fail(op, "--heads: ", heads, " differs from the ", recorded, " heads (as built) that weights '", origin,
           "' records");
    heads = recorded;
  }
  if (heads <= 0) fail(op, "--heads: ", heads, " is not a positive number of heads");
  MultiHeadAttention attention(num_hiddens, heads, 0.0f, bias);
  apply_head_layout(attention, metadata, "", "weights '" + origin + "'");
  attention.load_state_dict(state);
  attention.eval();
  return attention;
}

RunInputs run_inputs_from(const SafetensorsFile& file, const std::string& origin, const char* op) {
  auto input = [&](const char* name) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) fail(op, "inputs '", origin, "': no tensor '", name, "'");
    return require_f32(it->second, std::string("inputs '") + origin + "' tensor '" + name + "'");
  };
  RunInputs in;
  in.queries = input("queries");
  in.keys = input("keys");
  in.values = input("values");
  if (auto it = file.tensors.find("valid_lens"); it != file.tensors.end()) {
    const DType t = it->second.dtype;
    if (t != DType::F32 && t != DType::I32 && t != DType::I64)
      fail(op, "inputs '", origin, "' tensor 'valid_lens': dtype ", dtype_name(t),
           " where F32, I32 or I64 is wanted");
    in.valid_lens = ValidLens::from_tensor(to_float_tensor(it->second, "valid_lens"));
  }
  for (const auto& [name, raw] : file.tensors)
    if (name != "queries" && name != "keys" && name != "values" && name != "valid_lens")
      fail(op, "inputs '", origin, "': unexpected tensor '", name,
           "' (wanted queries, keys, values and optionally valid_lens)");
  return in;
}

}  // namespace mha::tools
