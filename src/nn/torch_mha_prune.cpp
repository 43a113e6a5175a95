// TorchMultiheadAttention's head gates and pruning (mha/torch_mha.h), on the
// bookkeeping both modules share (src/nn/head_layout.cpp).
#include "mha/error.h"
#include "mha/torch_mha.h"

namespace mha {

void TorchMultiheadAttention::set_head_gates(const std::vector<float>& gates) {
  heads_.check_gates("TorchMultiheadAttention.set_head_gates", gates);
  heads_.gates = gates;
}

void TorchMultiheadAttention::prune_heads(const std::vector<int64_t>& heads) {
  static const char* op = "TorchMultiheadAttention.prune_heads";
  if (num_kv_heads_ != num_heads_ && !heads.empty())
    fail(op, "heads: this module groups its ", num_heads_, " query heads over ", num_kv_heads_,
         " key/value heads; pruning needs one key/value head per query head");
  const std::vector<int64_t> stay = heads_.staying(op, heads);
  if (stay.empty()) return;
  const int64_t d = heads_.head_dim, kept = static_cast<int64_t>(stay.size()) * d;
  for (Tensor* t : {&bias_k_, &bias_v_})
    if (!t->empty()) *t = detail::take_column_blocks(t->reshape({1, t->numel()}), stay, d).reshape({1, 1, kept});
  heads_.keep(stay, op, q_proj_, k_proj_, v_proj_, out_proj_);
  num_heads_ = num_kv_heads_ = static_cast<int64_t>(stay.size());
  // Gradients and the saved call describe the old layout. The gradient
  // tensors are emptied, not erased: parameters() handed out pointers to
  // them, and ensure_grads() refills them with zeros.
  for (auto& [name, g] : grads_) g = Tensor();
  pruned_last_call_ = saved_ != nullptr;
  saved_.reset();
}

Mask TorchMultiheadAttention::kept_head_slices(const Mask& attn_mask, int64_t B) const {
  // (B*h, Q, K) as built -> (B*kept, Q, K): the slices of the kept heads.
  if (!heads_.pruned() || attn_mask.dim() != 3) return attn_mask;
  const int64_t orig = heads_.original, kept = static_cast<int64_t>(heads_.kept.size());
  const int64_t Q = attn_mask.shape()[1], K = attn_mask.shape()[2], slice = Q * K;
  const Shape shape{B * kept, Q, K};
  auto pick = [&](const auto* from, auto& to) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < kept; ++i) {
        const auto* src = from + (b * orig + heads_.kept[static_cast<size_t>(i)]) * slice;
        std::copy(src, src + slice, to.begin() + (b * kept + i) * slice);
      }
  };
  if (attn_mask.is_keep()) {
    std::vector<uint8_t> keep(static_cast<size_t>(B * kept * slice));
    pick(attn_mask.keep_data(), keep);
    return Mask::keep(shape, std::move(keep));
  }
  Tensor bias(shape);
  pick(attn_mask.bias_data(), bias.values());
  return Mask::additive(std::move(bias));
}

}  // namespace mha
