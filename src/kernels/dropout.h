// src/kernels/dropout.h: counter-based dropout on attention weights.
//
// Every kernel draws the keep/drop decision of weight (b, head, q, k) from a
// hash of (key, flat index) instead of a sequential stream. The decision is
// therefore the same in every kernel, in any order, at any thread count, and
// the backward pass recomputes the forward's mask from the key alone instead
// of storing a (B, h, Q, K) tensor. The key is drawn once per forward call from
// the module's seedable Generator.
#pragma once

#include <cstdint>

namespace mha::kernels {

struct Dropout {
  float p = 0.0f;     // probability of dropping a weight, in [0, 1]
  uint64_t key = 0;   // per-call key
  bool active() const { return p > 0.0f; }
  // nn.Dropout scales survivors by 1/(1-p); p = 1 drops everything.
  float survivor_scale() const { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

  // The multiplier of weight number `index` (row-major in (B, h, Q, K)):
  // 0 when dropped, survivor_scale() when kept; 1 when dropout is off.
  float multiplier(uint64_t index) const {
    if (!active()) return 1.0f;
    // SplitMix64's finaliser over a Weyl step of the index: a bijective,
    // well-mixed hash, so neighbouring indices give independent-looking bits.
    uint64_t z = key + (index + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * 0x1.0p-24f;  // [0, 1)
    return u < p ? 0.0f : survivor_scale();
  }
};

}  // namespace mha::kernels
