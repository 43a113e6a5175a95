// MultiHeadAttention's head gates and head pruning (mha/multihead.h); the
// bookkeeping both modules share is in src/nn/head_layout.cpp.
#include "mha/error.h"
#include "mha/multihead.h"

namespace mha {

void MultiHeadAttention::set_dropout(float p) {
  if (!(p >= 0.0f && p <= 1.0f))
    fail("MultiHeadAttention.set_dropout", "p: ", p, " is not a probability in [0, 1]");
  dropout_.set(p);  // calls that have started keep theirs
}

std::vector<float> MultiHeadAttention::head_gates() const { return params_.pin()->heads.gates; }

void MultiHeadAttention::set_head_gates(const std::vector<float>& gates) {
  static const char* op = "MultiHeadAttention.set_head_gates";
  params_.update([&](Params& live) {  // like the parameters: running calls finish on the old gates
    live.heads.check_gates(op, gates);
    live.heads.gates = gates;
  });
}

void MultiHeadAttention::prune_heads(const std::vector<int64_t>& heads) {
  static const char* op = "MultiHeadAttention.prune_heads";
  const bool pruned = params_.update([&](Params& live) {  // running calls finish on the old heads
    const std::vector<int64_t> stay = live.heads.staying(op, heads);
    if (stay.empty()) return false;
    live.heads.keep(stay, op, live.W_q, live.W_k, live.W_v, live.W_o);
    live.num_heads = static_cast<int64_t>(stay.size());
    return true;
  });
  if (!pruned) return;
  // Gradients and the last call's state describe the old layout. The
  // gradient tensors are emptied, not erased: parameters() handed out
  // pointers to them, and ensure_grads() refills them with zeros.
  for (auto& [name, g] : grads_) g = Tensor();
  state_.store(nullptr);
  pruned_last_call_.set(true);
  spare_.store(nullptr);
}

}  // namespace mha
