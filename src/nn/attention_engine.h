// src/nn/attention_engine.h: the one attention engine both modules run on.
//
// MultiHeadAttention (the d2l chapter's module) and TorchMultiheadAttention
// (nn.MultiheadAttention's drop-in) are adapters over this: they check and
// translate their arguments into an EngineCall, and the engine does the rest,
// the same way for both:
//
//   queries:[rows_q, Dq] keys:[rows_k, Dk] values:[rows_k, Dv]   (rows in the call's RowLayout)
//     q = queries W_q^T (+b)   k = keys W_k^T (+b), then bias_k / a zero row    [B*Kt rows, Hkv*d]
//                              v = values W_v^T (+b), then bias_v / a zero row
//     concat = heads(attention(q, k, v; lengths, masks, dropout))              [B*Q rows, H*d]
//     out = (concat * head gates) W_o^T (+b)                                   [B*Q rows, Dout]
//
// 1. plans which key and value rows attention reads (nn/row_plan.h: rows past
//    every length or past the last kept key are neither projected nor read),
// 2. projects q, k, v with one product per distinct input (nn/projections.h),
//    appends bias_k / bias_v and zero rows,
// 3. runs the chosen kernel into the heads' concatenation, in the caller's row
//    layout (heads are strided views: no transposes),
// 4. applies the head gates and W_o,
// and returns the output and an AttentionContext: what attention_weights()
// and the backward need from this call. attention_backward() mirrors it.
#pragma once

#include <cstdint>
#include <memory>
#include <atomic>
#include <mutex>  // std::once_flag
#include <vector>

#include "core/memory.h"
#include "kernels/params.h"
#include "mha/attention.h"
#include "mha/context.h"
#include "mha/linear.h"
#include "mha/masks.h"
#include "mha/precision.h"
#include "mha/rotary.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"
#include "nn/layer_ref.h"
#include "nn/projections.h"

namespace mha::nn {

// The layers of one call (a module's, or weights passed with the call); read,
// never written, by the call.
struct EngineLayers {
  LayerRef q;  // W_q:[H*d, Dq]
  LayerRef k;  // W_k:[Hkv*d, Dk]
  LayerRef v;  // W_v:[Hkv*d, Dv]
  LayerRef o;  // W_o:[Dout, H*d]
  // [Hkv*d] each, or null: a key and a value row appended after the K given
  // positions of every batch row (PyTorch's add_bias_kv).
  const float* bias_k = nullptr;
  const float* bias_v = nullptr;
  bool zero_row = false;  // a zero key and value row after those (add_zero_attn)
  // [H] or null (all 1): each head's output is scaled by its gate before W_o.
  const float* head_gates = nullptr;
};

// Masks beyond the d2l chapter's valid lengths, owned, so that a context can
// keep them for its backward. Over the Kt keys of the projected rows (the
// appended keys take part unless a mask says otherwise).
struct AttentionMasks {
  std::vector<uint8_t> key_keep, pair_keep;  // [B,Kt]; [slices,Q,Kt]
  std::vector<float> key_bias, pair_bias;    // [B,Kt]; [slices,Q,Kt]
  int64_t pair_stride_b = 0, pair_stride_h = 0;
  Causal causal = Causal::None;
  Window window;  // over the K given keys (the kernel's keys when Kt == K)
  float softcap = 0.0f;              // MaskOptions::softcap (0: off)
  std::vector<float> alibi_slopes;   // [H] or empty: MaskOptions::alibi_slopes
  std::vector<float> sinks;          // [H] or empty: MaskOptions::sinks
  bool neg_inf_fill = false;  // masked scores are -inf (PyTorch) instead of -1e6 (the d2l chapter)
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

  bool any() const {
    return !key_keep.empty() || !pair_keep.empty() || !key_bias.empty() || !pair_bias.empty() ||
           causal != Causal::None || window.any();
  }
  // The kernel's view, pointing into the vectors above.
  kernels::MaskOptions options() const;
};

// One call, as the engine runs it.
struct EngineCall {
  const char* op = "";       // the public operation, for error messages
  const char* inputs = "";   // how it names its inputs ("queries, keys and values")
  RowLayout layout;          // B and the order of rows
  int64_t Q = 0, K = 0;      // query positions; given key positions
  int64_t H = 0, Hkv = 0, d = 0;  // query heads, key/value heads (dividing H), head width
  Shape out_shape;           // the output's shape ([B*Q rows, Dout] in the layout)
  ValidLens lens;            // the d2l chapter's valid lengths (checked)
  AttentionMasks masks;
  AttentionKernel kernel = AttentionKernel::Fused;
  // BFloat16 (mha/precision.h): the projections' products (W_q, W_k, W_v,
  // W_o, forward and backward) in bfloat16, and q, k, v rounded to bfloat16
  // once projected; the attention kernel then runs as in float32 on them.
  Precision precision = Precision::Float32;
  // Rotary position embeddings on q and the K given keys (mha/rotary.h);
  // off by default. Appended key rows (bias_k, zero_row) are not rotated.
  Rotary rotary;
  kernels::Dropout dropout;  // p and key; inactive outside training
  bool need_weights = false;      // return every (B, H, Q, Kt) weight (before dropout)
  bool keep_for_backward = false;  // the context keeps what attention_backward() needs
  bool keep_for_weights = false;   // the context can give any weights later

  int64_t Kt(const EngineLayers& l) const { return K + (l.bias_k ? 1 : 0) + (l.zero_row ? 1 : 0); }
};

// What a forward keeps (see the file comment); its backward and its weights
// come from it alone and the layers.
struct AttentionContext {
  RowLayout layout;
  int64_t Q = 0, K = 0, Kt = 0, H = 0, Hkv = 0, d = 0;
  float scale_divisor = 1.0f;
  Rotary rotary;  // the call's (q and k were rotated; the backward rotates their gradients back)
  AttentionKernel kernel = AttentionKernel::Fused;
  Precision precision = Precision::Float32;
  ValidLens lens;
  AttentionMasks masks;
  kernels::Dropout dropout;
  std::vector<uint8_t> read_all_keys;  // [B] or empty: rows the fused kernel read in full
  Projected proj;                      // q:(B,H,Q,d) k,v:(B,Hkv,Kt,d) views (empty when not needed)
  Tensor concat;                       // [B*Q rows, H*d]: W_o's input (after the gates)
  Tensor ungated;                      // the heads' outputs before the gates; empty when all are 1
  std::vector<float> stats;            // [2,B,H,Q]: row_max2 then row_sum of a fused forward
  Tensor queries, keys, values;        // the inputs (for the backward; empty otherwise)
  bool for_backward = false;
  uint64_t owner = 0;                  // the module that ran the call (detail::InstanceId)

  // [B,H,Q,Kt] before dropout, once `have_all`: formed by forward() when it
  // had them anyway (have_all is then set before the context is shared),
  // else once, by the first all_weights() (weights_once; have_all is set,
  // with release, after `weights` is written).
  mutable std::once_flag weights_once;
  mutable std::atomic<bool> have_all{false};
  mutable Tensor weights;

  int64_t B() const { return layout.B; }
  // The heads' outputs as the kernel wrote them (the backward's `out`).
  const Tensor& heads_out() const { return ungated.empty() ? concat : ungated; }
};

// The record of `context` for the backward of module `owner`, which has H
// heads now: mha::Error naming `op` when the context is empty, comes from
// another module, ran in evaluation mode, or has another number of heads.
const AttentionContext& differentiable_context(const char* op, const ForwardContext& context, uint64_t owner,
                                               int64_t H);

// The large buffers of a context nobody reads any more (projections, the
// heads' concatenation, the kept inputs), for a later call's `reuse`.
std::vector<Tensor> release_buffers(AttentionContext& ctx);

// Adds everything a call allocates to `plan` (before anything is).
void add_call_memory(core::MemoryPlan& plan, const EngineCall& call, const EngineLayers& layers, int64_t Dout);

struct EngineOutput {
  Tensor output;   // call.out_shape
  Tensor weights;  // [B,H,Q,Kt] before dropout when need_weights, else empty
  std::shared_ptr<AttentionContext> context;
};

// concat:[rows, H*d] *= each head's gate (gates:[H] or null: all 1), in
// place; a no-op when every gate is 1. Both the forward and cached calls
// (nn/cached_attention.h) gate this way.
void apply_head_gates(Tensor& concat, const float* gates, int64_t H, int64_t d);
// Whether gates (null: none) are all 1.
bool gates_are_ones(const float* gates, int64_t H);

// The forward (file comment). The layers must be initialised with the inputs'
// widths; every shape must already be checked. Buffers are taken from
// `reuse` where one fits (nn/projections.h take_buffer). Throws mha::Error
// when finite inputs and parameters overflow float32.
EngineOutput attention_forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                               const EngineLayers& layers, EngineCall call,
                               std::vector<Tensor>* reuse = nullptr);

// Where the backward adds the parameters' gradients (shaped as the
// parameters; null: not wanted).
struct LinearGrads {
  Tensor* weight = nullptr;
  Tensor* bias = nullptr;
};
struct EngineGrads {
  LinearGrads q, k, v, o;
  Tensor* bias_k = nullptr;      // [Hkv*d] elements
  Tensor* bias_v = nullptr;
  Tensor* head_gates = nullptr;  // [H]
};
struct EngineInputGrads {
  Tensor queries, keys, values;  // shaped as the inputs
  Tensor sinks;                  // [H]: the call's sinks' gradient; empty when it had none
};

// grad_output (shaped as the forward's output) -> the inputs' gradients; adds
// the parameters' gradients into `grads`. ctx must have been kept for the
// backward; the layers are those of the forward, unchanged. Scratch buffers
// come from `reuse` where one fits, and go back to it.
EngineInputGrads attention_backward(const AttentionContext& ctx, const EngineLayers& layers,
                                    const Tensor& grad_output, const EngineGrads& grads,
                                    std::vector<Tensor>* reuse = nullptr);

// [B, H, Q, Kt]: every weight, computed on the first call (thread-safe), as a copy.
Tensor all_weights(const AttentionContext& ctx);
// [rows.size(), heads.size(), Q, Kt]: those batch rows' and heads' weights,
// from the stored ones or recomputed by the fused kernel. Indices valid.
Tensor weights_of(const AttentionContext& ctx, const std::vector<int64_t>& rows,
                  const std::vector<int64_t>& heads);
// The same two after checking the memory limit and the indices (mha::Error
// naming `op`; `which` names the call in messages, e.g. "the last call").
Tensor checked_all_weights(const char* op, const AttentionContext& ctx);
Tensor checked_weights_of(const char* op, const char* which, const AttentionContext& ctx,
                          const std::vector<int64_t>& rows, const std::vector<int64_t>& heads);
// [B, H, Q, Kt]: the call's dropout multipliers, 0 or 1/(1-p) (all 1 without).
Tensor dropout_mask(const AttentionContext& ctx);

}  // namespace mha::nn
