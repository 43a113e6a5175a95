// src/core/bf16.h: bfloat16, the upper 16 bits of a float32, as mha stores
// (KV caches) and multiplies (Precision::BFloat16 products) it.
#pragma once

#include <cstdint>
#include <cstring>

namespace mha::core {

// A float32 rounded to bfloat16 (nearest, ties to even); NaN stays NaN,
// infinities stay infinite, finite values past bfloat16's largest round to
// infinity (as the hardware's conversions do).
inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// x rounded to the nearest bfloat16, as a float32 (exactly representable).
inline float round_to_bf16(float x) { return from_bf16(to_bf16(x)); }

}  // namespace mha::core
