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

// Which of mha/optim.h's optimisers a training run uses.
enum class OptimizerKind { SGD, Adam, AdamW };

// The optimiser of a training run and all of its settings (each optimiser
// reads the fields that concern it); stored in checkpoints as "optim.*".
struct OptimizerConfig {
  // SGD, Adam or AdamW.
  OptimizerKind kind = OptimizerKind::Adam;
  // Learning rate, >= 0.
  double lr = 3e-3;
  double momentum = 0.9;      // SGD
  double dampening = 0.0;     // SGD
  bool nesterov = false;      // SGD
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
  bool amsgrad = false;       // Adam, AdamW
  // SGD and Adam: L2 penalty on the gradient; AdamW: decoupled decay.
  double weight_decay = 0.0;
};

// The optimiser a config describes, over `params`; throws the optimiser's
// mha::Error for an invalid setting or parameter list.
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizerConfig& config, ParamList params);

// Everything a training run depends on: task, model, optimiser, seed and
// schedule. A checkpoint stores it whole, so a resumed run needs nothing else.
struct TrainConfig {
  // The task the model learns.
  OffsetPairTaskConfig task;
  // vocab_size, num_classes and max_len are taken from the task.
  ModelConfig model{.num_hiddens = 64, .num_heads = 4, .num_layers = 1};
  // The optimiser and its settings.
  OptimizerConfig optimizer;
  // Seeds the initial parameters, every step's batch and dropout masks.
  uint64_t seed = 0;
  // Training steps in all (a resumed run counts the steps already done), >= 0.
  int64_t steps = 500;
  // Sequences per step, > 0.
  int64_t batch_size = 32;
  double clip_norm = 1.0;    // global gradient norm bound; 0 turns clipping off
  int64_t eval_every = 50;   // held-out accuracy every this many steps (and at the last)
  int64_t eval_size = 512;   // held-out sequences, drawn once from held_out_seed
  uint64_t held_out_seed = 0x5EED;  // the same held-out set for every training seed
};

// One training step's numbers, as Trainer::step() returns them.
struct TrainPoint {
  int64_t step = 0;                // 1-based
  double loss = 0.0;               // mean cross-entropy of the step's batch
  double accuracy = 0.0;           // of the step's batch, before the update
  double held_out_accuracy = -1.0; // -1 when not evaluated at this step
  double seconds = 0.0;            // wall time since the trainer started (not reproducible)
};

// Trains an AttentionModel on the offset-pair task, one step() at a time,
// and saves or restores the whole state (see the top of this file).
class Trainer {
 public:
  // A fresh model and optimiser for `config`. Throws mha::Error for a
  // negative steps, a batch_size, eval_every or eval_size that is not
  // positive, a negative clip_norm, or an invalid task, model or optimiser
  // setting (their own checks).
  explicit Trainer(const TrainConfig& config);

  // One training step (see the top of this file), appended to history().
  TrainPoint step();
  // Accuracy of the current model on the held-out set (evaluation mode).
  double evaluate();

  // Steps done so far (including those before a restore).
  int64_t step_count() const { return step_; }
  // Changes config().steps (e.g. to train a resumed run further); it must be
  // at least step_count() (mha::Error otherwise).
  void set_total_steps(int64_t steps);
  // The run's config, the model's sizes filled in from the task.
  const TrainConfig& config() const { return config_; }
  // The task batches are drawn from.
  const OffsetPairTask& task() const { return task_; }
  // The model being trained.
  AttentionModel& model() { return *model_; }
  // The optimiser updating model()'s parameters.
  optim::Optimizer& optimizer() { return *optimizer_; }
  // Every step's numbers since this trainer was made or loaded.
  const std::vector<TrainPoint>& history() const { return history_; }

  // Model parameters, optimiser state and the whole config (in
  // __metadata__) to a safetensors file; see mha/checkpoint.h.
  void save(const std::string& path) const;
  // A trainer restored from save(): training continues at the saved step.
  // The history restarts empty. Throws read_checkpoint's mha::Error for a
  // file that is not a valid checkpoint, and the model's or optimiser's for
  // parameters or buffers that do not fit its config.
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
// Throws mha::Error unless size > 0.
std::vector<TokenBatch> held_out_set(const OffsetPairTask& task, int64_t size, uint64_t seed);
// The fraction of scored positions whose largest logit is the target, over
// `batches`, with the model in evaluation mode (its mode is restored after).
double evaluate_accuracy(AttentionModel& model, const std::vector<TokenBatch>& batches);

// The model config a task implies: input vocabulary (with padding), classes
// and maximum length from the task, the rest from `model`.
ModelConfig model_config_for(const OffsetPairTask& task, const ModelConfig& model);

}  // namespace mha
