// src/kernels/attention_fused.h: the fused CPU attention kernel's extra surface.
//
// attention_forward_fused takes the same AttentionForward as every kernel and
// can also save, per (b, head, query), the two softmax statistics from which
// the weights (attention_weights_fused) and the gradients
// (attention_backward_fused) are recomputed without ever storing a (Q, K)
// matrix:
//   t_k      = score_k * log2(e), with masked keys at kMaskFill * log2(e)
//   row_max2 = max_k t_k             over the keys the kernel included
//   row_sum  = sum_k 2^(t_k - row_max2)
//   weight_k = 2^(t_k - row_max2) / row_sum
// The kernel works in base 2 (exp2 is the cheaper vector exponential), and the
// statistics stay in base 2 so that a row of masked keys (valid length 0,
// every t_k equal to the fill) recomputes to exactly uniform weights.
// Keys a kernel skips are the masked keys of rows whose largest unmasked
// score exceeds the fill by more than 104 (150 in base 2): their weights are
// exactly 0 in float32, in the seed as here.
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv], row_max2/row_sum:[B,h,Q]
//
// What it reads: k rows only below the largest length of the batch row's
// queries; v rows also beyond that only for queries whose masked keys carry
// weight (valid length 0, or scores within 104 of the fill), or for rows the
// caller flags (FusedForwardOptions). Callers that skip projecting padded
// rows rely on this (nn/padding.h). The backward reads the same rows.
//
// It honours every mask option and grouped heads (kernels/features.h) on key
// axes up to kFusedMaxKeys (callers route longer ones to the BLAS kernel;
// asserted). Causality, lengths and the last kept key of a key_keep row fold
// into one key limit per query, so tiles past it are skipped; other masks
// run a masking pass over each score tile. A fully masked row
// (kernels/masked_row.h) gets the policy and the statistics row_max2 = -inf,
// row_sum = 1, from which the weights and the backward recompute it.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_backward.h"
#include "kernels/attention_params.h"

namespace mha::kernels {

// 2^(t - row_max2) underflows to 0 in float32 once t - row_max2 < -150; the
// kernel skips masked keys when their fill is that far below the row's max.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kMaskFill2 = kMaskFill * kLog2e;
inline constexpr float kUnderflow2 = 150.0f;

struct SoftmaxStats {
  float* row_max2 = nullptr;  // [B,h,Q]
  float* row_sum = nullptr;   // [B,h,Q]
};

// The longest key axis the fused kernels take (they compare key indices as
// float32, exact below 2^24); callers use another kernel past it.
inline constexpr int64_t kFusedMaxKeys = int64_t{1} << 24;

// Per-call options of the fused forward.
struct FusedForwardOptions {
  // [B] or null: batch rows whose every key the kernel must read, masked or
  // not, because some value row past the lengths is not finite: the seed
  // multiplies it by weight 0, and 0 * NaN reaches the row's outputs. All
  // their k and v rows must be valid.
  const uint8_t* read_all_keys = nullptr;
};

// The fused forward: online softmax over key tiles, linear memory. Fills
// p.weights too when it is set (a second pass from the statistics). NaN and
// infinities propagate as in the seed (a NaN or +inf score makes its row NaN;
// NaN in a value read with weight 0 makes the output NaN), except from value
// rows past every length, which it does not read unless told to.
void attention_forward_fused(const AttentionForward& p, SoftmaxStats stats = {},
                             FusedForwardOptions options = {});

// Weights of a subset of (batch row, head) pairs from a fused forward's
// statistics, by the same tile kernel:
//   q:[B,h,Q,d] k:[B,hkv,K,d] stats:[B,h,Q] -> out:[rows.size(), heads.size(), Q, K]
struct AttentionWeightsParams {
  TensorView q, k;
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;  // [B] or [B,Q]
  float scale_divisor = 1.0f;
  MaskOptions masks;            // the forward call's
  const float* row_max2 = nullptr;  // [B,h,Q]
  const float* row_sum = nullptr;   // [B,h,Q]
  std::vector<int64_t> batch_rows;  // each in [0, B)
  std::vector<int64_t> heads;       // each in [0, h)
  float* out = nullptr;             // [rows, heads, Q, K] contiguous
};
void attention_weights_fused(const AttentionWeightsParams& p);

// The fused backward: gradients of q, k, v from the statistics a fused
// forward saved (recomputing P tile by tile, never a (Q, K) matrix), in
// memory linear in the lengths, with p.masks and grouped heads as the forward
// had them. p.out (the forward's output) is required; p.weights and p.lse
// are ignored.
//   q:[B,h,Q,d] k,v:[B,hkv,K,d|dv] grad_out,out:[B,h,Q,dv] stats:[B,h,Q]
//     -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
void attention_backward_fused(const AttentionBackward& p, const float* row_max2,
                              const float* row_sum);

// n[b*Q + q] = #{k < K : float(k) < length(b, q)}: how many keys query q of
// row b sees (K when unmasked). K must be at most 2^24.
std::vector<int32_t> valid_key_counts(LengthKind kind, const float* lens, int64_t B, int64_t Q,
                                      int64_t K);

// Which vector instruction set the fused kernel uses. Chosen once from the
// CPU (__builtin_cpu_supports); tests force each one the CPU supports.
enum class FusedIsa { Scalar, Avx2, Avx512 };
FusedIsa fused_isa();
FusedIsa fused_best_isa();  // the best one this CPU supports
// Selects `isa` if the CPU supports it; returns whether it did.
bool set_fused_isa(FusedIsa isa);
const char* fused_isa_name(FusedIsa isa);

}  // namespace mha::kernels
