// Triggers of docs/errors.md's training rows (see error_catalogue.h):
// AttentionModel, cross_entropy, OffsetPairTask, the optimisers, Trainer and
// checkpoints.
#include <cmath>
#include <filesystem>

#include "error_catalogue.h"

namespace mha::test {

namespace {

// A small model: 9 input tokens, 4 classes, sequences up to 8, D = 8, 2 heads.
ModelConfig small(PositionKind positions = PositionKind::Learned) {
  return {.vocab_size = 9, .num_classes = 4, .max_len = 8, .num_hiddens = 8, .num_heads = 2,
          .positions = positions};
}

AttentionModel model_with(ModelConfig c) { return AttentionModel(c); }

// A checkpoint file with the default config's metadata, `key` set to `value`
// (or removed when value is empty), read back.
void read_with(const std::string& key, const std::string& value) {
  std::map<std::string, std::string> meta = checkpoint_metadata(TrainConfig{}, 0);
  if (value.empty()) meta.erase(key);
  else meta[key] = value;
  const std::string path = temp_path("ck.safetensors");
  save_safetensors(path, {}, meta);
  struct Remove {
    std::string p;
    ~Remove() { std::filesystem::remove(p); }
  } remove{path};
  read_checkpoint(path);
}

// Two parameters "a" (2, 2) and "b" (3,) with gradients, kept alive by the caller.
struct Params {
  Tensor a = ones({2, 2}), ga = ones({2, 2}), b = ones({3}), gb = ones({3});
  ParamList list() { return {{"a", &a, &ga}, {"b", &b, &gb}}; }
};

struct LimitGuard {
  explicit LimitGuard(uint64_t bytes) { set_memory_limit(bytes); }
  ~LimitGuard() { set_memory_limit(0); }
};

TrainConfig train_config() {
  TrainConfig c;
  c.eval_size = 1;
  return c;
}

}  // namespace

Triggers training_triggers() {
  return {
      // AttentionModel
      {"model.vocab_size", [] { ModelConfig c = small(); c.vocab_size = 0; model_with(c); }},
      {"model.layer", [] { AttentionModel m(small()); m.layer(3); }},
      {"model.num_classes", [] { ModelConfig c = small(); c.num_classes = -1; model_with(c); }},
      {"model.max_len", [] { ModelConfig c = small(); c.max_len = 0; model_with(c); }},
      {"model.num_layers", [] { ModelConfig c = small(); c.num_layers = 0; model_with(c); }},
      {"model.memory_limit", [] {
         LimitGuard g(uint64_t{1} << 30);
         ModelConfig c = small();
         c.num_layers = 10000000;
         model_with(c);
       }},
      {"optim.lr_finite", [] {
         Params p;
         optim::Adam(p.list(), {.lr = INFINITY});
       }},
      {"task.memory_limit", [] {
         LimitGuard g(uint64_t{1} << 30);
         Generator gen(0);
         OffsetPairTask({}).sample(1000000000000, gen);
       }},
      {"task.held_out_memory", [] {
         LimitGuard g(uint64_t{1} << 30);
         held_out_set(OffsetPairTask({}), 1000000000000, 0);
       }},
      {"trainer.memory_limit", [] {
         LimitGuard g(uint64_t{1} << 30);
         TrainConfig c = train_config();
         c.batch_size = 1000000000;
         Trainer t(c);
       }},
      {"model.empty", [] { AttentionModel(small()).forward({}, 0, 3); }},
      {"model.too_long", [] { AttentionModel(small()).forward(std::vector<int32_t>(18, 1), 2, 9); }},
      {"model.token_count", [] { AttentionModel(small()).forward({1, 2, 3, 4, 5}, 2, 3); }},
      {"model.token_id", [] { AttentionModel(small()).forward({1, 2, 9, 4, 5, 6}, 2, 3); }},
      {"model.lens", [] { AttentionModel(small()).forward({1, 2, 3, 4, 5, 6}, 2, 3, ValidLens::per_batch({3})); }},
      {"model.backward_no_forward", [] { AttentionModel(small()).backward(ones({2, 3, 4})); }},
      {"model.backward_shape", [] {
         AttentionModel m(small());
         m.forward({1, 2, 3, 4, 5, 6}, 2, 3);
         m.backward(ones({2, 3, 5}));
       }},
      {"model.unexpected", [] {
         AttentionModel m(small(PositionKind::Sinusoidal));
         StateDict s = m.state_dict();
         s["positions.weight"] = ones({8, 8});
         m.load_state_dict(s);
       }},
      {"model.missing", [] {
         AttentionModel m(small());
         StateDict s = m.state_dict();
         s.erase("readout.bias");
         m.load_state_dict(s);
       }},
      {"model.state_shape", [] {
         AttentionModel m(small());
         StateDict s = m.state_dict();
         s["embedding.weight"] = ones({8, 8});
         m.load_state_dict(s);
       }},
      // cross_entropy
      {"loss.classes", [] { cross_entropy(ones({2, 0}), {}); }},
      {"loss.count", [] { cross_entropy(ones({2, 3, 5}), {1, 2, 3}); }},
      {"loss.target", [] { cross_entropy(ones({2, 5}), {1, 7}); }},
      // OffsetPairTask
      {"task.vocab", [] { OffsetPairTask({.vocab = 1}); }},
      {"task.near", [] { OffsetPairTask({.near = 0}); }},
      {"task.far", [] { OffsetPairTask({.near = 3, .far = 3}); }},
      {"task.min_len", [] { OffsetPairTask({.far = 10, .min_len = 10}); }},
      {"task.max_len", [] { OffsetPairTask({.min_len = 12, .max_len = 11}); }},
      {"task.batch", [] {
         Generator gen(0);
         OffsetPairTask({}).sample(0, gen);
       }},
      // optimisers
      {"optim.empty", [] { optim::SGD({}, {}); }},
      {"optim.no_tensor", [] { optim::SGD({{"w", nullptr, nullptr}}, {}); }},
      {"optim.grad_shape", [] {
         Params p;
         optim::Adam({{"a", &p.a, &p.gb}}, {});
       }},
      {"optim.twice", [] {
         Params p;
         optim::Adam({{"a", &p.a, &p.ga}, {"a", &p.b, &p.gb}}, {});
       }},
      {"optim.negative", [] {
         Params p;
         optim::Adam(p.list(), {.eps = -1});
       }},
      {"optim.set_lr", [] {
         Params p;
         optim::SGD(p.list(), {}).set_lr(-0.5);
       }},
      {"optim.dampening", [] {
         Params p;
         optim::SGD(p.list(), {.dampening = NAN});
       }},
      {"optim.nesterov", [] {
         Params p;
         optim::SGD(p.list(), {.momentum = 0.9, .dampening = 0.1, .nesterov = true});
       }},
      {"optim.beta1", [] {
         Params p;
         optim::AdamW(p.list(), {.beta1 = 1.0});
       }},
      {"optim.beta2", [] {
         Params p;
         optim::Adam(p.list(), {.beta2 = -0.1});
       }},
      {"optim.load_steps", [] {
         Params p;
         optim::SGD(p.list(), {}).load_state({}, -1);
       }},
      {"optim.missing_buffer", [] {
         Params p;
         optim::SGD(p.list(), {.momentum = 0.9}).load_state({{"a.momentum_buffer", ones({2, 2})}}, 3);
       }},
      {"optim.buffer_shape", [] {
         Params p;
         optim::SGD(p.list(), {.momentum = 0.9})
             .load_state({{"a.momentum_buffer", ones({2, 2})}, {"b.momentum_buffer", ones({2})}}, 3);
       }},
      {"optim.unexpected_buffer", [] {
         Params p;
         optim::SGD(p.list(), {}).load_state({{"a.momentum_buffer", ones({2, 2})}}, 3);
       }},
      {"optim.norm_type", [] {
         Params p;
         optim::clip_grad_norm(p.list(), 1.0, 1.0);
       }},
      {"optim.max_norm", [] {
         Params p;
         optim::clip_grad_norm(p.list(), -1.0);
       }},
      {"optim.kind", [] {
         Params p;
         make_optimizer({.kind = static_cast<OptimizerKind>(7)}, p.list());
       }},
      // Trainer
      {"trainer.steps", [] { TrainConfig c = train_config(); c.steps = -1; Trainer t(c); }},
      {"trainer.batch", [] { TrainConfig c = train_config(); c.batch_size = 0; Trainer t(c); }},
      {"trainer.eval_every", [] { TrainConfig c = train_config(); c.eval_every = 0; Trainer t(c); }},
      {"trainer.eval_size", [] { TrainConfig c = train_config(); c.eval_size = 0; Trainer t(c); }},
      {"trainer.clip", [] { TrainConfig c = train_config(); c.clip_norm = -1; Trainer t(c); }},
      {"trainer.total_steps", [] { Trainer(train_config()).set_total_steps(-1); }},
      {"trainer.held_out", [] { held_out_set(OffsetPairTask({}), 0, 0); }},
      // checkpoints
      {"ck.format", [] { read_with("format", "mha-checkpoint-0"); }},
      {"ck.task", [] { read_with("task.name", "copy"); }},
      {"ck.missing", [] { read_with("model.num_heads", ""); }},
      {"ck.integer", [] { read_with("model.num_heads", "four"); }},
      {"ck.unsigned", [] { read_with("train.seed", "-1"); }},
      {"ck.number", [] { read_with("optim.lr", "fast"); }},
      {"ck.boolean", [] { read_with("model.bias", "yes"); }},
      {"ck.positions", [] { read_with("model.positions", "rotary"); }},
      {"ck.optimizer", [] { read_with("optim.name", "lion"); }},
      {"ck.step", [] { read_with("train.step", "-1"); }},
      {"ck.name_twice", [] {
         save_checkpoint(temp_path("twice.safetensors"), TrainConfig{}, 0, {{"optim.w.exp_avg", ones({1})}},
                         {{"w.exp_avg", ones({1})}});
       }},
  };
}

}  // namespace mha::test
