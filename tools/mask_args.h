// tools/mask_args.h: `--causal` and `--window`, the masks beside valid_lens
// that `mha run` and `mha viz` take (mha/masks.h CallMasks; docs/masks.md).
//
//   --causal top-left|bottom-right   query i sees keys j <= i (top left, PyTorch's
//                                    is_causal) or j <= i + K - Q (bottom right)
//   --window LEFT,RIGHT              query i sees keys i + K - Q - LEFT .. i + K - Q + RIGHT
//                                    (FlashAttention's window_size; -1: unbounded side)
//
// With either set, masked scores are -inf and a query left without a key gets
// weights 0 (FullyMaskedRows::Zeros), as in PyTorch's SDPA.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <vector>

#include "mha/mha.h"

namespace mha::tools {

struct MaskArgs {
  Causal causal = Causal::None;
  std::vector<int64_t> window;  // empty, or {left, right}

  // Whether any mask option was given.
  bool any() const { return causal != Causal::None || !window.empty(); }
  // The call's masks.
  CallMasks call_masks() const;
};

// Adds --causal and --window to `cmd`, writing into `args`.
void add_mask_options(CLI::App* cmd, MaskArgs& args);

// Whether query q of Q sees key k of K under `causal` and `window`: the
// rule every kernel applies (docs/masks.md).
bool key_in_range(Causal causal, const Window& window, int64_t q, int64_t Q, int64_t k, int64_t K);

}  // namespace mha::tools
