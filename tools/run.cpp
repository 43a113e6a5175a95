// `mha run`: one evaluation-mode forward pass from safetensors files.
//
// weights file: W_q.weight (D, Dq), W_k.weight (D, Dk), W_v.weight (D, Dv),
//   W_o.weight (D, D), and the four .bias (D,) when the module has biases.
// inputs file: queries (B,Q,Dq), keys (B,K,Dk), values (B,K,Dv) as F32 and
//   optionally valid_lens (B,) or (B,Q) as F32, I32 or I64.
// output file: output (B,Q,D) and attention_weights (B,H,Q,K) as F32.
#include <cstdio>
#include <string>

#include "commands.h"
#include "mha/mha.h"

namespace mha::tools {

namespace {

struct RunOptions {
  std::string weights, inputs, out;
  int64_t heads = 0;
};

const char* kOp = "run";

void run(const RunOptions& opt) {
  StateDict state = load_f32_tensors(opt.weights);
  auto wq = state.find("W_q.weight");
  if (wq == state.end()) fail(kOp, "weights '", opt.weights, "': no tensor 'W_q.weight'");
  if (wq->second.dim() != 2)
    fail(kOp, "weights '", opt.weights, "': W_q.weight has shape ", shape_str(wq->second.shape()),
         ", wanted (num_hiddens, Dq)");
  const int64_t num_hiddens = wq->second.size(0);
  const bool bias = state.count("W_q.bias") > 0;
  if (opt.heads <= 0) fail(kOp, "--heads: ", opt.heads, " is not a positive number of heads");
  MultiHeadAttention attention(num_hiddens, opt.heads, 0.0f, bias);
  attention.load_state_dict(state);
  attention.eval();

  const SafetensorsFile inputs = read_safetensors(opt.inputs);
  auto input = [&](const char* name) {
    auto it = inputs.tensors.find(name);
    if (it == inputs.tensors.end()) fail(kOp, "inputs '", opt.inputs, "': no tensor '", name, "'");
    return require_f32(it->second, std::string("inputs '") + opt.inputs + "' tensor '" + name + "'");
  };
  const Tensor queries = input("queries"), keys = input("keys"), values = input("values");
  ValidLens valid_lens;
  if (auto it = inputs.tensors.find("valid_lens"); it != inputs.tensors.end()) {
    const DType t = it->second.dtype;
    if (t != DType::F32 && t != DType::I32 && t != DType::I64)
      fail(kOp, "inputs '", opt.inputs, "' tensor 'valid_lens': dtype ", dtype_name(t),
           " where F32, I32 or I64 is wanted");
    valid_lens = ValidLens::from_tensor(to_float_tensor(it->second, "valid_lens"));
  }
  for (const auto& [name, raw] : inputs.tensors)
    if (name != "queries" && name != "keys" && name != "values" && name != "valid_lens")
      fail(kOp, "inputs '", opt.inputs, "': unexpected tensor '", name,
           "' (wanted queries, keys, values and optionally valid_lens)");

  const Tensor output = attention(queries, keys, values, valid_lens);
  save_safetensors(opt.out, {{"output", output}, {"attention_weights", attention.attention_weights()}},
                   {{"num_heads", std::to_string(opt.heads)}});
  std::printf("wrote %s: output %s, attention_weights %s\n", opt.out.c_str(),
              shape_str(output.shape()).c_str(),
              shape_str(attention.attention_weights().shape()).c_str());
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto opt = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Evaluate a MultiHeadAttention on inputs from files");
  cmd->add_option("--weights", opt->weights, "safetensors file with W_q/W_k/W_v/W_o weights")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--inputs", opt->inputs, "safetensors file with queries, keys, values[, valid_lens]")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", opt->out, "safetensors file to write output and attention_weights to")
      ->required();
  cmd->add_option("--heads", opt->heads, "Number of heads")->required();
  cmd->callback([opt] { run(*opt); });
}

}  // namespace mha::tools
