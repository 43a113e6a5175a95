// mha/trainer.h: training an AttentionModel on the OffsetPairTask.
//
// One step: draw a batch, forward in training mode, cross-entropy over the
// scored positions, backward, clip the global gradient norm, optimiser step.
// Every random draw is keyed by (seed, step): the batch of step s comes from
// its own generator and each layer's dropout stream is re-keyed per step, so
// the same seed and thread count give the same loss curve bit for bit, and a
// run resumed from a checkpoint continues exactly as if never stopped.
//
//   mha::TrainConfig cfg;                 // defaults: the task's standard setting
//   mha::Trainer trainer(cfg);
//   while (trainer.step_count() < cfg.steps) {
//     mha::TrainPoint p = trainer.step(); // p.loss, p.accuracy, p.held_out_accuracy
//   }
//   trainer.save("model.safetensors");
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mha/model.h"
#include "mha/optim.h"
#include "mha/task.h"

namespace mha {

enum class OptimizerKind { SGD, Adam, AdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Adam;
  double lr = 3e-3;
  double momentum = 0.9;      // SGD
  double dampening = 0.0;     // SGD
  bool nesterov = false;      // SGD
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
  bool amsgrad = false;       // Adam, AdamW
  double weight_decay = 0.0;
};

// The optimiser a config describes, over `params`.
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizerConfig& config, ParamList params);

struct TrainConfig {
  OffsetPairTaskConfig task;
  // vocab_size, num_classes and max_len are taken from the task.
  ModelConfig model{.num_hiddens = 64, .num_heads = 4, .num_layers = 1};
  OptimizerConfig optimizer;
  uint64_t seed = 0;
  int64_t steps = 500;
  int64_t batch_size = 32;
  double clip_norm = 1.0;    // global gradient norm bound; 0 turns clipping off
  int64_t eval_every = 50;   // held-out accuracy every this many steps (and at the last)
  int64_t eval_size = 512;   // held-out sequences, drawn once from held_out_seed
  uint64_t held_out_seed = 0x5EED;  // the same held-out set for every training seed
};

struct TrainPoint {
  int64_t step = 0;                // 1-based
  double loss = 0.0;               // mean cross-entropy of the step's batch
  double accuracy = 0.0;           // of the step's batch, before the update
  double held_out_accuracy = -1.0; // -1 when not evaluated at this step
  double seconds = 0.0;            // wall time since the trainer started (not reproducible)
};

class Trainer {
 public:
  explicit Trainer(const TrainConfig& config);

  TrainPoint step();
  // Accuracy of the current model on the held-out set (evaluation mode).
  double evaluate();

  int64_t step_count() const { return step_; }
  // Changes config().steps (e.g. to train a resumed run further); it must be
  // at least step_count().
  void set_total_steps(int64_t steps);
  const TrainConfig& config() const { return config_; }
  const OffsetPairTask& task() const { return task_; }
  AttentionModel& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const std::vector<TrainPoint>& history() const { return history_; }

  // Model parameters, optimiser state and the whole config (in
  // __metadata__) to a safetensors file; see mha/checkpoint.h.
  void save(const std::string& path) const;
  // A trainer restored from save(): training continues at the saved step.
  // The history restarts empty.
  static std::unique_ptr<Trainer> load(const std::string& path);

 private:
  TrainConfig config_;
  OffsetPairTask task_;
  std::unique_ptr<AttentionModel> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<TokenBatch> held_out_;
  int64_t step_ = 0;
  double start_ = 0.0;
  std::vector<TrainPoint> history_;
};

// `size` sequences drawn from Generator(seed), in batches of at most 256:
// the held-out set a Trainer evaluates on (with seed = held_out_seed).
std::vector<TokenBatch> held_out_set(const OffsetPairTask& task, int64_t size, uint64_t seed);
// The fraction of scored positions whose largest logit is the target, over
// `batches`, with the model in evaluation mode (its mode is restored after).
double evaluate_accuracy(AttentionModel& model, const std::vector<TokenBatch>& batches);

// The model config a task implies: input vocabulary (with padding), classes
// and maximum length from the task, the rest from `model`.
ModelConfig model_config_for(const OffsetPairTask& task, const ModelConfig& model);

}  // namespace mha
