// `mha run`: one evaluation-mode forward pass from safetensors files.
//
// weights and inputs files: see model_io.h.
// output file: output (B,Q,D) and attention_weights (B,H,Q,K) as F32; for a
// pruned module H is the kept heads, listed in the metadata's heads_kept.
#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "mha/atomic_file.h"
#include "mha/mha.h"
#include "model_io.h"
#include "outputs.h"

namespace mha::tools {

namespace {

const char* kOp = "run";

struct RunOptions {
  std::string weights, inputs, out;
  int64_t heads = 0;
};

void run(const RunOptions& opt) {
  io::check_output_path(opt.out);  // required: an empty --out is an error, not "off"
  check_outputs(kOp, {{"--out", opt.out}}, {".safetensors"}, {{"--weights", opt.weights}, {"--inputs", opt.inputs}});
  MultiHeadAttention attention = load_attention(opt.weights, opt.heads, kOp);
  const AttentionInputs in = load_inputs(opt.inputs, kOp);
  const Tensor output = attention(in.queries, in.keys, in.values, in.valid_lens);
  const Tensor weights = attention.attention_weights();
  // num_heads: the heads in attention_weights (the kept ones, if pruned).
  std::map<std::string, std::string> meta{{"num_heads", std::to_string(attention.num_heads())}};
  if (attention.num_heads() < attention.original_num_heads())
    meta["heads_kept"] = head_layout_metadata(attention).at("heads_kept");
  save_safetensors(opt.out, {{"output", output}, {"attention_weights", weights}}, meta);
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
  cmd->add_option("--heads", opt->heads,
                  "Number of heads (as built; may be left out if the weights file records it)");
  cmd->callback([opt] { run(*opt); });
}

}  // namespace mha::tools
