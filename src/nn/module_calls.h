// src/nn/module_calls.h: each module's forward as a function of its layers.
//
// The d2l chapter's MultiHeadAttention and nn.MultiheadAttention's drop-in
// check their arguments and translate them into an engine call
// (nn/attention_engine.h) here, with the layers given: the modules pass
// their own, and mha.torch passes the torch Parameters of each call
// (nn/layer_ref.h), so both run the same checks, masks and output handling
// and a torch call keeps no state in any module.
//
//   chapter:  queries:[B,Q,Dq] keys:[B,K,Dk] values:[B,K,Dv], valid_lens, masks -> [B,Q,Dout]
//   drop-in:  query (B,L,E) | (L,B,E) | (L,E), key, value, TorchMhaCall
//             -> output shaped like query, weights (B,L,S') | (B,h,L,S') if asked
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/params.h"
#include "mha/attention.h"
#include "mha/detail/published.h"
#include "mha/masks.h"
#include "mha/precision.h"
#include "mha/rotary.h"
#include "mha/tensor.h"
#include "mha/torch_mha.h"
#include "mha/valid_lens.h"
#include "nn/attention_engine.h"

namespace mha::nn {

// What a call reads besides its inputs and layers.
struct CallSettings {
  AttentionKernel kernel = AttentionKernel::Fused;
  Precision precision = Precision::Float32;
  Rotary rotary;  // mha/rotary.h; off by default
  bool keep_for_backward = false;  // training mode: the context can run the backward
  bool keep_for_weights = false;   // the context can give any weights later
  kernels::Dropout dropout;        // p and key; inactive when p = 0
  // With dropout.p > 0: the key is drawn from here once the call's checks
  // passed (a call that throws draws none), instead of dropout.key.
  detail::KeyStream* dropout_keys = nullptr;
};

// Sets c.dropout.key from s.dropout_keys (if any): after the call's checks.
void draw_dropout_key(EngineCall& c, const CallSettings& s);

// --- the d2l chapter's module ---

// The engine call of the chapter's forward with H heads of width d and an
// output Dout wide: mha::Error naming `op` for inputs that are not (B, Q, D*)
// with matching batch sizes and key counts, no keys, bad lengths or masks.
EngineCall chapter_call(const char* op, const Tensor& queries, const Tensor& keys, const Tensor& values,
                        const ValidLens& valid_lens, const CallMasks& masks, int64_t H, int64_t d, int64_t Dout,
                        const CallSettings& settings);
// mha::Error naming `op` unless the inputs' widths are the layers' input
// widths (layers lazy in a module are checked by the module).
void check_chapter_widths(const char* op, const EngineLayers& layers, const Tensor& queries, const Tensor& keys,
                          const Tensor& values);

// --- nn.MultiheadAttention's drop-in ---

// The drop-in's geometry besides its layers.
struct TorchMhaShape {
  int64_t embed_dim = 0;  // E, query's width
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool batch_first = false;
  FullyMaskedRows fully_masked = FullyMaskedRows::Zeros;
};

struct TorchMhaForward {
  TorchMhaResult result;                     // output, weights if asked (after dropout, averaged if asked)
  std::shared_ptr<AttentionContext> context;  // the call's
};

// nn.MultiheadAttention's forward on `layers` (bias_k/bias_v and zero_row
// included): the shape checks, masks (call.attn_mask has one slice per head
// in `layers`), the engine, and PyTorch's weights (after dropout, averaged
// over heads when asked). Throws mha::Error naming `op`. Buffers come from
// `reuse` where one fits (nn/projections.h take_buffer).
TorchMhaForward torch_mha_forward(const char* op, const TorchMhaShape& shape, const EngineLayers& layers,
                                  const Tensor& query, const Tensor& key, const Tensor& value,
                                  const TorchMhaCall& call, const CallSettings& settings,
                                  std::vector<Tensor>* reuse = nullptr);

}  // namespace mha::nn
