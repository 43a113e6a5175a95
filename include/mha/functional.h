// mha/functional.h: attention on projected q, k, v, with every mask and score
// option the modules take (mha::attention), for C++ users who project
// themselves (as torch.nn.functional.scaled_dot_product_attention and
// FlashAttention's flash_attn_func serve Python users).
//
//   mha::AttentionOptions o;
//   o.masks.causal = mha::Causal::BottomRight;
//   o.masks.window = {128, 0};                 // Mistral's sliding window
//   o.masks.scores.softcap = 50.0f;            // Gemma 2
//   mha::Tensor out = mha::attention(q, k, v, o);   // [B, H, Q, dv]
//
// Scores are (q . k) * scale (scale 0: 1/sqrt(d)); the score options apply,
// then the masks; a key masked by a length becomes the d2l chapter's -1e6
// when nothing else masks (the chapter's masked_softmax), -inf otherwise,
// and a row with no live key then gets masks.fully_masked_rows. The same
// semantics as MultiHeadAttention::forward with CallMasks (mha/masks.h).
#pragma once

#include "mha/kernel.h"
#include "mha/masks.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha {

// What one mha::attention call masks and scores with, and how it runs; the
// defaults are the d2l chapter's attention (no mask, 1/sqrt(d), fused kernel).
struct AttentionOptions {
  // The d2l chapter's lengths: none, (B,) or (B, Q); key j of query i in row
  // b takes part iff j < length.
  ValidLens valid_lens;
  // key_padding_mask (B, K), attn_mask (Q, K) or (B*H, Q, K) (boolean in
  // mha's keep convention, or additive), causal, window, the fully-masked
  // policy, and the score options (softcap, one ALiBi slope and one sink
  // per query head).
  CallMasks masks;
  // The scores' factor; 0: 1/sqrt(d). Else finite and > 0.
  float scale = 0.0f;
  // Which implementation computes it (mha/kernel.h); every one takes every option.
  AttentionKernel kernel = AttentionKernel::Fused;
};

// q:[B,H,Q,d] k:[B,Hkv,K,d] v:[B,Hkv,K,dv] (Hkv divides H: query head h reads
// key/value head h / (H / Hkv)) -> [B,H,Q,dv]. Throws mha::Error naming the
// argument for shapes that do not fit, no keys, bad lengths, masks or
// options, sizes above mha::memory_limit(), and scores that overflow float32
// from finite inputs. Safe to call from many threads at once.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {});

}  // namespace mha
