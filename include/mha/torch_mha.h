// mha/torch_mha.h: torch.nn.MultiheadAttention, loaded from its state dict.
//
//   // PyTorch side: the module's state_dict() saved as safetensors (F32).
//   mha::TorchMhaOptions o;
//   o.batch_first = false;                    // as the PyTorch module was built
//   auto attn = mha::TorchMultiheadAttention::from_safetensors("m.safetensors", /*num_heads=*/8, o);
//   attn.eval();
//   auto [out, weights] = attn(query, key, value, key_padding_mask, /*need_weights=*/true);
//   // out:(L, B, E) as PyTorch's; weights:(B, L, S) averaged over heads
//
// Shapes (E = embed_dim, h = num_heads, B batch, L queries, S keys):
//   batch_first:   query (B, L, E)  key (B, S, kdim)  value (B, S, vdim) -> (B, L, E)
//   sequence-first (PyTorch's default): query (L, B, E) ... -> (L, B, E)
//   unbatched:     query (L, E)     key (S, kdim)     value (S, vdim)    -> (L, E)
//   key_padding_mask (B, S) [(S,) unbatched], boolean or additive
//   attn_mask (L, S) or (B*h, L, S) [(h, L, S) unbatched], boolean or additive
//   weights (B, L, S') averaged or (B, h, L, S') per head, always batch-major;
//   S' = S + 1 with bias_k/bias_v, + 1 more with add_zero_attn.
//
// The state dict holds PyTorch's names: in_proj_weight (3E, E) or, when
// kdim/vdim differ from E, q_proj_weight (E, E), k_proj_weight (E, kdim),
// v_proj_weight (E, vdim); in_proj_bias (3E,) and out_proj.bias (E,) when
// the module had bias=True; out_proj.weight (E, E); bias_k and bias_v
// (1, 1, E) when it had add_bias_kv=True. Grouped-query attention (an mha
// extension; PyTorch has none) keeps the same names with num_kv_heads heads
// of width E/h for keys and values: k and v rows are E_kv = num_kv_heads*E/h
// wide, so in_proj_weight is (E + 2 E_kv, E).
//
// Where mha differs from PyTorch 1.13, on purpose:
// - A row whose every key is masked gets FullyMaskedRows (zeros by default,
//   as scaled_dot_product_attention), never NaN (pytorch issue 41508).
// - Causal masking (is_causal, or Causal::BottomRight) is always applied and
//   combines with attn_mask; PyTorch treats is_causal as a hint that it may
//   ignore, and 1.13's module has no is_causal at all.
// - Boolean and additive masks combine by one rule: a pair is masked if any
//   boolean mask masks it, and every additive mask is added. PyTorch turns an
//   additive key_padding_mask into a boolean one (nonzero = masked) when
//   attn_mask is boolean, and refuses two additive masks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "mha/attention.h"
#include "mha/context.h"
#include "mha/detail/head_layout.h"
#include "mha/detail/instance_id.h"
#include "mha/detail/published.h"
#include "mha/kv_cache.h"
#include "mha/linear.h"
#include "mha/masks.h"
#include "mha/multihead.h"
#include "mha/parameter.h"
#include "mha/precision.h"
#include "mha/rotary.h"
#include "mha/random.h"
#include "mha/tensor.h"

namespace mha {

namespace nn {
struct AttentionContext;  // src/nn/attention_engine.h
}

// Construction options: everything nn.MultiheadAttention's constructor takes
// that the state dict does not already say (bias and add_bias_kv are read
// from the names present).
struct TorchMhaOptions {
  // Layout of query/key/value and the output: (B, L, E) when true, (L, B, E)
  // when false (PyTorch's default, and this one's).
  bool batch_first = false;
  int64_t kdim = 0;          // 0: read from the state dict; otherwise checked
  // 0: read from the state dict; otherwise checked.
  int64_t vdim = 0;
  // Append a zero key and value to every sequence, as PyTorch's add_zero_attn.
  bool add_zero_attn = false;
  int64_t num_kv_heads = 0;  // 0: num_heads (no grouping); must divide num_heads
  float dropout = 0.0f;      // on the attention weights, training mode only
  // What a row whose every key is masked gets (PyTorch 1.13 gives NaN).
  FullyMaskedRows fully_masked_rows = FullyMaskedRows::Zeros;
  uint64_t seed = 0;         // dropout masks
};

// One call's masks and outputs, PyTorch's forward() arguments as fields.
struct TorchMhaCall {
  // (B, S), or (S,) unbatched: which keys of each sequence are padding.
  Mask key_padding_mask;
  // Return the attention weights too.
  bool need_weights = true;
  // (L, S), or (B*h, L, S) [(h, L, S) unbatched]: which (query, key) pairs
  // are masked, or what is added to their scores.
  Mask attn_mask;
  // Weights averaged over the heads (B, L, S'), or per head (B, h, L, S').
  bool average_attn_weights = true;
  Causal causal = Causal::None;  // PyTorch's is_causal=True is Causal::TopLeft
  Window window;                 // a sliding window (mha/masks.h), none by default
  ScoreOptions scores;           // softcapping, ALiBi and sinks (mha/masks.h), off by default
  // Hand back the call's context (mha/context.h) in the result: its weights
  // and, in training mode, its backward come from it.
  bool keep_context = false;
};

// The outputs of a call, as PyTorch's (attn_output, attn_weights).
struct TorchMhaResult {
  // Shaped like the query: (B, L, E), (L, B, E) or (L, E).
  Tensor output;
  std::optional<Tensor> weights;  // present iff need_weights
  ForwardContext context;          // the call's, when keep_context asked for it
};

// torch.nn.MultiheadAttention with its state dict's parameters: forward with
// PyTorch's masks and layouts, backward, gradients (see the top of this file).
class TorchMultiheadAttention {
 public:
  // Throws mha::Error naming the parameter on an unknown, missing or
  // misshapen parameter, or on num_heads / num_kv_heads that do not divide.
  static TorchMultiheadAttention from_state_dict(const StateDict& state, int64_t num_heads,
                                                 const TorchMhaOptions& options = {});
  // The same from a safetensors file (F32 tensors by PyTorch's names).
  static TorchMultiheadAttention from_safetensors(const std::string& path, int64_t num_heads,
                                                  const TorchMhaOptions& options = {});

  // query, key, value in the module's layout (shapes at the top of this
  // file) -> output shaped like query, and the weights if asked for. Throws
  // mha::Error, naming the argument and the shape wanted, for a rank other
  // than 2 or 3, inputs of different ranks, a width other than embed_dim /
  // kdim / vdim, batch sizes or key/value lengths that differ, no keys, or a
  // mask of the wrong shape.
  TorchMhaResult forward(const Tensor& query, const Tensor& key, const Tensor& value,
                         const TorchMhaCall& call = {});
  // PyTorch's forward() signature, argument for argument.
  TorchMhaResult operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                            const Mask& key_padding_mask = {}, bool need_weights = true,
                            const Mask& attn_mask = {}, bool average_attn_weights = true,
                            bool is_causal = false);

  // --- Cached decoding (src/nn/module_caches.cpp; mha/kv_cache.h) ---
  // A cache for this module: batch_size rows of max_len positions, each
  // key/value head's projected keys and values (num_kv_heads() heads of
  // head_dim(): grouped heads share them). Throws mha::Error on sizes that
  // are not positive or storage above mha::memory_limit().
  // window >= 0: a ring buffer of window + max_len slots per row for calls
  // with a sliding window whose left side is at most `window` and at most
  // max_len new positions per call: memory O(window) for any sequence
  // length (mha/kv_cache.h).
  KVCache kv_cache(int64_t batch_size, int64_t max_len, KVCacheDtype dtype = KVCacheDtype::Float32,
                   int64_t window = -1) const;
  // query, key, value: the n new positions in the module's layout ((B, n, E)
  // batch_first, (n, B, E) or unbatched (n, E)) -> output shaped like query:
  // the new keys and values are projected and appended to `cache`, and each
  // new query attends over its row's cached positions and the new ones up to
  // itself (Causal::BottomRight over the whole row: causal within the new
  // block). Evaluation mode only; modules with add_bias_kv or
  // add_zero_attn are refused (mha::Error). A call that throws leaves the
  // cache as it was. Attention runs on the decode kernel (a long prefill on
  // the fused kernel, kernels/dispatch.h) whatever kernel() says.
  //   key_padding_mask: as nn.MultiheadAttention's, over the keys the call
  // attends to: (B, S) [(S,) unbatched] with S = the longest row's length
  // after the append (cached + n); row b's columns 0 .. its length - 1 are
  // its keys (cached positions, then the new ones) and later columns are
  // ignored. Boolean (Mask::keep / mask_from_torch_mha) or additive; masked
  // keys drop out (-inf) and a query with no key left gets
  // fully_masked_rows(), as a call without a cache.
  //   window: a sliding window (mha/masks.h Window) over each row's keys, as
  // an uncached call with is_causal and the window gives for the new rows.
  //   scores: softcap, ALiBi and sinks (mha/masks.h ScoreOptions), as the
  // uncached call's (each sink once in every new query's denominator).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, KVCache& cache,
                 const Mask& key_padding_mask = {}, const Window& window = {},
                 const ScoreOptions& scores = {});

  // The parameters by PyTorch's names, in the layout they were loaded in.
  StateDict state_dict() const;

  // --- Training (src/nn/torch_mha_backward.cpp) ---
  // A training-mode forward keeps what the backward needs; backward() then
  // returns the gradients of that call's query, key and value (shaped as
  // they were given) and adds the parameters' gradients into grads(), which
  // accumulate until zero_grad(), as PyTorch's .grad fields do:
  //
  //   attn.train();
  //   auto r = attn(query, key, value, key_padding_mask);
  //   auto g = attn.backward(grad_output);     // g.query, g.key, g.value
  //   attn.grads().at("in_proj_weight");       // (3E, E), like state_dict()
  //
  // The call's masks, causal option, fully-masked policy and dropout mask
  // (recomputed from the call's key) are those of the forward. Rows whose
  // every key is masked pass gradient to nothing but the values (uniform
  // policy) or to nothing at all (zeros), never NaN.
  // The gradients of a call's inputs, each shaped as that input was given.
  struct InputGrads {
    // d loss / d query, d loss / d key, d loss / d value.
    Tensor query, key, value;
    // [num_heads]: d loss / d the call's sinks (ScoreOptions::sinks, a
    // learned per-head parameter the caller keeps); empty when it had none.
    // ({}: initialisers of the three inputs alone stay complete.)
    Tensor sinks{};
  };
  // grad_output: shaped like the last forward's output. Throws mha::Error
  // without a training-mode forward since the last eval-mode one, or when
  // the shape differs.
  InputGrads backward(const Tensor& grad_output);
  // The same for the call of `context` (a result's context, kept with
  // keep_context, from a training-mode call of this module).
  InputGrads backward(const ForwardContext& context, const Tensor& grad_output);
  // Sets every accumulated gradient to zero.
  void zero_grad();
  // The accumulated gradients by PyTorch's names, shaped like state_dict()
  // (in_proj_weight packed when the module was loaded packed).
  StateDict grads() const;
  // (name, value, gradient) of every parameter, for mha's optimisers. When
  // the module was loaded with in_proj_weight/in_proj_bias, their q, k and v
  // rows appear as three parameters each (q_proj_weight, k_proj_weight,
  // v_proj_weight, q_proj_bias, ...): the optimisers update elementwise (and
  // clip by the global norm), so this changes nothing in the arithmetic.
  ParamList parameters();
  // Marks every parameter written in place (after writes through pointers
  // kept from parameters()): the next call repacks the weights, which are
  // packed once per version (LazyLinear::packed_weight). mha's optimisers
  // mark what they write.
  void parameters_written();
  // [B, h, L, S']: the dropout multipliers of the last training-mode call,
  // 0 or 1/(1-p); all ones when it had no dropout.
  Tensor last_dropout_mask() const;

  // Like a torch.nn.Module, a new module is in training mode.
  void train(bool on = true) { training_ = on; }
  // Evaluation mode: no dropout, and forward() keeps nothing for backward().
  void eval() { training_ = false; }
  // True in training mode.
  bool training() const { return training_; }
  // The attention kernel the calls use (mha/attention.h); default Fused.
  // Fused honours every mask option too, skips the keys past a key padding
  // mask's last kept key and the tiles a causal mask removes, forms the
  // weights only when need_weights asks for them, and its backward
  // recomputes them from two floats per query kept by the training-mode
  // forward (docs/masks.md: its gradients are less exact where they cancel).
  void set_kernel(AttentionKernel k) { kernel_ = k; }
  // The attention kernel the calls use.
  AttentionKernel kernel() const { return kernel_; }
  // The number format of the projections' products and of q, k, v
  // (mha/precision.h; default Float32). BFloat16 keeps parameters,
  // gradients and optimiser steps in float32; cached calls (kv_cache) run
  // it too. Calls that have already started keep theirs.
  void set_precision(Precision p) { precision_ = p; }
  // The number format in use (set_precision).
  Precision precision() const { return precision_; }
  // Rotary position embeddings on the projected q and k (mha/rotary.h);
  // off by default. Checked against the head width; the appended bias_k
  // and zero key rows are not rotated.
  void set_rotary(const Rotary& r);
  // The rotary embedding in use (dims = 0: off).
  Rotary rotary() const { return rotary_; }
  // What a row whose every key is masked gets, from the next call on.
  void set_fully_masked_rows(FullyMaskedRows p) { fully_masked_ = p; }
  // What a row whose every key is masked gets.
  FullyMaskedRows fully_masked_rows() const { return fully_masked_; }
  // Restarts the dropout masks' random stream from seed `s`.
  void seed(uint64_t s) {
    gen_.seed(s);
    dropout_keys_.seed(s);
  }

  // E: the width of query and output.
  int64_t embed_dim() const { return embed_dim_; }
  // h: the query heads (those kept, once pruned).
  int64_t num_heads() const { return num_heads_; }
  // The key/value heads (num_heads() without grouping).
  int64_t num_kv_heads() const { return num_kv_heads_; }
  // E / h as built: the width of one head.
  int64_t head_dim() const { return heads_.head_dim; }
  // The width of key.
  int64_t kdim() const { return k_proj_.in_features(); }
  // The width of value.
  int64_t vdim() const { return v_proj_.in_features(); }
  // True when inputs and output are (B, L, E); false for (L, B, E).
  bool batch_first() const { return batch_first_; }
  // True when a zero key and value are appended, as PyTorch's add_zero_attn.
  bool add_zero_attn() const { return add_zero_attn_; }
  // True when the projections have biases (in_proj_bias, out_proj.bias).
  bool has_bias() const { return bias_; }
  // True when bias_k and bias_v are appended to the keys and values.
  bool has_bias_kv() const { return !bias_k_.empty(); }
  // The dropout probability on the attention weights (training mode).
  float dropout() const { return dropout_; }
  // Sets the dropout probability (in [0, 1]) from the next call on; calls
  // already saved for backward() keep theirs. Throws mha::Error otherwise.
  void set_dropout(float p);

  // --- Head gates and pruning (src/nn/torch_mha_prune.cpp), as MultiHeadAttention's ---
  // A gate per head (default 1) multiplies that head's output before
  // out_proj; backward() adds dL/dgate into head_gate_grad() (zeroed by
  // zero_grad()), the gradient importance of each head. Gates are not
  // parameters (not in state_dict(), grads() or parameters()).
  std::vector<float> head_gates() const { return heads_.gates; }
  void set_head_gates(const std::vector<float>& gates);  // num_heads() finite values
  const Tensor& head_gate_grad() const { return heads_.gate_grad; }  // [num_heads]
  // Removes heads for good (numbered as built, 0 .. original_num_heads()-1):
  // their rows of the q, k, v projections (and biases, bias_k, bias_v) and
  // their columns of out_proj. The output stays embed_dim wide; at least one
  // head must remain; grouped heads (num_kv_heads < num_heads) cannot be
  // pruned. state_dict() and grads() keep PyTorch's shapes, the pruned heads'
  // rows and columns zero, so that nn.MultiheadAttention loads the result and
  // computes what the pruned module computes; a 3-D attn_mask still has one
  // slice per head as built. Accumulated gradients and the saved call are cleared.
  void prune_heads(const std::vector<int64_t>& heads);
  const std::vector<int64_t>& kept_heads() const { return heads_.kept; }  // ascending, as built
  // h as the module was built, before any pruning.
  int64_t original_num_heads() const { return heads_.original; }

 private:
  TorchMultiheadAttention(int64_t embed_dim, int64_t num_heads, int64_t num_kv_heads, bool bias,
                          const TorchMhaOptions& options);

  int64_t embed_dim_, num_heads_, num_kv_heads_;
  bool bias_;
  bool batch_first_;
  bool add_zero_attn_;
  bool packed_ = true;  // in_proj_weight (true) or q/k/v_proj_weight
  float dropout_;
  FullyMaskedRows fully_masked_;
  bool training_ = true;
  AttentionKernel kernel_ = AttentionKernel::Fused;
  Precision precision_ = Precision::Float32;
  Rotary rotary_;
  Generator gen_;                   // the parameters' initialisation
  detail::KeyStream dropout_keys_;  // one key per training-mode call
  LazyLinear q_proj_, k_proj_, v_proj_, out_proj_;
  Tensor bias_k_, bias_v_;  // (1, 1, E_kv) or empty
  detail::HeadLayout heads_;  // kept heads, gates and their gradients
  detail::InstanceId id_;  // recorded by the calls' contexts

  // The last training-mode forward's save (null after an eval-mode one).
  std::shared_ptr<const nn::AttentionContext> saved_;
  bool pruned_last_call_ = false;  // prune_heads() discarded saved_ (training is one thread's business)
  // Gradients by layer ("q_proj.weight", ..., "out_proj.bias", "bias_k",
  // "bias_v"), made on first use; grads() packs them by PyTorch's names.
  StateDict grads_;
  void ensure_grads();
  // The parameters (get(layer name, parameter) = the parameter) or their
  // gradients by PyTorch's names and shapes (pruned heads as zeros).
  // attn_mask with the slices of the kept heads when it has one per head as
  // built (B batch rows), else attn_mask itself.
  Mask kept_head_slices(const Mask& attn_mask, int64_t B) const;
  // backward() on a call's record.
  InputGrads backward_of(const nn::AttentionContext& ctx, const Tensor& grad_output);
  StateDict by_torch_names(const std::function<Tensor(const char*, const Tensor&)>& get) const;
};

}  // namespace mha
