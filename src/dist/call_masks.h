// src/dist/call_masks.h: the CallMasks of the ring's and the grid's older
// forward(..., causal, fully_masked) overloads, made in one place.
#pragma once

#include "mha/masks.h"

namespace mha::dist {

// Causal masking and the fully-masked policy alone, every other mask off.
inline CallMasks causal_call_masks(Causal causal, FullyMaskedRows fully_masked) {
  CallMasks masks;
  masks.causal = causal;
  masks.fully_masked_rows = fully_masked;
  return masks;
}

}  // namespace mha::dist
