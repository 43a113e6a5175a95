// MultiHeadAttention's head gates and head pruning (mha/multihead.h); the
// bookkeeping both modules share is in src/nn/head_layout.cpp.
#include <mutex>
#include <shared_mutex>

#include "mha/error.h"
#include "mha/multihead.h"

namespace mha {

void MultiHeadAttention::set_dropout(float p) {
  if (!(p >= 0.0f && p <= 1.0f))
    fail("MultiHeadAttention.set_dropout", "p: ", p, " is not a probability in [0, 1]");
  std::lock_guard state(state_mutex_);  // forward() reads it under this lock
  dropout_ = p;
}

std::vector<float> MultiHeadAttention::head_gates() const {
  std::shared_lock params(params_mutex_);
  return heads_.gates;
}

void MultiHeadAttention::set_head_gates(const std::vector<float>& gates) {
  static const char* op = "MultiHeadAttention.set_head_gates";
  std::unique_lock params(params_mutex_);  // like the parameters: waits for running calls
  heads_.check_gates(op, gates);
  heads_.gates = gates;
}

void MultiHeadAttention::prune_heads(const std::vector<int64_t>& heads) {
  static const char* op = "MultiHeadAttention.prune_heads";
  std::unique_lock params(params_mutex_);  // waits for running calls
  std::lock_guard state(state_mutex_);     // state_, spare_
  const std::vector<int64_t> stay = heads_.staying(op, heads);
  if (stay.empty()) return;
  const int64_t d = heads_.head_dim, kept = static_cast<int64_t>(stay.size()) * d;

  // New layers of the new widths; initialised ones get the sliced parameters.
  auto slice_in = [&](LazyLinear& layer) {  // W_q, W_k, W_v: rows of the kept heads
    LazyLinear next(kept, bias_);
    if (layer.initialized()) {
      next.set_weight(detail::take_row_blocks(layer.weight(), stay, d), op);
      if (bias_) next.set_bias(detail::take_row_blocks(layer.bias(), stay, d), op);
    }
    return next;
  };
  LazyLinear q = slice_in(W_q_), k = slice_in(W_k_), v = slice_in(W_v_);
  LazyLinear o(num_hiddens_, bias_);  // W_o: columns of the kept heads, all rows
  if (W_o_.initialized()) {
    o.set_weight(detail::take_column_blocks(W_o_.weight(), stay, d), op);
    if (bias_) o.set_bias(W_o_.bias(), op);
  }
  W_q_ = std::move(q);
  W_k_ = std::move(k);
  W_v_ = std::move(v);
  W_o_ = std::move(o);
  num_heads_ = static_cast<int64_t>(stay.size());
  heads_.keep(stay);
  // Gradients and the last call's state describe the old layout. The
  // gradient tensors are emptied, not erased: parameters() handed out
  // pointers to them, and ensure_grads() refills them with zeros.
  for (auto& [name, g] : grads_) g = Tensor();
  state_.reset();
  spare_.clear();
}

}  // namespace mha
