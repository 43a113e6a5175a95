// src/cpu/fused/limits.h: the fused kernels' numeric units and limits.
#pragma once

#include <cstdint>

#include "kernels/params.h"

namespace mha::kernels {

// Scores in base 2 (kernels/params.h): t = score * log2(e).
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kMaskFill2 = kMaskFill * kLog2e;
// 2^(t - row_max2) underflows to 0 in float32 once t - row_max2 < -150; the
// kernel skips masked keys when their fill is that far below the row's max.
inline constexpr float kUnderflow2 = 150.0f;

// The longest key axis the fused kernels take (they compare key indices as
// float32, exact below 2^24); kernels::attention_forward runs the BLAS kernel
// past it (kernels::runs_fused).
inline constexpr int64_t kFusedMaxKeys = int64_t{1} << 24;

}  // namespace mha::kernels
