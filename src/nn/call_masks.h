// src/nn/call_masks.h: nn.MultiheadAttention's masks (mha/masks.h), checked
// and turned into what the engine reads, for both modules.
//
//   key_padding_mask (B, K) [(K,) unbatched], boolean or additive
//   attn_mask (Q, K) or (B*h, Q, K) [(h, Q, K) unbatched], boolean or additive
//   causal: TopLeft (PyTorch's is_causal) or BottomRight
//   window: a sliding window over the K given keys (mha/masks.h Window)
//     -> AttentionMasks over Kt >= K keys (appended keys always take part)
//
// The fill (-inf) and the policy for rows with no live key are set only when
// something masks, so that an unmasked call runs as the d2l chapter's.
#pragma once

#include <cstdint>

#include "mha/masks.h"
#include "nn/attention_engine.h"

namespace mha::nn {

struct MaskGeometry {
  bool batched = true;            // false: an unbatched call (B = 1, masks without the batch axis)
  int64_t B = 0, Q = 0, K = 0, Kt = 0, H = 0;
};

// Throws mha::Error naming `op` for a window side below -1 (build_masks and
// cached calls check with it).
void check_window(const char* op, const Window& window);

// Checks `scores` (ScoreOptions: softcap finite and >= 0, one finite ALiBi
// slope per query head, ALiBi only without appended keys: g.Kt == g.K, one
// finite sink logit per query head) and sets them on `masks`. Throws mha::Error naming `op` and the option.
void add_score_options(const char* op, const ScoreOptions& scores, const MaskGeometry& g, AttentionMasks& masks);

// Throws mha::Error (naming `op` and the mask) for a mask of the wrong shape,
// additive masks whose finite entries sum to +inf, or a window side below -1.
AttentionMasks build_masks(const char* op, const Mask& key_padding_mask, const Mask& attn_mask, Causal causal,
                           const Window& window, FullyMaskedRows policy, const MaskGeometry& g);

}  // namespace mha::nn
