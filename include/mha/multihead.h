// mha/multihead.h: the d2l chapter's MultiHeadAttention.
//
//   mha::MultiHeadAttention attention(/*num_hiddens=*/100, /*num_heads=*/5,
//                                     /*dropout=*/0.5f);
//   mha::Tensor X({2, 4, 100}, 1.0f), Y({2, 6, 100}, 1.0f);
//   mha::Tensor out = attention.forward(X, Y, Y, mha::ValidLens::per_batch({3, 2}));
//   // out:[2, 4, 100]; attention.attention_weights():[2, 5, 4, 6]
//
// queries, keys and values go through lazy projections W_q, W_k, W_v
// (num_hiddens outputs each; input widths fixed by the first call), are split
// into num_heads heads of width d = num_hiddens / num_heads (head i owns
// features [i*d, (i+1)*d)), attend with scaled dot products and the d2l chapter's
// masked softmax, are concatenated in head order and projected by W_o.
//
// Like a torch.nn.Module, a new module is in training mode: dropout acts on
// the attention weights until eval() is called.
//
// Training: a training-mode forward keeps what the backward pass needs (the
// inputs, their projections, the heads' outputs, the weights and the dropout
// key); backward() then returns the inputs' gradients and adds the
// parameters' gradients into grads(), which accumulate until zero_grad():
//
//   Tensor out = attention(X, Y, Y, lens);            // training mode
//   auto g = attention.backward(grad_out);            // g.queries:[B,Q,Dq] ...
//   attention.grads().at("W_q.weight");               // (num_hiddens, Dq)
//
// Threads: forward() may be called on one module from many threads at once,
// in either mode, and gives each call exactly what a serial call gives (in
// training mode the dropout masks are drawn in call order, whichever that
// is). Calls hold no lock (mha/detail/published.h): each reads one snapshot
// of the parameters, the mode and the kernel when it starts. What changes
// the parameters (the lazy initialisation of the first call,
// load_state_dict, set_head_gates, prune_heads) lets new calls run on a
// copy of the old values while it waits for the running ones, then
// publishes the new values: every call sees one state or the other, whole.
// Writing parameters in place (an optimiser, the non-const W_q() ... W_o()
// accessors, parameters()) is not synchronised, as in PyTorch: do it while
// no call runs.
//
// Each weight is packed for the matrix products once per version and the
// packing reused by every call (LazyLinear::packed_weight). Every write mha
// sees makes a new version: load_state_dict, pruning, mha's optimisers
// (ParamRef::written), the non-const accessors. After writing through a
// pointer kept from earlier (parameters()'s values, weight().data()), call
// parameters_written(), or the next calls would read the old packing.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mha/attention.h"
#include "mha/context.h"
#include "mha/detail/head_layout.h"
#include "mha/detail/instance_id.h"
#include "mha/detail/published.h"
#include "mha/kv_cache.h"
#include "mha/linear.h"
#include "mha/masks.h"
#include "mha/parameter.h"
#include "mha/precision.h"
#include "mha/rotary.h"
#include "mha/random.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha {

namespace nn {
struct AttentionContext;  // what a call keeps for attention_weights() and backward()
}

// Parameters by the d2l chapter's state-dict names: "W_q.weight", ..., "W_o.bias".
using StateDict = std::map<std::string, Tensor>;

// The d2l chapter's MultiHeadAttention module (see the file comment).
class MultiHeadAttention {
 public:
  // num_hiddens must be a positive multiple of num_heads; 0 <= dropout <= 1;
  // otherwise mha::Error naming the argument. `seed` drives the lazy
  // initialisation and the dropout masks. Nothing is allocated until the
  // first call.
  MultiHeadAttention(int64_t num_hiddens, int64_t num_heads, float dropout = 0.0f,
                     bool bias = false, uint64_t seed = 0);

  // queries:[B,Q,Dq] keys:[B,K,Dk] values:[B,K,Dv]; valid_lens none, (B,) or
  // (B,Q) -> [B,Q,num_hiddens]. Throws mha::Error on mismatched shapes, bad
  // lengths, input widths that differ from the first call's, or sizes
  // whose tensors overflow 64 bits or exceed mha::memory_limit(); a call
  // that throws changes nothing. NaN or infinity in the inputs or weights
  // propagates as in the d2l chapter's PyTorch code (docs/errors.md).
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                 const ValidLens& valid_lens = {});
  // The same with nn.MultiheadAttention's masks beside valid_lens
  // (mha/masks.h CallMasks: key_padding_mask (B, K), attn_mask (Q, K) or
  // (B*h, Q, K), causal). With any mask set, masked scores are -inf (lengths
  // included) and a row with no live key gets masks.fully_masked_rows; the
  // attention weights and backward() honour the masks too.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                 const ValidLens& valid_lens, const CallMasks& masks);
  // The output and the call's context (mha/context.h): its backward and its
  // weights come from the context, not from the module, which keeps nothing
  // of the call (attention_weights() and backward(grad) still see the last
  // forward()).
  struct ForwardResult {
    Tensor output;           // [B, Q, num_hiddens]
    ForwardContext context;  // differentiable in training mode
  };
  // forward() that returns the call's context instead of keeping it (above).
  ForwardResult forward_with_context(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                     const ValidLens& valid_lens = {}, const CallMasks& masks = {});
  // --- Cached decoding (src/nn/module_caches.cpp; mha/kv_cache.h) ---
  // A cache for this module: batch_size rows of max_len positions, each
  // head's projected keys and values (num_heads() heads of head_dim()).
  // Throws mha::Error on sizes that are not positive or storage above
  // mha::memory_limit(); nothing is allocated then.
  // window >= 0: a ring buffer of window + max_len slots per row for calls
  // with a sliding window whose left side is at most `window` and at most
  // max_len new positions per call: memory O(window) for any sequence
  // length (mha/kv_cache.h).
  KVCache kv_cache(int64_t batch_size, int64_t max_len, KVCacheDtype dtype = KVCacheDtype::Float32,
                   int64_t window = -1) const;
  // queries:[B,n,Dq] keys:[B,n,Dk] values:[B,n,Dv] (the n new positions;
  // self-attention passes one tensor three times) -> [B,n,num_hiddens]:
  // projects only the new positions, appends their keys and values to
  // `cache` after each row's last position, and attends each new query over
  // the row's cached positions and the new ones up to itself. Equal to the
  // d2l chapter's decoder step over the concatenated inputs. Evaluation mode
  // only (mha::Error in training mode); leaves attention_weights() as it
  // was. A call that throws leaves the cache as it was. Attention runs on
  // the decode kernel (a long prefill on the fused kernel, kernels/dispatch.h)
  // whatever kernel() says.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, KVCache& cache);
  // The same with the chapter's valid_lens, (B,) or (B, n): over each row's
  // key axis (cached positions, then the n new ones), key j of new query i
  // takes part iff j < its length and j is not after the query itself; the
  // others get the -1e6 fill (a length of 0 gives uniform weights over the
  // row's keys), as the chapter's decoder loop with these lengths.
  //   window: a sliding window (mha/masks.h Window) over each row's keys,
  // new query i at its row's position (cached length + i): it also sees
  // only keys from that position - window.left on (window.right is moot
  // beside causality); as an uncached causal call with the window.
  //   scores: softcap, ALiBi and sinks (mha/masks.h ScoreOptions), ALiBi's
  // distances from each new query's position, each sink once in every new
  // query's denominator; as the uncached call's.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens,
                 KVCache& cache, const Window& window = {}, const ScoreOptions& scores = {});

  // Same as forward(), as the d2l chapter calls it: attention(X, Y, Y, valid_lens).
  Tensor operator()(const Tensor& queries, const Tensor& keys, const Tensor& values,
                    const ValidLens& valid_lens = {}) {
    return forward(queries, keys, values, valid_lens);
  }

  // Training mode (dropout on) when `on`, else evaluation mode. Calls that
  // have already started keep the mode they started with.
  void train(bool on = true) { training_.set(on); }
  // Evaluation mode: dropout off.
  void eval() { train(false); }
  // True in training mode.
  bool training() const { return training_.get(); }

  // [B,h,Q,K]: the softmax weights (before dropout) of the last call to
  // finish, as a copy (another thread's call may replace them at any time).
  // Empty before the first call. With the fused kernel (the default) they
  // are computed on first access, not by forward(): forward() keeps the
  // projected q and k and two floats per (b, head, query) instead, and the
  // first access costs about half of the call's attention work plus the
  // B*h*Q*K floats of the result. Other kernels form them during forward().
  Tensor attention_weights() const;
  // [rows, heads, Q, K]: the weights of some batch rows and heads only, in the
  // order given, without forming the others.
  Tensor attention_weights(const std::vector<int64_t>& batch_rows,
                           const std::vector<int64_t>& heads) const;
  // B of the last call to finish (0 before the first).
  int64_t last_batch_size() const;

  // The parameters by the d2l chapter's names; weights are (out, in) as in PyTorch.
  // Only initialised layers appear (a lazy layer has no weight yet).
  StateDict state_dict() const;
  // Requires exactly the names this module has (biases iff bias=true), with
  // W_q/W_k/W_v weights (inner_dim, in) and W_o (num_hiddens, inner_dim)
  // (inner_dim = num_hiddens unless heads were pruned); fixes the lazy input widths. Nothing changes if any check fails; a
  // failed check throws mha::Error naming the parameter and its shape.
  // Waits for calls running on other threads.
  void load_state_dict(const StateDict& state);

  // Fixes the lazy input widths as a first call with queries (., ., dq),
  // keys (., ., dk) and values (., ., dv) would, drawing the same numbers.
  void initialize(int64_t dq, int64_t dk, int64_t dv);

  // --- Training (src/nn/multihead_backward.cpp) ---
  struct InputGrads {
    Tensor queries, keys, values;  // [B,Q,Dq], [B,K,Dk], [B,K,Dv]
    // [num_heads]: d loss / d the call's sinks (ScoreOptions::sinks, a
    // learned per-head parameter the caller keeps); empty when it had none.
    // ({}: initialisers of the three inputs alone stay complete.)
    Tensor sinks{};
  };
  // grad_output:[B,Q,num_hiddens], the gradient of the last forward's output
  // -> the gradients of its queries, keys and values. Adds the parameters'
  // gradients into grads(). The last forward must have run in training mode.
  InputGrads backward(const Tensor& grad_output);
  // The same for the call of `context` (from forward_with_context of this
  // module, in training mode, with the parameters it ran with).
  InputGrads backward(const ForwardContext& context, const Tensor& grad_output);
  // Sets every accumulated gradient to zero (PyTorch's zero_grad(set_to_none=False)).
  void zero_grad();
  // Accumulated gradients by state-dict name, shaped like the parameters
  // (zeros before any backward); only initialised layers appear.
  const StateDict& grads();
  // Replaces gradients by name (names and shapes as grads()).
  void set_grads(const StateDict& grads);
  // (name, value, gradient) of every initialised parameter, in the d2l chapter's
  // parameters() order: W_q, W_k, W_v, W_o, each weight before its bias.
  ParamList parameters();
  // Marks every parameter written in place: the next call repacks the
  // weights (see the file comment). mha's optimisers mark what they write.
  void parameters_written();
  // [B,h,Q,K]: the dropout multipliers of the last forward, 0 or 1/(1-p);
  // all ones when that call had no dropout (evaluation mode or p = 0).
  Tensor last_dropout_mask() const;


  // The implementation that computes attention (default: Fused); calls that
  // have already started keep theirs.
  void set_kernel(AttentionKernel k) { kernel_.set(k); }
  // The implementation in use.
  AttentionKernel kernel() const { return kernel_.get(); }
  // The number format of the projections' products and of q, k, v
  // (mha/precision.h; default Float32). BFloat16 keeps parameters,
  // gradients and optimiser steps in float32; cached calls (kv_cache) run
  // it too. Calls that have already started keep theirs.
  void set_precision(Precision p) { precision_.set(p); }
  // The number format in use (set_precision).
  Precision precision() const { return precision_.get(); }
  // Rotary position embeddings on the projected q and k (mha/rotary.h);
  // off by default (dims = 0). Checked against head_dim(). Calls that have
  // already started keep theirs; cached calls (kv_cache) number positions
  // from each row's cached length. Not in state_dict() (no parameters).
  void set_rotary(const Rotary& r);
  // The rotary embedding in use (dims = 0: off).
  Rotary rotary() const;
  // Restart the generator behind initialisation and dropout from `s`.
  void seed(uint64_t s);

  // --- Head gates and pruning (src/nn/prune.cpp; files: mha/prune.h) ---
  // A gate per head (default 1) multiplies that head's output before W_o:
  //   out = (concat * gate of each column's head) W_o^T + b_o
  // Gates are not parameters: they are in neither state_dict(), grads() nor
  // parameters(), so optimisers never move them and state dicts stay the
  // d2l chapter's. backward() adds dL/dgate into head_gate_grad(), zeroed by
  // zero_grad(). Acts around the kernel, so every AttentionKernel works.
  // Setting gates waits for running calls, as load_state_dict does.
  std::vector<float> head_gates() const;
  void set_head_gates(const std::vector<float>& gates);  // num_heads() finite values
  const Tensor& head_gate_grad() const { return params_.live().heads.gate_grad; }  // [num_heads]
  // Removes heads for good: their rows of W_q, W_k, W_v (and biases) and
  // their columns of W_o. `heads` are numbered as the module was built
  // (0 .. original_num_heads()-1), so numbers stay valid across calls. After
  // pruning, num_heads() = kept heads, head_dim() is unchanged, q/k/v and
  // the heads' concatenation are inner_dim() = num_heads() * head_dim() wide
  // (W_q:[inner, Dq], W_o:[num_hiddens, inner]) and the output stays
  // num_hiddens() wide. At least one head must remain. Works on a lazy
  // module too (the layers are then built narrower). Gates of kept heads
  // stay; accumulated gradients and the last call's saved state are cleared.
  // Waits for running calls; prune while no call runs if other threads read
  // num_heads() or kept_heads().
  void prune_heads(const std::vector<int64_t>& heads);
  const std::vector<int64_t>& kept_heads() const { return params_.live().heads.kept; }  // ascending, as built
  // h as the module was built, before any pruning.
  int64_t original_num_heads() const { return params_.live().heads.original; }
  // The width of q, k, v and of the heads' concatenation: num_heads * head_dim.
  int64_t inner_dim() const { return params_.live().inner_dim(); }
  // The attention dropout probability, in [0, 1].
  void set_dropout(float p);

  // p_o in the d2l chapter: the width of the output (and of every projection
  // unless heads were pruned: see inner_dim()).
  int64_t num_hiddens() const { return num_hiddens_; }
  // h, the number of heads (those kept, once pruned).
  int64_t num_heads() const { return params_.live().num_heads; }
  // d = num_hiddens / num_heads as built, the width of one head.
  int64_t head_dim() const { return params_.live().heads.head_dim; }
  // The probability of dropping an attention weight in training mode.
  float dropout() const { return dropout_.get(); }
  // True when the four projections have biases.
  bool has_bias() const { return bias_; }

  // The projections (PyTorch names). The non-const ones let an optimiser
  // or a test change the parameters: not while a call runs.
  LazyLinear& W_q() { return params_.live().W_q; }
  LazyLinear& W_k() { return params_.live().W_k; }  // keys' projection, writable
  LazyLinear& W_v() { return params_.live().W_v; }  // values' projection, writable
  LazyLinear& W_o() { return params_.live().W_o; }  // output projection, writable
  const LazyLinear& W_q() const { return params_.live().W_q; }  // queries' projection
  const LazyLinear& W_k() const { return params_.live().W_k; }  // keys' projection
  const LazyLinear& W_v() const { return params_.live().W_v; }  // values' projection
  const LazyLinear& W_o() const { return params_.live().W_o; }  // output projection

 private:
  // What calls read: the projections and the heads (their numbers, gates
  // and gate gradients), replaced whole by what changes them.
  struct Params {
    LazyLinear W_q, W_k, W_v, W_o;
    detail::HeadLayout heads;
    int64_t num_heads = 0;  // kept heads
    int64_t inner_dim() const { return num_heads * heads.head_dim; }
    bool initialized() const { return W_q.initialized() && W_k.initialized() && W_v.initialized() && W_o.initialized(); }
  };
  using Pinned = std::shared_ptr<const Params>;
  // backward() on a call's record with the parameters `p`.
  InputGrads backward_of(const nn::AttentionContext& ctx, const Params& p, const Tensor& grad_output);
  // A forward: the output and the call's record, which becomes the last call
  // (state_) when `publish`.
  std::pair<Tensor, std::shared_ptr<nn::AttentionContext>> run(const Tensor& queries, const Tensor& keys,
                                                               const Tensor& values, const ValidLens& valid_lens,
                                                               const CallMasks& masks, bool publish);
  // The first call's lazy initialisation (input widths from these inputs);
  // returns the parameters it published.
  Pinned initialize_for(const char* op, const Tensor& queries, const Tensor& keys, const Tensor& values);
  // mha::Error unless the inputs' widths are those of initialised layers.
  static void check_widths(const Params& p, const Tensor& queries, const Tensor& keys, const Tensor& values);

  int64_t num_hiddens_;
  bool bias_;
  detail::Relaxed<float> dropout_;
  detail::Relaxed<bool> training_{true};
  detail::Relaxed<AttentionKernel> kernel_{AttentionKernel::Fused};
  detail::Relaxed<Precision> precision_{Precision::Float32};
  detail::Latest<const Rotary> rotary_;  // null: off
  detail::KeyStream dropout_keys_;  // one key per training-mode call
  Generator gen_;                   // the lazy initialisation's; only writers touch it
  detail::Published<Params> params_;
  // The last call to finish (src/nn/attention_engine.h): its projections,
  // heads' outputs, lengths, its weights or the statistics they are
  // recomputed from, and, in training mode, what backward() needs.
  detail::Latest<nn::AttentionContext> state_;
  // prune_heads() discarded the last call (state_ is empty since): what the
  // accessors of the last call say then.
  detail::Relaxed<bool> pruned_last_call_{false};
  // Buffers of replaced states, for the next call to reuse (no page faults or
  // zeroing of fresh memory: ~10% of a B8 L512 forward).
  detail::Latest<std::vector<Tensor>> spare_;
  // Accumulated gradients; training is one thread's business.
  StateDict grads_;
  void ensure_grads();
  detail::InstanceId id_;  // recorded by the calls' contexts
};

}  // namespace mha
