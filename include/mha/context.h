// mha/context.h: what one forward call keeps, as a value.
//
// A module's forward can hand back its call's context beside the output;
// the backward of that call and its attention weights come from the context
// alone, so calls need not be differentiated or inspected in the order they
// ran, and nothing of the call lives in the module:
//
//   auto [out1, ctx1] = attention.forward_with_context(X1, X1, X1);
//   auto [out2, ctx2] = attention.forward_with_context(X2, X2, X2, lens);
//   attention.backward(ctx1, grad1);               // adds into grads()
//   mha::Tensor w = ctx2.attention_weights({0}, {1, 3});  // row 0, heads 1 and 3
//
// A context is immutable and cheap to copy (copies share it); it holds the
// call's projections, its heads' outputs, masks and dropout key, and, when
// the call ran in training mode, its inputs. The stateful API (forward(),
// attention_weights(), backward(grad)) is a thin layer that keeps the last
// call's context.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mha/tensor.h"

namespace mha {

namespace nn {
struct AttentionContext;  // src/nn/attention_engine.h
}

// What one forward call kept (see the top of this file).
class ForwardContext {
 public:
  // No call: every accessor but empty() throws mha::Error.
  ForwardContext() = default;
  // The engine's record of a call (made by the modules).
  explicit ForwardContext(std::shared_ptr<const nn::AttentionContext> ctx) : ctx_(std::move(ctx)) {}

  // True when this holds no call.
  bool empty() const { return !ctx_; }
  // True when the call ran in training mode (its backward can run).
  bool differentiable() const;
  // B: the call's batch rows.
  int64_t batch_size() const;
  // h: the call's query heads.
  int64_t num_heads() const;
  // Q: the call's queries per batch row.
  int64_t num_queries() const;
  // K: the call's keys per batch row, appended ones (bias_k, a zero key) included.
  int64_t num_keys() const;
  // [B, h, Q, K]: the softmax weights before dropout, as a copy (with the
  // fused kernel, computed from the call's statistics on first access).
  Tensor attention_weights() const;
  // [rows, heads, Q, K]: those batch rows' and heads' weights only. Throws
  // mha::Error for an index out of range.
  Tensor attention_weights(const std::vector<int64_t>& batch_rows, const std::vector<int64_t>& heads) const;
  // [B, h, Q, K]: the call's dropout multipliers, 0 or 1/(1-p) (all 1 without dropout).
  Tensor dropout_mask() const;

  // The engine's record (for the modules).
  const std::shared_ptr<const nn::AttentionContext>& get() const { return ctx_; }

 private:
  std::shared_ptr<const nn::AttentionContext> ctx_;
};

}  // namespace mha
