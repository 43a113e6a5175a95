// Head bookkeeping shared by both modules (mha/detail/head_layout.h).
//
// Gates and pruning act around the attention kernel, never inside it:
//   concat:[rows, h*d]  heads' outputs, head i in columns [i*d, (i+1)*d)
//   gated = concat * gate_i on head i's columns          (a gate per head)
//   out = gated W_o^T + b_o
// so any kernel runs unchanged (the engine applies the gates, nn/attention_engine.h).
// Pruning head i deletes what produces and reads those columns: rows
// [i*d, (i+1)*d) of W_q, W_k, W_v (and their biases) and the same columns of
// W_o. A pruned module computes exactly what the unpruned one computes with
// gate_i = 0 (up to the order of float sums in the smaller products).
#include "mha/detail/head_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "mha/error.h"

namespace mha::detail {

void HeadLayout::init(int64_t heads, int64_t d) {
  head_dim = d;
  original = heads;
  kept.resize(static_cast<size_t>(heads));
  std::iota(kept.begin(), kept.end(), int64_t{0});
  gates.assign(static_cast<size_t>(heads), 1.0f);
  gate_grad = Tensor({heads});
}

void HeadLayout::check_gates(const char* op, const std::vector<float>& g) const {
  const int64_t n = static_cast<int64_t>(kept.size());
  if (static_cast<int64_t>(g.size()) != n)
    fail(op, "gates: shape ", shape_str({static_cast<int64_t>(g.size())}), " is not ", shape_str({n}),
         ", one per head");
  for (size_t i = 0; i < g.size(); ++i)
    if (!std::isfinite(g[i])) fail(op, "gates: entry ", i, " is ", g[i], ", not a finite number");
}

std::vector<int64_t> HeadLayout::staying(const char* op, const std::vector<int64_t>& heads) const {
  std::set<int64_t> remove;
  for (size_t i = 0; i < heads.size(); ++i) {
    const int64_t h = heads[i];
    if (h < 0 || h >= original)
      fail(op, "heads: entry ", i, " is ", h, "; heads are numbered 0 .. ", original - 1, " as the module was built");
    if (std::find(kept.begin(), kept.end(), h) == kept.end())
      fail(op, "heads: entry ", i, " is head ", h, ", which was already pruned");
    if (!remove.insert(h).second) fail(op, "heads: head ", h, " is listed twice");
  }
  if (remove.empty()) return {};
  if (remove.size() == kept.size())
    fail(op, "heads: removing all ", kept.size(), " remaining heads; at least one must remain");
  std::vector<int64_t> stay;
  for (size_t i = 0; i < kept.size(); ++i)
    if (!remove.count(kept[i])) stay.push_back(static_cast<int64_t>(i));
  return stay;
}

void HeadLayout::keep(const std::vector<int64_t>& stay) {
  std::vector<int64_t> ids;
  std::vector<float> g;
  for (int64_t i : stay) {
    ids.push_back(kept[static_cast<size_t>(i)]);
    g.push_back(gates[static_cast<size_t>(i)]);
  }
  kept = std::move(ids);
  gates = std::move(g);
  gate_grad = Tensor({static_cast<int64_t>(kept.size())});
}

void HeadLayout::keep(const std::vector<int64_t>& stay, const char* op, LazyLinear& q, LazyLinear& k, LazyLinear& v,
                      LazyLinear& o) {
  const int64_t d = head_dim, width = static_cast<int64_t>(stay.size()) * d;
  auto slice = [&](const LazyLinear& layer, bool rows) {
    LazyLinear next(rows ? width : layer.out_features(), layer.has_bias());
    if (!layer.initialized()) return next;
    next.set_weight(rows ? take_row_blocks(layer.weight(), stay, d) : take_column_blocks(layer.weight(), stay, d), op);
    if (layer.has_bias()) next.set_bias(rows ? take_row_blocks(layer.bias(), stay, d) : layer.bias(), op);
    return next;
  };
  LazyLinear next[] = {slice(q, true), slice(k, true), slice(v, true), slice(o, false)};
  q = std::move(next[0]);
  k = std::move(next[1]);
  v = std::move(next[2]);
  o = std::move(next[3]);
  keep(stay);
}

Tensor take_row_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d) {
  const int64_t cols = w.dim() == 2 ? w.size(1) : 1;
  const int64_t rows = static_cast<int64_t>(heads.size()) * d;
  Tensor out(w.dim() == 2 ? Shape{rows, cols} : Shape{rows});
  for (size_t i = 0; i < heads.size(); ++i)
    std::memcpy(out.data() + static_cast<int64_t>(i) * d * cols, w.data() + heads[i] * d * cols,
                static_cast<size_t>(d * cols) * sizeof(float));
  return out;
}

Tensor take_column_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d) {
  const int64_t rows = w.size(0), cols = w.size(1);
  const int64_t kept = static_cast<int64_t>(heads.size()) * d;
  Tensor out({rows, kept});
  for (int64_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < heads.size(); ++i)
      std::memcpy(out.data() + r * kept + static_cast<int64_t>(i) * d, w.data() + r * cols + heads[i] * d,
                  static_cast<size_t>(d) * sizeof(float));
  return out;
}

Tensor put_row_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d, int64_t rows) {
  const int64_t cols = w.dim() == 2 ? w.size(1) : 1;
  Tensor out(w.dim() == 2 ? Shape{rows, cols} : Shape{rows});
  for (size_t i = 0; i < heads.size(); ++i)
    std::memcpy(out.data() + heads[i] * d * cols, w.data() + static_cast<int64_t>(i) * d * cols,
                static_cast<size_t>(d * cols) * sizeof(float));
  return out;
}

Tensor put_column_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d, int64_t cols) {
  const int64_t rows = w.size(0), kept = w.size(1);
  Tensor out({rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < heads.size(); ++i)
      std::memcpy(out.data() + r * cols + heads[i] * d, w.data() + r * kept + static_cast<int64_t>(i) * d,
                  static_cast<size_t>(d) * sizeof(float));
  return out;
}

}  // namespace mha::detail
