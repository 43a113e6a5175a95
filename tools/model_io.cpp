// tools/model_io.cpp: see model_io.h.
#include "model_io.h"

#include <cstring>

namespace mha::tools {

MultiHeadAttention load_attention(const std::string& weights_path, int64_t num_heads, const char* op) {
  const SafetensorsFile file = read_safetensors(weights_path);
  StateDict state;
  for (const auto& [name, raw] : file.tensors)
    state.emplace(name, require_f32(raw, "'" + weights_path + "' tensor '" + name + "'"));
  // The metadata carries a pruned module's head layout (mha/prune.h).
  return run_module_from(state, num_heads, weights_path, op, file.metadata);
}

AttentionInputs load_inputs(const std::string& path, const char* op) {
  return run_inputs_from(read_safetensors(path), path, op);
}

namespace {

// t:[B, ...] -> [rows.size(), ...]
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape();
  const int64_t row_size = t.numel() / shape[0];
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out(shape);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data() + static_cast<int64_t>(i) * row_size, t.data() + rows[i] * row_size,
                static_cast<size_t>(row_size) * sizeof(float));
  return out;
}

}  // namespace

AttentionInputs select_rows(const AttentionInputs& in, const std::vector<int64_t>& rows) {
  const int64_t B = in.queries.dim() > 0 ? in.queries.size(0) : 0;
  for (int64_t r : rows)
    if (r < 0 || r >= B) fail("select_rows", "row ", r, " is outside the batch of ", B, " rows (0 .. ", B - 1, ")");
  if (in.queries.dim() != 3 || in.keys.dim() != 3 || in.values.dim() != 3 || in.keys.size(0) != B ||
      in.values.size(0) != B)
    fail("select_rows", "queries ", shape_str(in.queries.shape()), ", keys ", shape_str(in.keys.shape()),
         ", values ", shape_str(in.values.shape()), ": wanted (B, Q, Dq), (B, K, Dk), (B, K, Dv)");
  if (!in.valid_lens.is_none()) in.valid_lens.check("select_rows", B, in.queries.size(1));
  AttentionInputs out;
  out.queries = take_rows(in.queries, rows);
  out.keys = take_rows(in.keys, rows);
  out.values = take_rows(in.values, rows);
  const ValidLens& v = in.valid_lens;
  if (v.kind() == ValidLens::Kind::PerBatch) {
    std::vector<float> lens;
    for (int64_t r : rows) lens.push_back(v.at(r, 0));
    out.valid_lens = ValidLens::per_batch(lens);
  } else if (v.kind() == ValidLens::Kind::PerQuery) {
    const int64_t Q = v.shape()[1];
    std::vector<float> lens;
    for (int64_t r : rows)
      for (int64_t q = 0; q < Q; ++q) lens.push_back(v.at(r, q));
    out.valid_lens = ValidLens::per_query(static_cast<int64_t>(rows.size()), Q, lens);
  }
  return out;
}

}  // namespace mha::tools
