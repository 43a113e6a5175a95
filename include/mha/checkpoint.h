// mha/checkpoint.h: training checkpoints as safetensors files.
//
// Tensors: the model's parameters under their names ("embedding.weight",
// "layers.0.W_q.weight", ...) and the optimiser's buffers under
// "optim.<parameter>.<buffer>" ("optim.readout.weight.exp_avg").
// __metadata__ (all strings): "format" = "mha-checkpoint-1", then every field
// of the training config as "model.*", "task.*", "optim.*" and "train.*"
// (e.g. "model.num_heads" = "4", "optim.name" = "adam", "train.step" = "900").
// Doubles are written with 17 significant digits, so they read back exactly.
//
//   mha::Checkpoint ck = mha::read_checkpoint("model.safetensors");
//   std::unique_ptr<mha::AttentionModel> model = mha::load_model(ck);   // eval mode
//   mha::OffsetPairTask task(ck.config.task);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "mha/multihead.h"
#include "mha/trainer.h"

namespace mha {

// The "format" metadata value of every checkpoint this version writes;
// read_checkpoint refuses any other.
inline constexpr const char* kCheckpointFormat = "mha-checkpoint-1";

// A checkpoint as read_checkpoint returns it: the training config, the step
// reached, the model's parameters and the optimiser's state buffers.
struct Checkpoint {
  TrainConfig config;     // model config complete (vocab, classes, max_len filled)
  int64_t step = 0;       // training steps done
  StateDict model;        // parameters by name
  std::map<std::string, Tensor> optimizer;  // buffers by "<parameter>.<buffer>"
  std::map<std::string, std::string> metadata;  // as stored
};

// The metadata describing a training config and the step reached.
std::map<std::string, std::string> checkpoint_metadata(const TrainConfig& config, int64_t step);

// Writes `model` (parameters by name), `optimizer` (buffers by
// "<parameter>.<buffer>", stored as "optim.<parameter>.<buffer>") and the
// metadata of (config, step) to `path`, atomically (the old file stays on any
// error). Throws mha::Error when an optimiser buffer's stored name collides
// with a parameter's, or when the file cannot be written.
void save_checkpoint(const std::string& path, const TrainConfig& config, int64_t step,
                     const StateDict& model, const std::map<std::string, Tensor>& optimizer);

// Reads and checks a checkpoint: the format tag, every config field present
// and well formed, every tensor F32. Throws mha::Error naming the file and
// the field otherwise (and the safetensors reader's errors for a file that
// is not a readable safetensors file).
Checkpoint read_checkpoint(const std::string& path);

// The checkpoint's model with its parameters, in evaluation mode. Throws
// mha::Error when the config is invalid (AttentionModel's checks) or a
// parameter is missing, unexpected or misshapen (load_state_dict's).
std::unique_ptr<AttentionModel> load_model(const Checkpoint& checkpoint);

}  // namespace mha
