// src/kernels/features.h: which kernel honours which option of AttentionForward
// and of AttentionBackward.
//
// Every option beyond the seed has a default that means "the seed's
// behaviour", so a kernel written before the option existed is still right
// when the option is unset, and wrong (silently) when it is set. A module
// therefore asks `supports(kernel, p)` before running a kernel and falls back
// to the BLAS path, which honours everything, when the answer is no:
//
//   kernels::attention_forward(kernels::kernel_for(preferred, p), p);
//
// A kernel gains an option by adding its bit to kernel_features() below, in
// the same commit as the code and a test against the reference.
#pragma once

#include <cstdint>

#include "kernels/attention_backward.h"
#include "kernels/attention_params.h"
#include "mha/attention.h"

namespace mha::kernels {

enum Feature : uint32_t {
  kKeyKeep = 1u << 0,        // key_keep
  kKeyBias = 1u << 1,        // key_bias
  kPairKeep = 1u << 2,       // pair_keep with its strides
  kPairBias = 1u << 3,       // pair_bias with its strides
  kCausal = 1u << 4,         // causal != None (both alignments)
  kNegInfFill = 1u << 5,     // fill == NegInf
  kZerosForMasked = 1u << 6, // fully_masked == Zeros
  kGroupedHeads = 1u << 7,   // Hkv() < H()
};
inline constexpr uint32_t kAllFeatures = (1u << 8) - 1;

// The options set away from the seed's defaults, by masks and head counts
// (usable for a backward parameter struct carrying the same MaskOptions).
inline uint32_t features_used(const MaskOptions& m, int64_t H, int64_t Hkv) {
  uint32_t f = 0;
  if (m.key_keep) f |= kKeyKeep;
  if (m.key_bias) f |= kKeyBias;
  if (m.pair_keep) f |= kPairKeep;
  if (m.pair_bias) f |= kPairBias;
  if (m.causal != Causal::None) f |= kCausal;
  if (m.fill == MaskFill::NegInf) f |= kNegInfFill;
  if (m.fully_masked == FullyMaskedRows::Zeros) f |= kZerosForMasked;
  if (Hkv != H) f |= kGroupedHeads;
  return f;
}
inline uint32_t features_used(const AttentionForward& p) { return features_used(p.masks, p.H(), p.Hkv()); }

// The options each kernel implements. A kernel added to AttentionKernel and
// not listed here supports none of them (the switch falls through to 0), so
// the module falls back rather than computing something else.
inline uint32_t kernel_features(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Reference: return kAllFeatures;
    case AttentionKernel::Blas: return kAllFeatures;
    case AttentionKernel::Fused: return kAllFeatures;
    default: break;
  }
  return 0;
}

inline bool supports(AttentionKernel kernel, const AttentionForward& p) {
  return (features_used(p) & ~kernel_features(kernel)) == 0;
}

// `preferred` when it honours every option p uses, else the BLAS path.
inline AttentionKernel kernel_for(AttentionKernel preferred, const AttentionForward& p) {
  return supports(preferred, p) ? preferred : AttentionKernel::Blas;
}

// --- The backward ---
// kernels::attention_backward(k, p) runs k's own backward, or the BLAS one
// for a kernel without a backward (kernels/dispatch.h). This table lists
// what each kernel's own backward honours; a kernel not listed gets 0, so
// attention_backward (which asks kernel_for(k, p) below) runs BLAS for any
// call using an option, rather than dropping a mask from the gradient.
inline uint32_t kernel_backward_features(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Reference: return kAllFeatures;
    case AttentionKernel::Blas: return kAllFeatures;
    // attention_backward_fused (it needs the fused forward's statistics, so
    // kernels::attention_backward, given none, still runs the BLAS one).
    case AttentionKernel::Fused: return kAllFeatures;
    default: break;
  }
  return 0;
}

inline uint32_t features_used(const AttentionBackward& p) { return features_used(p.masks, p.H(), p.Hkv()); }

inline bool supports(AttentionKernel kernel, const AttentionBackward& p) {
  return (features_used(p) & ~kernel_backward_features(kernel)) == 0;
}

// `preferred` when its backward honours every option p uses, else BLAS.
inline AttentionKernel kernel_for(AttentionKernel preferred, const AttentionBackward& p) {
  return supports(preferred, p) ? preferred : AttentionKernel::Blas;
}

}  // namespace mha::kernels
