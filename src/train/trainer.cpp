#include "mha/trainer.h"

#include <algorithm>
#include <chrono>

#include "core/memory.h"
#include "mha/checkpoint.h"
#include "mha/error.h"
#include "mha/loss.h"

namespace mha {

namespace {

// A well-mixed 64-bit key for (seed, step, stream): SplitMix64's finaliser
// applied twice, so neighbouring steps and streams get unrelated keys.
uint64_t mix(uint64_t seed, uint64_t step, uint64_t stream) {
  auto splitmix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  return splitmix(splitmix(seed ^ (stream << 56)) + step);
}

constexpr uint64_t kDataStream = 1, kDropoutStream = 2;
// Held-out batches are drawn and evaluated in chunks of this many sequences.
constexpr int64_t kEvalChunk = 256;

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizerConfig& c, ParamList params) {
  switch (c.kind) {
    case OptimizerKind::SGD:
      return std::make_unique<optim::SGD>(
          std::move(params), optim::SGDOptions{c.lr, c.momentum, c.dampening, c.weight_decay, c.nesterov});
    case OptimizerKind::Adam:
      return std::make_unique<optim::Adam>(
          std::move(params), optim::AdamOptions{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.amsgrad});
    case OptimizerKind::AdamW:
      return std::make_unique<optim::AdamW>(
          std::move(params), optim::AdamOptions{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.amsgrad});
  }
  fail("make_optimizer", "kind: ", static_cast<int>(c.kind), " is not an OptimizerKind (SGD, Adam or AdamW)");
}

ModelConfig model_config_for(const OffsetPairTask& task, const ModelConfig& model) {
  ModelConfig m = model;
  m.vocab_size = task.input_vocab();
  m.num_classes = task.num_classes();
  m.max_len = task.config().max_len;
  return m;
}

// What one training step allocates besides the model (which AttentionModel
// plans itself), by the options that size it, so that a huge --batch or
// --eval-size is refused before anything is allocated: the held-out set, a
// batch, its activations (the projections, attention weights, dropout mask
// and their gradients of every layer) and the optimiser's buffers.
static void plan_training_memory(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  const int64_t D = m.num_hiddens, T = m.max_len, H = m.num_heads, L = m.num_layers, B = c.batch_size;
  core::MemoryPlan plan("Trainer");
  plan.add("held-out set (eval_size x max_len tokens and targets)", {c.eval_size, T}, 12);
  plan.add("a batch's activations (num_layers x batch_size x max_len x num_hiddens)", {L, 16, B, T, D});
  plan.add("a batch's attention weights (num_layers x batch_size x num_heads x max_len^2)", {L, 4, B, H, T, T});
  plan.add("a batch's logits and their gradient (batch_size x max_len x classes)", {3, B, T, m.num_classes});
  const int64_t buffers = c.optimizer.kind == OptimizerKind::SGD ? 1 : c.optimizer.amsgrad ? 3 : 2;
  plan.add("optimiser buffers (num_layers x 4 x num_hiddens^2)", {buffers, L, 4, D, D});
  plan.check();
}

Trainer::Trainer(const TrainConfig& config) : config_(config), task_(config.task) {
  static const char* op = "Trainer";
  if (config.steps < 0) fail(op, "steps: ", config.steps, " is negative");
  if (config.batch_size <= 0) fail(op, "batch_size: ", config.batch_size, " is not positive");
  if (config.eval_every <= 0) fail(op, "eval_every: ", config.eval_every, " is not positive");
  if (config.eval_size <= 0) fail(op, "eval_size: ", config.eval_size, " is not positive");
  if (!(config.clip_norm >= 0.0)) fail(op, "clip_norm: ", config.clip_norm, " is not >= 0");
  config_.model = model_config_for(task_, config.model);
  model_ = std::make_unique<AttentionModel>(config_.model, config.seed);  // plans its parameters itself
  plan_training_memory(config_);
  optimizer_ = make_optimizer(config.optimizer, model_->parameters());
  held_out_ = held_out_set(task_, config.eval_size, config.held_out_seed);
  start_ = now_seconds();
}

TrainPoint Trainer::step() {
  const uint64_t s = static_cast<uint64_t>(step_);
  Generator gen(mix(config_.seed, s, kDataStream));
  const TokenBatch batch = task_.sample(config_.batch_size, gen);
  AttentionModel& model = *model_;
  model.train();
  model.reseed_dropout(mix(config_.seed, s, kDropoutStream));
  model.zero_grad();
  const Tensor logits = model.forward(batch.tokens, batch.batch, batch.length, batch.valid_lens());
  const CrossEntropy ce = cross_entropy(logits, batch.targets);
  model.backward(ce.grad.reshape(logits.shape()));
  if (config_.clip_norm > 0.0) optim::clip_grad_norm(optimizer_->params(), config_.clip_norm);
  optimizer_->step();
  ++step_;

  TrainPoint p;
  p.step = step_;
  p.loss = ce.loss;
  p.accuracy = ce.scored ? static_cast<double>(ce.correct) / static_cast<double>(ce.scored) : 0.0;
  if (step_ % config_.eval_every == 0 || step_ == config_.steps) p.held_out_accuracy = evaluate();
  p.seconds = now_seconds() - start_;
  history_.push_back(p);
  return p;
}

double Trainer::evaluate() { return evaluate_accuracy(*model_, held_out_); }

std::vector<TokenBatch> held_out_set(const OffsetPairTask& task, int64_t size, uint64_t seed) {
  if (size <= 0) fail("held_out_set", "size: ", size, " is not positive");
  core::MemoryPlan("held_out_set")
      .add("sequences (size x max_len tokens and targets, and lengths)", {size, task.config().max_len + 1}, 8)
      .check();
  Generator gen(seed);
  std::vector<TokenBatch> out;
  for (int64_t done = 0; done < size; done += kEvalChunk)
    out.push_back(task.sample(std::min(kEvalChunk, size - done), gen));
  return out;
}

double evaluate_accuracy(AttentionModel& model, const std::vector<TokenBatch>& batches) {
  const bool was_training = model.training();
  model.eval();
  int64_t correct = 0, scored = 0;
  for (const TokenBatch& b : batches) {
    const Tensor logits = model.forward(b.tokens, b.batch, b.length, b.valid_lens());
    const CrossEntropy ce = cross_entropy(logits, b.targets, /*want_grad=*/false);
    correct += ce.correct;
    scored += ce.scored;
  }
  model.train(was_training);
  return scored ? static_cast<double>(correct) / static_cast<double>(scored) : 0.0;
}

void Trainer::set_total_steps(int64_t steps) {
  if (steps < step_)
    fail("Trainer.set_total_steps", "steps: ", steps, " is below the ", step_, " steps already done");
  config_.steps = steps;
}

void Trainer::save(const std::string& path) const {
  save_checkpoint(path, config_, step_, model_->state_dict(), optimizer_->state());
}

std::unique_ptr<Trainer> Trainer::load(const std::string& path) {
  const Checkpoint ck = read_checkpoint(path);
  auto trainer = std::make_unique<Trainer>(ck.config);
  trainer->model_->load_state_dict(ck.model);
  trainer->optimizer_->load_state(ck.optimizer, ck.step);
  trainer->step_ = ck.step;
  return trainer;
}

}  // namespace mha
