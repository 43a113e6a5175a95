// src/core/finite.h: finiteness scans for the "finite inputs never give a
// silent NaN" checks of the forward passes (docs/errors.md: overflow rows).
#pragma once

#include <cmath>
#include <cstdint>

#include "mha/tensor.h"

namespace mha::core {

inline bool all_finite(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

inline bool all_finite(const Tensor& t) { return all_finite(t.data(), t.numel()); }

// The largest |x| of a tensor (0 when empty).
inline float max_abs(const Tensor& t) {
  float m = 0.0f;
  const float* p = t.data();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) m = std::fmax(m, std::fabs(p[i]));
  return m;
}

}  // namespace mha::core
