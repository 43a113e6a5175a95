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
std::string str(float x) { return str(static_cast<double>(x)); }
std::string str(PositionKind k) { return k == PositionKind::Learned ? "learned" : "sinusoidal"; }
std::string str(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::SGD: return "sgd";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::AdamW: return "adamw";
  }
  return "?";
}

// field(key, value) for each (key, value) pair of the arguments, in order.
template <class Field, class T, class... Rest>
void each_pair(Field& field, const char* key, T& value, Rest&... rest) {
  field(key, value);
  if constexpr (sizeof...(rest) > 0) each_pair(field, rest...);
}

// Every field of a TrainConfig with its metadata key, one list for writing
// (checkpoint_metadata) and reading (read_checkpoint): field(key, member)
// for each, in this order (a reader names the first bad one).
template <class Config, class Field>
void for_each_field(Config& c, Field&& field) {
  auto& m = c.model;
  auto& t = c.task;
  auto& o = c.optimizer;
  each_pair(field, "model.vocab_size", m.vocab_size, "model.num_classes", m.num_classes, "model.max_len", m.max_len,
            "model.num_hiddens", m.num_hiddens, "model.num_heads", m.num_heads, "model.num_layers", m.num_layers,
            "model.dropout", m.dropout, "model.bias", m.bias, "model.positions", m.positions);
  each_pair(field, "task.vocab", t.vocab, "task.near", t.near, "task.far", t.far, "task.min_len", t.min_len,
            "task.max_len", t.max_len);
  each_pair(field, "optim.name", o.kind, "optim.lr", o.lr, "optim.momentum", o.momentum, "optim.dampening",
            o.dampening, "optim.nesterov", o.nesterov, "optim.beta1", o.beta1, "optim.beta2", o.beta2, "optim.eps",
            o.eps, "optim.amsgrad", o.amsgrad, "optim.weight_decay", o.weight_decay);
  each_pair(field, "train.seed", c.seed, "train.steps", c.steps, "train.batch_size", c.batch_size, "train.clip_norm",
            c.clip_norm, "train.eval_every", c.eval_every, "train.eval_size", c.eval_size, "train.held_out_seed",
            c.held_out_seed);
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

  // A field of for_each_field, parsed by its type.
  void read(const std::string& key, int64_t& v) const { v = integer(key); }
  void read(const std::string& key, uint64_t& v) const { v = unsigned_integer(key); }
  void read(const std::string& key, double& v) const { v = number(key); }
  void read(const std::string& key, float& v) const { v = static_cast<float>(number(key)); }
  void read(const std::string& key, bool& v) const { v = boolean(key); }
  void read(const std::string& key, PositionKind& v) const {
    const std::string& s = text(key);
    if (s == "learned") v = PositionKind::Learned;
    else if (s == "sinusoidal") v = PositionKind::Sinusoidal;
    else bad(key, "learned or sinusoidal");
  }
  void read(const std::string& key, OptimizerKind& v) const {
    const std::string& s = text(key);
    if (s == "sgd") v = OptimizerKind::SGD;
    else if (s == "adam") v = OptimizerKind::Adam;
    else if (s == "adamw") v = OptimizerKind::AdamW;
    else bad(key, "sgd, adam or adamw");
  }
};

}  // namespace

std::map<std::string, std::string> checkpoint_metadata(const TrainConfig& c, int64_t step) {
  std::map<std::string, std::string> meta{
      {"format", kCheckpointFormat}, {"task.name", "offset_pair"}, {"train.step", str(step)}};
  for_each_field(c, [&](const char* key, const auto& value) { meta[key] = str(value); });
  return meta;
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

  for_each_field(ck.config, [&](const char* key, auto& value) { f.read(key, value); });
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
