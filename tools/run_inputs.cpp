#include "run_inputs.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

namespace mha::tools {

namespace {

// Rows [begin, begin + count) of a 2-D (or 1-D) tensor.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t count) {
  Shape shape = t.shape();
  const int64_t width = t.numel() / shape[0];
  shape[0] = count;
  return Tensor(shape, std::vector<float>(t.data() + begin * width, t.data() + (begin + count) * width));
}

// nn.MultiheadAttention's state dict (torch's state_dict(), or
// mha.TorchMultiheadAttention's, saved as safetensors) as d2l's names. With
// E-wide heads and no bias_k/bias_v it is the same computation as d2l's
// module: in_proj_weight (3E, E) holds W_q, W_k, W_v row-wise (or
// q/k/v_proj_weight when kdim/vdim differ), out_proj.weight is W_o, and
// in_proj_bias / out_proj.bias their biases. Anything else is refused with
// the pointer to the Python drop-in that reads it.
StateDict from_torch_layout(const StateDict& state, const std::string& origin, const char* op) {
  auto refuse = [&](const auto&... what) {
    fail(op, "weights '", origin, "': nn.MultiheadAttention's layout (in_proj_weight, out_proj.weight, ...) ",
         what..., ", which mha run's d2l module cannot hold; load it in Python with "
         "mha.TorchMultiheadAttention.from_safetensors");
  };
  auto get = [&](const char* name) -> const Tensor* {
    auto it = state.find(name);
    return it == state.end() ? nullptr : &it->second;
  };
  if (get("bias_k") || get("bias_v")) refuse("with bias_k and bias_v (add_bias_kv=True)");
  const Tensor* wo = get("out_proj.weight");
  if (!wo || wo->dim() != 2 || wo->size(0) != wo->size(1)) refuse("without a square out_proj.weight (E, E)");
  const int64_t E = wo->size(0);
  StateDict d2l{{"W_o.weight", *wo}};
  if (const Tensor* w = get("in_proj_weight")) {
    if (w->dim() != 2 || w->size(0) != 3 * E)
      refuse("with in_proj_weight of shape ", shape_str(w->shape()), " (grouped key/value heads?) where (",
             3 * E, ", E) is wanted");
    d2l["W_q.weight"] = rows_of(*w, 0, E);
    d2l["W_k.weight"] = rows_of(*w, E, E);
    d2l["W_v.weight"] = rows_of(*w, 2 * E, E);
  } else {
    for (const char* n : {"q", "k", "v"}) {
      const Tensor* w = get((std::string(n) + "_proj_weight").c_str());
      if (!w) refuse("without in_proj_weight or ", n, "_proj_weight");
      d2l[std::string("W_") + n + ".weight"] = *w;
    }
  }
  const Tensor* bin = get("in_proj_bias");
  const Tensor* bout = get("out_proj.bias");
  if (!bin != !bout) refuse("with only one of in_proj_bias and out_proj.bias");
  if (bin) {
    if (bin->dim() != 1 || bin->size(0) != 3 * E)
      refuse("with in_proj_bias of shape ", shape_str(bin->shape()), " where (", 3 * E, ",) is wanted");
    d2l["W_q.bias"] = rows_of(*bin, 0, E);
    d2l["W_k.bias"] = rows_of(*bin, E, E);
    d2l["W_v.bias"] = rows_of(*bin, 2 * E, E);
    d2l["W_o.bias"] = *bout;
  }
  static const char* const kKnown[] = {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                       "in_proj_bias", "out_proj.weight", "out_proj.bias"};
  for (const auto& [name, t] : state)
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown))
      refuse("with an unexpected tensor '", name, "'");
  return d2l;
}

}  // namespace

MultiHeadAttention run_module_from(const StateDict& given, int64_t heads, const std::string& origin,
                                   const char* op, const std::map<std::string, std::string>& metadata) {
  const bool torch_layout = !given.count("W_q.weight") && given.count("out_proj.weight") &&
                            (given.count("in_proj_weight") || given.count("q_proj_weight"));
  const StateDict state = torch_layout ? from_torch_layout(given, origin, op) : given;
  auto wq = state.find("W_q.weight");
  if (wq == state.end()) {
    std::string found;
    for (const auto& [name, t] : state) found += (found.empty() ? "" : ", ") + name;
    fail(op, "weights '", origin, "': no tensor 'W_q.weight' (found: ", found.empty() ? "no tensors" : found,
         "); wanted d2l's W_q/W_k/W_v/W_o.weight, or nn.MultiheadAttention's in_proj_weight and out_proj.weight");
  }
  if (wq->second.dim() != 2)
    fail(op, "weights '", origin, "': W_q.weight has shape ", shape_str(wq->second.shape()),
         ", wanted (num_hiddens, Dq)");
  // The output width: W_o's rows (W_q has fewer once heads are pruned).
  auto wo = state.find("W_o.weight");
  const int64_t num_hiddens = wo != state.end() && wo->second.dim() == 2 ? wo->second.size(0) : wq->second.size(0);
  const bool bias = state.count("W_q.bias") > 0;
  // Heads as built: --heads, or the file's record (mha/prune.h); both must
  // agree. 0 means "not given"; a negative count is wrong whatever the file says.
  if (heads < 0) fail(op, "--heads: ", heads, " is not a positive number of heads");
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
