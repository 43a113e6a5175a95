#include "mha/checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "mha/error.h"
#include "mha/prune.h"
#include "mha/safetensors.h"

namespace mha {

namespace {

const char* const kOptimPrefix = "optim.";

std::string str(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}
std::string str(int64_t x) { return std::to_string(x); }
std::string str(uint64_t x) { return std::to_string(x); }
std::string str(bool x) { return x ? "true" : "false"; }

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::SGD: return "sgd";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::AdamW: return "adamw";
  }
  return "?";
}

// Reads typed fields of the metadata, naming the file and field on error.
struct Fields {
  const std::map<std::string, std::string>& meta;
  const std::string& path;

  [[noreturn]] void bad(const std::string& key, const char* wanted) const {
    fail("read_checkpoint", "'", path, "': metadata '", key, "' = '", meta.at(key), "' is not ", wanted);
  }
  const std::string& text(const std::string& key) const {
    auto it = meta.find(key);
    if (it == meta.end()) fail("read_checkpoint", "'", path, "': metadata has no '", key, "'");
    return it->second;
  }
  int64_t integer(const std::string& key) const {
    const std::string& s = text(key);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || errno) bad(key, "an integer");
    return v;
  }
  uint64_t unsigned_integer(const std::string& key) const {
    const std::string& s = text(key);
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (s.empty() || s[0] == '-' || *end || errno) bad(key, "an unsigned integer");
    return v;
  }
  double number(const std::string& key) const {
    const std::string& s = text(key);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end) bad(key, "a number");
    return v;
  }
  bool boolean(const std::string& key) const {
    const std::string& s = text(key);
    if (s == "true") return true;
    if (s == "false") return false;
    bad(key, "true or false");
  }
};

}  // namespace

std::map<std::string, std::string> checkpoint_metadata(const TrainConfig& c, int64_t step) {
  const ModelConfig& m = c.model;
  const OffsetPairTaskConfig& t = c.task;
  const OptimizerConfig& o = c.optimizer;
  return {
      {"format", kCheckpointFormat},
      {"model.vocab_size", str(m.vocab_size)}, {"model.num_classes", str(m.num_classes)},
      {"model.max_len", str(m.max_len)}, {"model.num_hiddens", str(m.num_hiddens)},
      {"model.num_heads", str(m.num_heads)}, {"model.num_layers", str(m.num_layers)},
      {"model.dropout", str(static_cast<double>(m.dropout))}, {"model.bias", str(m.bias)},
      {"model.positions", m.positions == PositionKind::Learned ? "learned" : "sinusoidal"},
      {"task.name", "offset_pair"}, {"task.vocab", str(t.vocab)}, {"task.near", str(t.near)},
      {"task.far", str(t.far)}, {"task.min_len", str(t.min_len)}, {"task.max_len", str(t.max_len)},
      {"optim.name", optimizer_name(o.kind)}, {"optim.lr", str(o.lr)},
      {"optim.momentum", str(o.momentum)}, {"optim.dampening", str(o.dampening)},
      {"optim.nesterov", str(o.nesterov)}, {"optim.beta1", str(o.beta1)},
      {"optim.beta2", str(o.beta2)}, {"optim.eps", str(o.eps)}, {"optim.amsgrad", str(o.amsgrad)},
      {"optim.weight_decay", str(o.weight_decay)},
      {"train.seed", str(c.seed)}, {"train.steps", str(c.steps)},
      {"train.batch_size", str(c.batch_size)}, {"train.clip_norm", str(c.clip_norm)},
      {"train.eval_every", str(c.eval_every)}, {"train.eval_size", str(c.eval_size)},
      {"train.held_out_seed", str(c.held_out_seed)}, {"train.step", str(step)},
  };
}

void save_checkpoint(const std::string& path, const TrainConfig& config, int64_t step,
                     const StateDict& model, const std::map<std::string, Tensor>& optimizer) {
  std::map<std::string, Tensor> tensors = model;
  for (const auto& [name, t] : optimizer) {
    const std::string key = kOptimPrefix + name;
    if (tensors.count(key)) fail("save_checkpoint", "tensor name '", key, "' is used twice");
    tensors[key] = t;
  }
  save_safetensors(path, tensors, checkpoint_metadata(config, step));
}

Checkpoint read_checkpoint(const std::string& path) {
  static const char* op = "read_checkpoint";
  const SafetensorsFile file = read_safetensors(path);
  Checkpoint ck;
  ck.metadata = file.metadata;
  const Fields f{ck.metadata, path};
  if (f.text("format") != kCheckpointFormat)
    fail(op, "'", path, "': format '", f.text("format"), "' is not ", kCheckpointFormat);
  if (f.text("task.name") != "offset_pair")
    fail(op, "'", path, "': task.name '", f.text("task.name"), "' is not offset_pair");

  TrainConfig& c = ck.config;
  ModelConfig& m = c.model;
  m.vocab_size = f.integer("model.vocab_size");
  m.num_classes = f.integer("model.num_classes");
  m.max_len = f.integer("model.max_len");
  m.num_hiddens = f.integer("model.num_hiddens");
  m.num_heads = f.integer("model.num_heads");
  m.num_layers = f.integer("model.num_layers");
  m.dropout = static_cast<float>(f.number("model.dropout"));
  m.bias = f.boolean("model.bias");
  const std::string& pos = f.text("model.positions");
  if (pos == "learned") m.positions = PositionKind::Learned;
  else if (pos == "sinusoidal") m.positions = PositionKind::Sinusoidal;
  else f.bad("model.positions", "learned or sinusoidal");

  OffsetPairTaskConfig& t = c.task;
  t.vocab = f.integer("task.vocab");
  t.near = f.integer("task.near");
  t.far = f.integer("task.far");
  t.min_len = f.integer("task.min_len");
  t.max_len = f.integer("task.max_len");

  OptimizerConfig& o = c.optimizer;
  const std::string& name = f.text("optim.name");
  if (name == "sgd") o.kind = OptimizerKind::SGD;
  else if (name == "adam") o.kind = OptimizerKind::Adam;
  else if (name == "adamw") o.kind = OptimizerKind::AdamW;
  else f.bad("optim.name", "sgd, adam or adamw");
  o.lr = f.number("optim.lr");
  o.momentum = f.number("optim.momentum");
  o.dampening = f.number("optim.dampening");
  o.nesterov = f.boolean("optim.nesterov");
  o.beta1 = f.number("optim.beta1");
  o.beta2 = f.number("optim.beta2");
  o.eps = f.number("optim.eps");
  o.amsgrad = f.boolean("optim.amsgrad");
  o.weight_decay = f.number("optim.weight_decay");

  c.seed = f.unsigned_integer("train.seed");
  c.steps = f.integer("train.steps");
  c.batch_size = f.integer("train.batch_size");
  c.clip_norm = f.number("train.clip_norm");
  c.eval_every = f.integer("train.eval_every");
  c.eval_size = f.integer("train.eval_size");
  c.held_out_seed = f.unsigned_integer("train.held_out_seed");
  ck.step = f.integer("train.step");
  if (ck.step < 0) f.bad("train.step", "a step count >= 0");

  for (const auto& [tname, raw] : file.tensors) {
    const Tensor value = require_f32(raw, "'" + path + "' tensor '" + tname + "'");
    if (tname.rfind(kOptimPrefix, 0) == 0) ck.optimizer[tname.substr(std::string(kOptimPrefix).size())] = value;
    else ck.model[tname] = value;
  }
  return ck;
}

std::unique_ptr<AttentionModel> load_model(const Checkpoint& checkpoint) {
  auto model = std::make_unique<AttentionModel>(checkpoint.config.model);
  // A pruned model's layers keep their layouts in the metadata (mha/prune.h).
  apply_model_head_layout(*model, checkpoint.metadata, "checkpoint");
  model->load_state_dict(checkpoint.model);
  model->eval();
  return model;
}

}  // namespace mha
