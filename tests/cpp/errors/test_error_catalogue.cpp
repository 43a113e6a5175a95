// Walks docs/errors.md, the catalogue of every error mha reports, through the
// C++ API: each row that lists C++ has a trigger here, and the trigger's
// mha::Error has the row's message (placeholders like <file> match any text).
// tests/python/test_error_catalogue.py does the same for Python and the CLI.
// The triggers of the newer parts (training, PyTorch drop-in, pictures) are
// in test_error_catalogue_{training,torch,plot,cache}.cpp, declared in
// error_catalogue.h.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "error_catalogue.h"
#include "mha/mha.h"
#include "run_inputs.h"

namespace {

using namespace mha;
namespace fs = std::filesystem;

struct Row {
  std::string id, message;
  std::set<std::string> surfaces;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Rows of the tables in docs/errors.md: | `id` | `message` | surfaces | cause |
std::vector<Row> read_catalogue() {
  std::ifstream in(std::string(MHA_SOURCE_DIR) + "/docs/errors.md");
  std::vector<Row> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream ls(line.substr(1));
    while (std::getline(ls, cell, '|')) cells.push_back(trim(cell));
    if (cells.size() < 3) continue;
    auto unquote = [](const std::string& s) { return s.size() >= 2 ? s.substr(1, s.size() - 2) : s; };
    Row r{unquote(cells[0]), unquote(cells[1]), {}};
    std::istringstream ss(cells[2]);
    std::string s;
    while (std::getline(ss, s, ',')) r.surfaces.insert(trim(s));
    rows.push_back(r);
  }
  return rows;
}

// `pattern` with each <placeholder> matching any non-empty text.
bool message_matches(const std::string& pattern, const std::string& got) {
  std::string re;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '<') {
      const size_t end = pattern.find('>', i);
      if (end != std::string::npos && end > i + 1 &&
          pattern.find_first_of(" <", i + 1) > end) {  // <word>, not "a < b"
        re += ".+?";
        i = end;
        continue;
      }
    }
    if (std::string("\\^$.|?*+()[]{}").find(pattern[i]) != std::string::npos) re += '\\';
    re += pattern[i];
  }
  return std::regex_match(got, std::regex(re));
}

std::vector<uint8_t> st_bytes(const std::string& header, size_t data_bytes, bool pad = true) {
  std::string h = header;
  while (pad && (8 + h.size()) % 8) h.push_back(' ');
  std::vector<uint8_t> out(8 + h.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  std::copy(h.begin(), h.end(), out.begin() + 8);
  return out;
}
void parse(const std::vector<uint8_t>& b) { parse_safetensors(b.data(), b.size(), "f.safetensors"); }
void parse_header(const std::string& header, size_t data_bytes = 0) { parse(st_bytes(header, data_bytes)); }
std::vector<uint8_t> raw_header(uint64_t len, const std::string& text) {
  std::vector<uint8_t> out(8 + text.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  std::copy(text.begin(), text.end(), out.begin() + 8);
  return out;
}

struct LimitGuard {
  explicit LimitGuard(uint64_t bytes) { set_memory_limit(bytes); }
  ~LimitGuard() { set_memory_limit(0); }
};

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("mha_errors_" + std::to_string(getpid()) + "_" + name)).string();
}

Tensor ones(Shape s) { return Tensor(std::move(s), 1.0f); }

StateDict state(int64_t D, int64_t in, bool bias) {
  StateDict s;
  for (const char* n : {"W_q", "W_k", "W_v", "W_o"}) {
    s[std::string(n) + ".weight"] = ones({D, std::string(n) == "W_o" ? D : in});
    if (bias) s[std::string(n) + ".bias"] = ones({D});
  }
  return s;
}

void forward(Tensor q, Tensor k, Tensor v, ValidLens lens = {}) {
  MultiHeadAttention m(100, 5, 0.5f);
  m(q, k, v, lens);
}

std::map<std::string, std::function<void()>> core_triggers() {
  const Tensor X = ones({2, 4, 100}), Y = ones({2, 6, 100});
  return {
      // MultiHeadAttention
      {"mha.num_heads", [] { MultiHeadAttention(10, 0); }},
      {"mha.num_hiddens", [] { MultiHeadAttention(-4, 2); }},
      {"mha.divisible", [] { MultiHeadAttention(10, 3); }},
      {"mha.dropout", [] { MultiHeadAttention(10, 2, 1.5f); }},
      {"forward.rank", [=] { forward(ones({2, 4}), Y, Y); }},
      {"forward.keys_batch", [=] { forward(X, ones({3, 6, 100}), ones({3, 6, 100})); }},
      {"forward.values_batch", [=] { forward(X, Y, ones({1, 6, 100})); }},
      {"forward.values_positions", [=] { forward(X, Y, ones({2, 5, 100})); }},
      {"forward.no_keys", [=] { forward(X, ones({2, 0, 100}), ones({2, 0, 100})); }},
      {"forward.no_features", [=] { forward(ones({2, 4, 0}), Y, Y); }},
      {"forward.width", [=] {
         MultiHeadAttention m(100, 5);
         m(X, Y, Y);
         m(X, ones({2, 6, 50}), Y);
       }},
      {"mha.memory_limit", [] {
         LimitGuard g(uint64_t{1} << 30);
         MultiHeadAttention(int64_t{1} << 31, int64_t{1} << 31);
       }},
      {"forward.overflow_values", [] {
         MultiHeadAttention m(100, 5);
         const Tensor x({2, 4, 100}, 1e20f);
         m(x, x, x);
       }},
      {"attn.rank", [] { attention(ones({4, 3, 8}), ones({1, 2, 5, 8}), ones({1, 2, 5, 6})); }},
      {"attn.k_shape", [] { attention(ones({1, 4, 3, 8}), ones({1, 2, 5, 7}), ones({1, 2, 5, 6})); }},
      {"attn.v_shape", [] { attention(ones({1, 4, 3, 8}), ones({1, 2, 5, 8}), ones({1, 2, 4, 6})); }},
      {"attn.heads", [] { attention(ones({1, 4, 3, 8}), ones({1, 3, 5, 8}), ones({1, 3, 5, 6})); }},
      {"attn.no_keys", [] { attention(ones({1, 4, 3, 8}), ones({1, 2, 0, 8}), ones({1, 2, 0, 6})); }},
      {"attn.no_features", [] { attention(ones({1, 4, 3, 0}), ones({1, 2, 5, 0}), ones({1, 2, 5, 6})); }},
      {"attn.scale", [] {
         AttentionOptions o;
         o.scale = -1.0f;
         attention(ones({1, 4, 3, 8}), ones({1, 2, 5, 8}), ones({1, 2, 5, 6}), o);
       }},
      {"attn.scale_range", [] {
         AttentionOptions o;
         o.scale = 1e-45f;
         attention(ones({1, 4, 3, 8}), ones({1, 2, 5, 8}), ones({1, 2, 5, 6}), o);
       }},
      {"attn.overflow", [] {
         attention(Tensor({1, 4, 3, 8}, 1e20f), Tensor({1, 2, 5, 8}, 1e20f), ones({1, 2, 5, 6}));
       }},
      {"dpa.no_features", [] { DotProductAttention().forward(ones({2, 4, 0}), ones({2, 6, 0}), ones({2, 6, 3})); }},
      {"dpa.overflow", [] {
         DotProductAttention().forward(Tensor({2, 4, 2}, 1e20f), Tensor({2, 6, 2}, 1e20f), ones({2, 6, 3}));
       }},
      {"read.nul", [] { read_safetensors(std::string("a\0b", 3)); }},
      {"write.nul", [] { save_safetensors(std::string("a\0b", 3), {}); }},
      {"write.not_regular", [] {
         const std::string target = temp_path("target"), link = temp_path("link");
         std::ofstream(target).put('x');
         fs::remove(link);
         fs::create_symlink(target, link);
         struct Remove {
           std::string a, b;
           ~Remove() { fs::remove(a), fs::remove(b); }
         } remove{target, link};
         save_safetensors(link, {});
       }},
      {"forward.overflow", [] {
         const int64_t h = int64_t{1} << 24;
         MultiHeadAttention m(h, h);
         m.set_kernel(AttentionKernel::Blas);  // the kernels that form the weights in forward()
         const Tensor x = ones({1, int64_t{1} << 20, 1});
         m(x, x, x);
       }},
      {"forward.memory_limit", [] {
         MultiHeadAttention m(8, 2);
         m.set_kernel(AttentionKernel::Blas);
         const Tensor q = ones({1, 1024, 4}), kv = ones({1, 1024, 3});
         LimitGuard g(1 << 20);
         m(q, kv, kv);
       }},
      {"weights.memory_limit", [] {
         MultiHeadAttention m(8, 2);  // fused: the weights are formed on first access
         const Tensor q = ones({1, 1024, 4}), kv = ones({1, 1024, 3});
         LimitGuard g(1 << 20);
         m(q, kv, kv);
         m.attention_weights();
       }},
      {"weights.no_call", [] { MultiHeadAttention(8, 2).attention_weights({0}, {0}); }},
      {"weights.row", [] {
         MultiHeadAttention m(8, 2);
         m(ones({2, 3, 4}), ones({2, 3, 4}), ones({2, 3, 4}));
         m.attention_weights({2}, {0});
       }},
      {"weights.head", [] {
         MultiHeadAttention m(8, 2);
         m(ones({2, 3, 4}), ones({2, 3, 4}), ones({2, 3, 4}));
         m.attention_weights({0}, {-1});
       }},
      {"threads.count", [] { set_num_threads(0); }},
      {"lens.batch", [=] { forward(X, Y, Y, ValidLens::per_batch({1, 2, 3})); }},
      {"lens.query", [=] { forward(X, Y, Y, ValidLens::per_query(2, 3, {1, 1, 1, 1, 1, 1})); }},
      {"lens.nan", [=] { forward(X, Y, Y, ValidLens::per_batch({NAN, 2})); }},
      {"lens.negative", [=] { forward(X, Y, Y, ValidLens::per_batch({3, -1})); }},
      {"lens.per_query", [] { ValidLens::per_query(2, 2, {1, 2, 3}); }},
      {"lens.rank", [] { ValidLens::from_tensor(ones({2, 2, 1})); }},
      // load_state_dict
      {"state.unexpected", [] { MultiHeadAttention(8, 2).load_state_dict(state(8, 4, true)); }},
      {"state.missing", [] {
         StateDict s = state(8, 4, false);
         s.erase("W_o.weight");
         MultiHeadAttention(8, 2).load_state_dict(s);
       }},
      {"state.weight_shape", [] {
         StateDict s = state(8, 4, false);
         s["W_o.weight"] = ones({8, 7});
         MultiHeadAttention(8, 2).load_state_dict(s);
       }},
      {"state.weight_initialised", [] {
         MultiHeadAttention m(8, 2);
         m.load_state_dict(state(8, 4, false));
         m.load_state_dict(state(8, 5, false));
       }},
      {"state.bias_shape", [] {
         StateDict s = state(8, 4, true);
         s["W_k.bias"] = ones({7});
         MultiHeadAttention(8, 2, 0.0f, true).load_state_dict(s);
       }},
      // masked_softmax, DotProductAttention
      {"softmax.rank", [] { masked_softmax(ones({4, 6})); }},
      {"dpa.dropout", [] { DotProductAttention(-0.1f); }},
      {"dpa.queries_rank", [] { DotProductAttention().forward(ones({4, 2}), ones({2, 6, 2}), ones({2, 6, 3})); }},
      {"dpa.keys_rank", [] { DotProductAttention().forward(ones({2, 4, 2}), ones({6, 2}), ones({2, 6, 3})); }},
      {"dpa.values_rank", [] { DotProductAttention().forward(ones({2, 4, 2}), ones({2, 6, 2}), ones({6, 3})); }},
      {"dpa.keys_shape", [] { DotProductAttention().forward(ones({2, 4, 2}), ones({2, 6, 3}), ones({2, 6, 3})); }},
      {"dpa.values_shape", [] { DotProductAttention().forward(ones({2, 4, 2}), ones({2, 6, 2}), ones({2, 5, 3})); }},
      {"dpa.no_keys", [] { DotProductAttention().forward(ones({2, 4, 2}), ones({2, 0, 2}), ones({2, 0, 3})); }},
      // LazyLinear
      {"linear.out_features", [] { LazyLinear(0, false); }},
      {"linear.in_features", [] {
         Generator g;
         LazyLinear(8, false).initialize(0, g);
       }},
      {"linear.width", [] {
         Generator g;
         LazyLinear l(8, false);
         l.initialize(4, g);
         l.initialize(5, g);
       }},
      {"linear.scalar", [] {
         Generator g;
         LazyLinear(8, false).forward(Tensor(), g);
       }},
      {"linear.set_weight", [] { LazyLinear(8, false).set_weight(ones({3, 4})); }},
      {"linear.set_weight_initialised", [] {
         LazyLinear l(8, false);
         l.set_weight(ones({8, 4}));
         l.set_weight(ones({8, 5}));
       }},
      {"linear.no_bias", [] { LazyLinear(8, false).set_bias(ones({8})); }},
      {"linear.bias_shape", [] { LazyLinear(8, true).set_bias(ones({3})); }},
      // Tensor
      {"tensor.negative", [] { Tensor({2, -1}); }},
      {"tensor.overflow", [] { Tensor({int64_t{1} << 40, int64_t{1} << 40}); }},
      {"tensor.bytes_overflow", [] { Tensor({int64_t{1} << 31, int64_t{1} << 31}); }},
      {"tensor.memory_limit", [] {
         LimitGuard g(1 << 20);
         Tensor({1024, 1024});
       }},
      {"tensor.values", [] { Tensor({2, 2}, std::vector<float>{1, 2, 3}); }},
      {"tensor.size", [] { ones({2, 4, 6}).size(3); }},
      {"tensor.at_rank", [] { ones({2, 4, 6}).at({1, 1}); }},
      {"tensor.at_range", [] { ones({2, 4, 6}).at({1, 5, 0}); }},
      {"tensor.reshape", [] { ones({2, 3}).reshape({4, 2}); }},
      {"tensor.view", [] { ones({1, 1, 1, 1, 1}).view(); }},
      // safetensors reading
      {"st.short", [] { parse({1, 2, 3}); }},
      {"st.header_limit", [] { parse(raw_header(uint64_t{1} << 40, "{}")); }},
      {"st.other_kind", [] { parse({'P', 'K', 3, 4, 20, 0, 0, 0, 0, 0}); }},
      {"st.header_past_end", [] { parse(raw_header(64, "{}")); }},
      {"st.header_tiny", [] { parse(raw_header(1, "{")); }},
      {"st.json", [] { parse(raw_header(9, "{not json")); }},
      {"st.object", [] { parse(raw_header(2, "[]")); }},
      {"st.metadata_object", [] { parse_header(R"({"__metadata__":[1]})"); }},
      {"st.metadata_string", [] { parse_header(R"({"__metadata__":{"n":1}})"); }},
      {"st.entry_object", [] { parse_header(R"({"a":[]})"); }},
      {"st.dtype_missing", [] { parse_header(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4); }},
      {"st.shape_missing", [] { parse_header(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4); }},
      {"st.offsets_missing", [] { parse_header(R"({"a":{"dtype":"F32","shape":[1]}})", 4); }},
      {"st.dtype", [] { parse_header(R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1); }},
      {"st.shape_entry", [] { parse_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4); }},
      {"st.dimension", [] {
         parse_header(R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]}})", 1);
       }},
      {"st.offset_entry", [] { parse_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", 4); }},
      {"st.offsets_order", [] { parse_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4); }},
      {"st.past_end", [] {
         parse_header(R"({"w":{"dtype":"F32","shape":[274877906944],"data_offsets":[0,1099511627776]}})", 4);
       }},
      {"st.shape_overflow", [] {
         parse_header(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
       }},
      {"st.size", [] { parse_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8); }},
      {"st.hole", [] { parse_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8); }},
      {"st.cover", [] { parse_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8); }},
      {"st.metadata_name", [] { serialize_safetensors({{"__metadata__", ones({1})}}); }},
      {"st.bytes", [] {
         RawTensor r;
         r.shape = {1};
         r.bytes = {1, 2, 3};
         to_float_tensor(r, "t");
       }},
      {"st.f32", [] {
         RawTensor r;
         r.dtype = DType::F64;
         r.shape = {1};
         r.bytes.assign(8, 0);
         require_f32(r, "'w.safetensors' tensor 'W_q.weight'");
       }},
      // files
      {"read.open", [] { read_safetensors(temp_path("missing.safetensors")); }},
      {"read.not_regular", [] { read_safetensors(fs::temp_directory_path().string()); }},
      {"read.memory_limit", [] {
         const std::string p = temp_path("big.safetensors");
         save_safetensors(p, {{"x", ones({512, 1024})}});
         LimitGuard g(1 << 20);
         try {
           read_safetensors(p);
         } catch (...) {
           fs::remove(p);
           throw;
         }
       }},
      {"write.empty", [] { save_safetensors("", {}); }},
      {"write.folder", [] { save_safetensors(fs::temp_directory_path().string(), {}); }},
      {"write.create", [] { save_safetensors(temp_path("no/such/folder/x.safetensors"), {}); }},
      // `mha run`'s files (tools/run_inputs.h), which the CLI rows also reach
      {"run.no_wq", [] { tools::run_module_from({}, 2, "w.safetensors"); }},
      {"run.wq_rank", [] { tools::run_module_from({{"W_q.weight", ones({8})}}, 2, "w.safetensors"); }},
      {"run.torch_layout", [] {
         tools::run_module_from({{"in_proj_weight", ones({12, 4})}, {"out_proj.weight", ones({4, 4})},
                                 {"bias_k", ones({1, 1, 4})}}, 2, "w.safetensors");
       }},
      {"run.heads", [] { tools::run_module_from(state(8, 4, false), 0, "w.safetensors"); }},
      {"run.heads_metadata", [] { tools::run_module_from(state(8, 4, false), 0, "w.safetensors", "run", {{"num_heads", "x"}}); }},
      {"run.heads_disagree", [] { tools::run_module_from(state(8, 4, false), 4, "w.safetensors", "run", {{"num_heads", "2"}}); }},
      // head gates and pruning (mha/multihead.h, mha/prune.h)
      {"prune.gates_size", [] { MultiHeadAttention(12, 4).set_head_gates({1, 1, 1}); }},
      {"prune.gates_finite", [] { MultiHeadAttention(12, 4).set_head_gates({1, 1, NAN, 1}); }},
      {"prune.dropout", [] { MultiHeadAttention(12, 4).set_dropout(1.5f); }},
      {"prune.head_range", [] { MultiHeadAttention(12, 4).prune_heads({4}); }},
      {"prune.already", [] {
         MultiHeadAttention m(12, 4);
         m.prune_heads({2});
         m.prune_heads({2});
       }},
      {"prune.twice", [] { MultiHeadAttention(12, 4).prune_heads({1, 1}); }},
      {"prune.all", [] { MultiHeadAttention(12, 4).prune_heads({0, 1, 2, 3}); }},
      {"prune.state_shape", [] {
         MultiHeadAttention m(8, 2);
         m.prune_heads({1});
         m.load_state_dict(state(8, 4, false));
       }},
      {"layout.num_heads", [] { MultiHeadAttention m(12, 4); apply_head_layout(m, {{"num_heads", "5"}}, "", "'f'"); }},
      {"layout.list", [] { MultiHeadAttention m(12, 4); apply_head_layout(m, {{"heads_kept", "1,x"}}, "", "'f'"); }},
      {"layout.range", [] { MultiHeadAttention m(12, 4); apply_head_layout(m, {{"heads_kept", "1,9"}}, "", "'f'"); }},
      {"layout.repeat", [] { MultiHeadAttention m(12, 4); apply_head_layout(m, {{"heads_kept", "1,1"}}, "", "'f'"); }},
      {"layout.pruned", [] {
         MultiHeadAttention m(12, 4);
         m.prune_heads({0});
         apply_head_layout(m, {}, "", "'f'");
       }},
      {"attention_file.lazy", [] { save_attention(temp_path("lazy.safetensors"), MultiHeadAttention(8, 2)); }},
      {"attention_file.no_wo", [] {
         const std::string p = temp_path("no_wo.safetensors");
         save_safetensors(p, {{"W_q.weight", ones({8, 4})}});
         load_attention(p, 2);
       }},
      {"attention_file.wo_rank", [] {
         const std::string p = temp_path("wo_rank.safetensors");
         save_safetensors(p, {{"W_o.weight", ones({8})}});
         load_attention(p, 2);
       }},
      {"attention_file.num_heads", [] {
         const std::string p = temp_path("num_heads.safetensors");
         save_safetensors(p, state(8, 4, false), {{"num_heads", "two"}});
         load_attention(p);
       }},
      {"attention_file.disagree", [] {
         const std::string p = temp_path("disagree.safetensors");
         save_safetensors(p, state(8, 4, false), {{"num_heads", "2"}});
         load_attention(p, 4);
       }},
      {"attention_file.heads", [] {
         const std::string p = temp_path("heads.safetensors");
         save_safetensors(p, state(8, 4, false));
         load_attention(p);
       }},
      {"prune.discarded_call", [] {
         MultiHeadAttention m(8, 2);
         m.forward(ones({1, 2, 4}), ones({1, 2, 4}), ones({1, 2, 4}));
         m.prune_heads({0});
         m.attention_weights({0}, {0});
       }},
      {"attention_file.negative_heads", [] { load_attention(temp_path("any.safetensors"), -1); }},
      {"prune_model.layer", [] {
         AttentionModel model({.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2});
         prune_model_heads(model, {{1, 0}});
       }},
      {"prune_model.heads", [] {
         AttentionModel model({.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2});
         prune_model_heads(model, {{0, 0}, {0, 1}});
       }},
      // head importance and the pruning experiment (mha/importance.h, mha/prune_experiment.h)
      {"importance.none", [] {
         AttentionModel model({.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2});
         gradient_importance(model, {});
       }},
      {"importance.batch", [] {
         AttentionModel model({.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2});
         TokenBatch b;
         b.batch = 1, b.length = 2, b.tokens = {0}, b.targets = {0, 1}, b.lengths = {2};
         evaluate(model, {b});
       }},
      {"importance.unscored", [] {
         AttentionModel model({.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2});
         TokenBatch b;
         b.batch = 1, b.length = 2, b.tokens = {0, 1}, b.targets = {kIgnore, kIgnore}, b.lengths = {2};
         gradient_importance(model, {b});
       }},
      {"experiment.layers", [] {
         AttentionModel model({.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2});
         order_by_score(model, {});
       }},
      {"experiment.scores", [] {
         AttentionModel model({.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2});
         order_by_score(model, {{1.0}});
       }},
      {"experiment.order_size", [] {
         Checkpoint ck;
         ck.config.model = {.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2};
         ck.model = AttentionModel(ck.config.model).state_dict();
         prune_curve(ck, "x", {{0, 0}}, {});
       }},
      {"experiment.not_head", [] {
         Checkpoint ck;
         ck.config.model = {.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2};
         ck.model = AttentionModel(ck.config.model).state_dict();
         prune_curve(ck, "x", {{0, 0}, {0, 5}}, {});
       }},
      {"experiment.repeat", [] {
         Checkpoint ck;
         ck.config.model = {.vocab_size = 3, .num_classes = 2, .max_len = 4, .num_hiddens = 8, .num_heads = 2};
         ck.model = AttentionModel(ck.config.model).state_dict();
         prune_curve(ck, "x", {{0, 1}, {0, 1}}, {});
       }},
      {"experiment.area", [] {
         PruneCurve c;
         c.name = "gradient";
         c.accuracy = {1.0};
         first_half_area(c, 4);
       }},
  };
}

// Every trigger, by row id; an id given twice is a mistake in the tables.
std::map<std::string, std::function<void()>> triggers() {
  std::map<std::string, std::function<void()>> all = core_triggers();
  for (const auto& part : {test::training_triggers(), test::torch_triggers(), test::plot_triggers(),
                           test::cache_triggers()})
    for (const auto& [id, trigger] : part)
      if (!all.emplace(id, trigger).second) ADD_FAILURE() << "trigger '" << id << "' is defined twice";
  return all;
}

TEST(ErrorCatalogue, EveryRowForCppGivesItsMessage) {
  const auto rows = read_catalogue();
  ASSERT_GE(rows.size(), 50u) << "docs/errors.md was not found or has no rows";
  const auto table = triggers();
  int walked = 0;
  for (const Row& row : rows) {
    if (!row.surfaces.count("C++")) continue;
    SCOPED_TRACE(row.id);
    auto it = table.find(row.id);
    ASSERT_NE(it, table.end()) << "no C++ trigger for catalogue row '" << row.id << "'";
    try {
      it->second();
      ADD_FAILURE() << "no error thrown";
    } catch (const Error& e) {
      EXPECT_TRUE(message_matches(row.message, e.what()))
          << "documented: " << row.message << "\n     thrown: " << e.what();
    }
    ++walked;
  }
  EXPECT_EQ(walked, static_cast<int>(table.size()));
}

TEST(ErrorCatalogue, EveryCppTriggerIsCatalogued) {
  std::set<std::string> cpp_rows;
  for (const Row& row : read_catalogue())
    if (row.surfaces.count("C++")) cpp_rows.insert(row.id);
  for (const auto& [id, trigger] : triggers())
    EXPECT_TRUE(cpp_rows.count(id)) << "trigger '" << id << "' has no C++ row in docs/errors.md";
}

TEST(ErrorCatalogue, PlaceholdersMatchAnyTextAndNothingElseIsLoose) {
  EXPECT_TRUE(message_matches("[read] cannot open '<path>': x", "[read] cannot open '/tmp/a b': x"));
  EXPECT_FALSE(message_matches("[read] cannot open '<path>': x", "[read] cannot open '': x"));
  EXPECT_FALSE(message_matches("shape (2, 4)", "shape (2, 5)"));
  EXPECT_TRUE(message_matches("k < valid_len (a.b)", "k < valid_len (a.b)"));
}

}  // namespace

namespace {

// For writing rows: prints every trigger's message.
//   build/tests/cpp/mha_tests --gtest_also_run_disabled_tests --gtest_filter='*DumpMessages'
TEST(ErrorCatalogue, DISABLED_DumpMessages) {
  for (const auto& [id, trigger] : triggers()) {
    try {
      trigger();
      std::printf("%-28s (no error)\n", id.c_str());
    } catch (const std::exception& e) {
      std::printf("%-28s %s\n", id.c_str(), e.what());
    }
  }
}

}  // namespace
