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
#include "run_inputs.h"

namespace mha::tools {

namespace {

struct RunOptions {
  std::string weights, inputs, out;
  int64_t heads = 0;
};

void run(const RunOptions& opt) {
  MultiHeadAttention attention = run_module_from(load_f32_tensors(opt.weights), opt.heads, opt.weights);
  const RunInputs in = run_inputs_from(read_safetensors(opt.inputs), opt.inputs);
  const Tensor output = attention(in.queries, in.keys, in.values, in.valid_lens);
  const Tensor weights = attention.attention_weights();
  save_safetensors(opt.out, {{"output", output}, {"attention_weights", weights}},
                   {{"num_heads", std::to_string(opt.heads)}});
  std::printf("wrote %s: output %s, attention_weights %s\n", opt.out.c_str(),
              shape_str(output.shape()).c_str(),
              shape_str(weights.shape()).c_str());
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
