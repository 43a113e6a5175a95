// src/nn/cached_attention.h: a cached call of either module (mha/kv_cache.h).
//
//   queries:[rows_n, Dq] keys:[rows_n, Dk] values:[rows_n, Dv]   (n new positions, rows in the layout)
//     q = queries W_q^T (+b)   k = keys W_k^T (+b)   v = values W_v^T (+b)     (nn/projections.h)
//     k, v appended to the cache after each batch row's last position
//     concat = heads(attention of q over each row's cached keys, causal within the new block)
//     out = (concat * head gates) W_o^T (+b)                                   [rows_n, Dout]
//
// The attention is kernels::decode_forward's (kernels/params.h), reading
// the cache in place, float32 or bfloat16; query i of the n new ones sees the
// row's earlier positions and new positions 0..i, less what valid_lens or
// key_padding_mask take away. Evaluation mode only: the modules refuse a
// cached call in training mode.
#pragma once

#include <cstdint>

#include "kernels/params.h"
#include "mha/kv_cache.h"
#include "mha/masks.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"
#include "nn/attention_engine.h"
#include "nn/kv_cache.h"

namespace mha::nn {

struct CachedCall {
  const char* op = "";  // the public operation, for error messages
  CacheOwner who;       // the module (its Hkv and d are the call's)
  RowLayout layout;     // B and the order of rows
  int64_t n = 0;        // new positions per batch row
  int64_t H = 0;        // query heads
  Shape out_shape;      // [rows_n, Dout] in the layout
  // The d2l chapter's valid lengths, (B,) or (B, n) over each row's key axis
  // (cached, then new); none by default. Checked here.
  ValidLens valid_lens;
  // nn.MultiheadAttention's key_padding_mask, (B, S) or (S,) when
  // `unbatched`, S = the longest row's length after the append; none by
  // default. Its shape is checked here (it depends on the cache's lengths).
  Mask key_padding_mask;
  bool unbatched = false;
  // What masked scores become, and what a query with no key left gets: the
  // chapter's -1e6 and uniform weights, or the drop-in's -inf and policy.
  kernels::MaskFill fill = kernels::MaskFill::Seed;
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;
  // The module's precision (mha/precision.h): in BFloat16 the projections
  // are bfloat16 products and the new q, k, v are rounded to bfloat16
  // before they are cached and attended, as in an uncached call.
  Precision precision = Precision::Float32;
  // Rotary position embeddings (mha/rotary.h): the new positions of row b
  // are numbered from its cached length, and the cache keeps rotated keys.
  Rotary rotary;
  // A sliding window (mha/masks.h), FlashAttention's convention over each
  // row's keys (cached, then new), intersected with causality: query i of
  // the n new ones sits at its row's position K - n + i. Checked here.
  Window window;
  // Softcapping and ALiBi (mha/masks.h), ALiBi's distances from each new
  // query's position. Checked here.
  ScoreOptions scores;
};

// The call (file comment). Shapes and widths must already be checked against
// the layers; the cache is checked here (CacheAccess::check_call), and the
// memory the call allocates against mha::memory_limit(), before anything is
// written: a call that throws leaves the cache as it was. layers.bias_k,
// bias_v and zero_row must be unset.
Tensor cached_attention_forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                const EngineLayers& layers, const CachedCall& call, KVCache& cache);

}  // namespace mha::nn
