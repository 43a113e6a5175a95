// MultiHeadAttention's head gates and head pruning (mha/multihead.h).
//
// Both act on the module around the attention kernel, never inside it:
//   concat:[B,Q,h*d]  heads' outputs, head i in columns [i*d, (i+1)*d)
//   gated = concat * gate_i on head i's columns          (a gate per head)
//   out = gated W_o^T + b_o
// so any kernel (reference, BLAS, fused) runs unchanged. Pruning head i
// deletes what produces and reads those columns: rows [i*d, (i+1)*d) of
// W_q, W_k, W_v (and their biases) and the same columns of W_o. A pruned
// module computes exactly what the unpruned one computes with gate_i = 0
// (up to the order of float sums in the smaller products).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <set>
#include <shared_mutex>

#include "mha/error.h"
#include "mha/multihead.h"

namespace mha {

namespace {

// w:[rows, cols] -> the row blocks [h*d, (h+1)*d) of each h in `heads`, in order.
Tensor take_row_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d) {
  const int64_t cols = w.dim() == 2 ? w.size(1) : 1;
  Tensor out(w.dim() == 2 ? Shape{static_cast<int64_t>(heads.size()) * d, cols}
                          : Shape{static_cast<int64_t>(heads.size()) * d});
  for (size_t i = 0; i < heads.size(); ++i)
    std::memcpy(out.data() + static_cast<int64_t>(i) * d * cols, w.data() + heads[i] * d * cols,
                static_cast<size_t>(d * cols) * sizeof(float));
  return out;
}

// w:[rows, cols] -> the column blocks [h*d, (h+1)*d) of each h in `heads`, in order.
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

}  // namespace

void MultiHeadAttention::init_head_layout() {
  head_dim_ = num_hiddens_ / num_heads_;
  original_num_heads_ = num_heads_;
  kept_heads_.resize(static_cast<size_t>(num_heads_));
  std::iota(kept_heads_.begin(), kept_heads_.end(), int64_t{0});
  head_gates_.assign(static_cast<size_t>(num_heads_), 1.0f);
  head_gate_grad_ = Tensor({num_heads_});
}

void MultiHeadAttention::set_dropout(float p) {
  if (!(p >= 0.0f && p <= 1.0f))
    fail("MultiHeadAttention.set_dropout", "p: ", p, " is not a probability in [0, 1]");
  std::lock_guard state(state_mutex_);  // forward() reads it under this lock
  dropout_ = p;
}

std::vector<float> MultiHeadAttention::head_gates() const {
  std::shared_lock params(params_mutex_);
  return head_gates_;
}

void MultiHeadAttention::set_head_gates(const std::vector<float>& gates) {
  static const char* op = "MultiHeadAttention.set_head_gates";
  std::unique_lock params(params_mutex_);  // like the parameters: waits for running calls
  if (static_cast<int64_t>(gates.size()) != num_heads_)
    fail(op, "gates: shape ", shape_str({static_cast<int64_t>(gates.size())}), " is not ", shape_str({num_heads_}),
         ", one per head");
  for (size_t i = 0; i < gates.size(); ++i)
    if (!std::isfinite(gates[i])) fail(op, "gates: entry ", i, " is ", gates[i], ", not a finite number");
  head_gates_ = gates;
}

void MultiHeadAttention::prune_heads(const std::vector<int64_t>& heads) {
  static const char* op = "MultiHeadAttention.prune_heads";
  std::unique_lock params(params_mutex_);  // waits for running calls
  std::lock_guard state(state_mutex_);     // state_, spare_
  std::set<int64_t> remove;
  for (size_t i = 0; i < heads.size(); ++i) {
    const int64_t h = heads[i];
    if (h < 0 || h >= original_num_heads_)
      fail(op, "heads: entry ", i, " is ", h, "; heads are numbered 0 .. ", original_num_heads_ - 1,
           " as the module was built");
    if (std::find(kept_heads_.begin(), kept_heads_.end(), h) == kept_heads_.end())
      fail(op, "heads: entry ", i, " is head ", h, ", which was already pruned");
    if (!remove.insert(h).second) fail(op, "heads: head ", h, " is listed twice");
  }
  if (remove.empty()) return;
  if (remove.size() == kept_heads_.size())
    fail(op, "heads: removing all ", kept_heads_.size(), " remaining heads; at least one must remain");

  // Positions (in the current layout) of the heads that stay.
  std::vector<int64_t> stay, stay_ids;
  std::vector<float> gates;
  for (size_t i = 0; i < kept_heads_.size(); ++i)
    if (!remove.count(kept_heads_[i])) {
      stay.push_back(static_cast<int64_t>(i));
      stay_ids.push_back(kept_heads_[i]);
      gates.push_back(head_gates_[i]);
    }
  const int64_t d = head_dim_, kept = static_cast<int64_t>(stay.size()) * d;

  // New layers of the new widths; initialised ones get the sliced parameters.
  auto slice_in = [&](LazyLinear& layer) {  // W_q, W_k, W_v: rows of the kept heads
    LazyLinear next(kept, bias_);
    if (layer.initialized()) {
      next.set_weight(take_row_blocks(layer.weight(), stay, d), op);
      if (bias_) next.set_bias(take_row_blocks(layer.bias(), stay, d), op);
    }
    return next;
  };
  LazyLinear q = slice_in(W_q_), k = slice_in(W_k_), v = slice_in(W_v_);
  LazyLinear o(num_hiddens_, bias_);  // W_o: columns of the kept heads, all rows
  if (W_o_.initialized()) {
    o.set_weight(take_column_blocks(W_o_.weight(), stay, d), op);
    if (bias_) o.set_bias(W_o_.bias(), op);
  }
  W_q_ = std::move(q);
  W_k_ = std::move(k);
  W_v_ = std::move(v);
  W_o_ = std::move(o);
  num_heads_ = static_cast<int64_t>(stay.size());
  kept_heads_ = std::move(stay_ids);
  head_gates_ = std::move(gates);
  head_gate_grad_ = Tensor({num_heads_});
  // Gradients and the last call's state describe the old layout. The
  // gradient tensors are emptied, not erased: parameters() handed out
  // pointers to them, and ensure_grads() refills them with zeros.
  for (auto& [name, g] : grads_) g = Tensor();
  state_.reset();
  spare_.clear();
}

}  // namespace mha
