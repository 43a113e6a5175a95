// mha::ForwardContext (mha/context.h) over the engine's record.
#include "mha/context.h"

#include "core/memory.h"
#include "mha/error.h"
#include "nn/attention_engine.h"

namespace mha {

namespace {

const nn::AttentionContext& of(const std::shared_ptr<const nn::AttentionContext>& c, const char* op) {
  if (!c) fail(op, "context: holds no forward call");
  return *c;
}

}  // namespace

bool ForwardContext::differentiable() const { return of(ctx_, "ForwardContext.differentiable").for_backward; }
int64_t ForwardContext::batch_size() const { return of(ctx_, "ForwardContext.batch_size").B(); }
int64_t ForwardContext::num_heads() const { return of(ctx_, "ForwardContext.num_heads").H; }
int64_t ForwardContext::num_queries() const { return of(ctx_, "ForwardContext.num_queries").Q; }
int64_t ForwardContext::num_keys() const { return of(ctx_, "ForwardContext.num_keys").Kt; }

Tensor ForwardContext::attention_weights() const {
  static const char* op = "ForwardContext.attention_weights";
  return nn::checked_all_weights(op, of(ctx_, op));
}

Tensor ForwardContext::attention_weights(const std::vector<int64_t>& batch_rows,
                                         const std::vector<int64_t>& heads) const {
  static const char* op = "ForwardContext.attention_weights";
  return nn::checked_weights_of(op, "the call", of(ctx_, op), batch_rows, heads);
}

Tensor ForwardContext::dropout_mask() const {
  static const char* op = "ForwardContext.dropout_mask";
  const nn::AttentionContext& c = of(ctx_, op);
  core::MemoryPlan(op).add("dropout mask", {c.B(), c.H, c.Q, c.Kt}).check();
  return nn::dropout_mask(c);
}

const nn::AttentionContext& nn::differentiable_context(const char* op, const ForwardContext& context,
                                                       uint64_t owner, int64_t H) {
  if (context.empty()) fail(op, "context: holds no forward call");
  const AttentionContext& ctx = *context.get();
  if (ctx.owner != owner)
    fail(op, "context: comes from another module's call; a call's backward needs the module that ran it");
  if (!ctx.for_backward)
    fail(op, "context: the call ran in evaluation mode; a training-mode call (train()) gives a differentiable context");
  if (ctx.H != H) fail(op, "context: the call ran with ", ctx.H, " heads; the module has ", H, " since prune_heads");
  return ctx;
}

}  // namespace mha
