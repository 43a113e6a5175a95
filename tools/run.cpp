// `mha run`: one evaluation-mode forward pass from safetensors files.
//
// weights and inputs files: see model_io.h.
// output file: output (B,Q,D) and attention_weights (B,H,Q,K) as F32; for a
// pruned module H is the kept heads, listed in the metadata's heads_kept.
// --parallel heads|sequence|grid runs it over MPI ranks (run_parallel.h).
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include "commands.h"
#include "mha/atomic_file.h"
#include "mha/mha.h"
#include "mask_args.h"
#include "model_io.h"
#include "outputs.h"
#include "run_parallel.h"

namespace mha::tools {

namespace {

const char* kOp = "run";

struct RunOptions {
  std::string weights, inputs, out;
  int64_t heads = 0;
  Parallel parallel = Parallel::None;
  int head_groups = 0;
  std::string precision = "float32";
  MaskArgs masks;
};

#ifndef MHA_TOOL_DIST
// Without mha::dist there is nothing to run the ranks with.
void run_parallel(const ParallelRun&) {
  fail(kOp, "--parallel: this mha was built without MPI (mha::dist is off); install an MPI "
            "(apt-get install libopenmpi-dev openmpi-bin) and rebuild with -DMHA_BUILD_DIST=ON");
}
#endif

void run(const RunOptions& opt) {
  if (opt.head_groups != 0 && opt.parallel != Parallel::Grid)
    fail(kOp, "--head-groups: ", opt.head_groups, " given without --parallel grid, the only split that takes it");
  const Precision precision = parse_precision(kOp, opt.precision);
  if (opt.parallel != Parallel::None) {
    run_parallel({opt.weights, opt.inputs, opt.out, opt.heads, opt.parallel, opt.head_groups, precision,
                  opt.masks.call_masks()});
    return;
  }
  io::check_output_path(opt.out);  // required: an empty --out is an error, not "off"
  check_outputs(kOp, {{"--out", opt.out}}, {".safetensors"}, {{"--weights", opt.weights}, {"--inputs", opt.inputs}});
  MultiHeadAttention attention = load_attention(opt.weights, opt.heads, kOp);
  attention.set_precision(precision);
  const AttentionInputs in = load_inputs(opt.inputs, kOp);
  const Tensor output = attention.forward(in.queries, in.keys, in.values, in.valid_lens, opt.masks.call_masks());
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
                  "Number of heads (as built; may be left out if the weights file records it)")
      ->transform(integer_in(1, std::numeric_limits<int32_t>::max()));
  // By name only: a CheckedTransformer would show its internal numbers in
  // --help and take them as values.
  cmd->add_option_function<std::string>("--parallel", [opt](const std::string& name) {
        opt->parallel = name == "heads" ? Parallel::Heads : name == "sequence" ? Parallel::Sequence : Parallel::Grid;
      },
                  "Run over the ranks of `mpirun -np N`: heads (split by heads), sequence (ring attention "
                  "over blocks of positions) or grid (head groups x sequence blocks); rank 0 writes --out")
      ->transform(CLI::IsMember({"heads", "sequence", "grid"}, CLI::ignore_case));
  cmd->add_option("--head-groups", opt->head_groups,
                  "With --parallel grid: head groups G (G divides the ranks; default: the largest G with "
                  "G*G <= ranks and G <= heads)")
      ->transform(integer_in(1, std::numeric_limits<int32_t>::max()));
  cmd->add_option("--precision", opt->precision,
                  "float32 (default) or bfloat16 (bf16): bfloat16 projections and q, k, v, float32 sums and "
                  "attention (mha/precision.h)");
  add_mask_options(cmd, opt->masks);
  cmd->callback([opt] { run(*opt); });
}

}  // namespace mha::tools
