// Pruned head layouts in safetensors metadata: see mha/prune.h.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "mha/error.h"
#include "mha/prune.h"
#include "mha/safetensors.h"

namespace mha {

namespace {

std::string join(const std::vector<int64_t>& xs) {
  std::string s;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(xs[i]);
  }
  return s;
}

// "a,b,c" of non-negative integers; false if anything else.
bool parse_list(const std::string& s, std::vector<int64_t>* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) return false;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), nullptr, 10);
    if (errno) return false;
    out->push_back(v);
    pos = comma + 1;
  }
  return true;
}

std::string layer_prefix(int64_t l) { return "layers." + std::to_string(l) + "."; }

}  // namespace

Metadata head_layout_metadata(const MultiHeadAttention& m, const std::string& prefix) {
  return {{prefix + "num_heads", std::to_string(m.original_num_heads())},
          {prefix + "heads_kept", join(m.kept_heads())}};
}

std::vector<int64_t> heads_kept_from_metadata(const Metadata& meta, const std::string& prefix,
                                              int64_t num_heads, const std::string& origin) {
  static const char* op = "head layout";
  if (auto it = meta.find(prefix + "num_heads"); it != meta.end() && it->second != std::to_string(num_heads))
    fail(op, origin, ": metadata '", prefix, "num_heads' = '", it->second, "' but the module has ",
         num_heads, " heads as built");
  std::vector<int64_t> kept;
  auto it = meta.find(prefix + "heads_kept");
  if (it == meta.end()) {
    for (int64_t h = 0; h < num_heads; ++h) kept.push_back(h);
    return kept;
  }
  const std::string key = prefix + "heads_kept";
  if (!parse_list(it->second, &kept))
    fail(op, origin, ": metadata '", key, "' = '", it->second,
         "' is not a comma-separated list of head numbers");
  std::set<int64_t> seen;
  for (int64_t h : kept) {
    if (h >= num_heads)
      fail(op, origin, ": metadata '", key, "' = '", it->second, "' names head ", h, "; the module has heads 0 .. ",
           num_heads - 1);
    if (!seen.insert(h).second) fail(op, origin, ": metadata '", key, "' = '", it->second, "' repeats head ", h);
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

void apply_head_layout(MultiHeadAttention& m, const Metadata& meta, const std::string& prefix,
                       const std::string& origin) {
  if (m.num_heads() != m.original_num_heads())
    fail("apply_head_layout", origin, ": the module already has pruned heads (kept ", join(m.kept_heads()), ")");
  const std::vector<int64_t> kept = heads_kept_from_metadata(meta, prefix, m.original_num_heads(), origin);
  std::vector<int64_t> removed;
  for (int64_t h = 0; h < m.original_num_heads(); ++h)
    if (!std::binary_search(kept.begin(), kept.end(), h)) removed.push_back(h);
  m.prune_heads(removed);  // refuses an empty layout
}

void save_attention(const std::string& path, const MultiHeadAttention& m) {
  if (!m.W_q().initialized() || !m.W_o().initialized())
    fail("save_attention", "'", path, "': the module has no parameters yet (call it once or initialize())");
  save_safetensors(path, m.state_dict(), head_layout_metadata(m));
}

MultiHeadAttention load_attention(const std::string& path, int64_t num_heads) {
  static const char* op = "load_attention";
  if (num_heads < 0)
    fail(op, "num_heads: ", num_heads, "; wanted a positive number of heads, or 0 to read it from the file");
  const SafetensorsFile file = read_safetensors(path);
  StateDict state;
  for (const auto& [name, raw] : file.tensors)
    state.emplace(name, require_f32(raw, "'" + path + "' tensor '" + name + "'"));
  auto wo = state.find("W_o.weight");
  if (wo == state.end()) fail(op, "'", path, "': no tensor 'W_o.weight'");
  if (wo->second.dim() != 2)
    fail(op, "'", path, "': W_o.weight has shape ", shape_str(wo->second.shape()),
         ", wanted (num_hiddens, heads * head_dim)");
  int64_t heads = num_heads;
  if (auto it = file.metadata.find("num_heads"); it != file.metadata.end()) {
    char* end = nullptr;
    const long long recorded = std::strtoll(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end || recorded <= 0)
      fail(op, "'", path, "': metadata 'num_heads' = '", it->second, "' is not a positive integer");
    if (heads > 0 && heads != recorded)
      fail(op, "num_heads: ", heads, " given, but '", path, "' records ", recorded, " heads (as built)");
    heads = recorded;
  }
  if (heads <= 0)
    fail(op, "num_heads: ", heads, " is not a positive number of heads, and '", path,
         "' does not record its heads");
  MultiHeadAttention m(wo->second.size(0), heads, 0.0f, state.count("W_o.bias") > 0);
  apply_head_layout(m, file.metadata, "", "'" + path + "'");
  m.load_state_dict(state);
  m.eval();
  return m;
}

Metadata model_head_layout_metadata(const AttentionModel& model) {
  Metadata meta;
  for (int64_t l = 0; l < model.num_layers(); ++l) meta.merge(head_layout_metadata(model.layer(l), layer_prefix(l)));
  return meta;
}

void apply_model_head_layout(AttentionModel& model, const Metadata& meta, const std::string& origin) {
  for (int64_t l = 0; l < model.num_layers(); ++l)
    apply_head_layout(model.layer(l), meta, layer_prefix(l), origin);
}

void prune_model_heads(AttentionModel& model, const std::vector<std::pair<int64_t, int64_t>>& heads) {
  std::vector<std::vector<int64_t>> per_layer(static_cast<size_t>(model.num_layers()));
  for (size_t i = 0; i < heads.size(); ++i) {
    const auto [l, h] = heads[i];
    if (l < 0 || l >= model.num_layers())
      fail("prune_model_heads", "heads: entry ", i, " is (layer ", l, ", head ", h, "); the model has layers 0 .. ",
           model.num_layers() - 1);
    per_layer[static_cast<size_t>(l)].push_back(h);
  }
  // Each layer's list is tried on a copy first, so a bad entry anywhere
  // leaves every layer as it was.
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    if (per_layer[static_cast<size_t>(l)].empty()) continue;
    MultiHeadAttention trial = model.layer(l);
    try {
      trial.prune_heads(per_layer[static_cast<size_t>(l)]);
    } catch (const Error& e) {
      fail("prune_model_heads", "layer ", l, ": ", e.what());
    }
  }
  for (int64_t l = 0; l < model.num_layers(); ++l) model.layer(l).prune_heads(per_layer[static_cast<size_t>(l)]);
}

void save_model_checkpoint(const std::string& path, const TrainConfig& config, int64_t step,
                           const AttentionModel& model) {
  Metadata meta = checkpoint_metadata(config, step);
  meta.merge(model_head_layout_metadata(model));
  save_safetensors(path, model.state_dict(), meta);
}

}  // namespace mha
