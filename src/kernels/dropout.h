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

// A call over a block of a larger attention (one batch row and head of a
// ring's key block) keys its mask by the larger tensor's flat index, so that
// the blocks together drop what one call over everything would: the call's
// own extents (H, Q, K; its batch rows need none), where its (0, 0, 0, 0)
// sits in the larger tensor, and that tensor's extents. Unset (K = 0): the
// call's own index.
struct DropoutFrame {
  int64_t H = 0, Q = 0, K = 0;          // the call's extents
  int64_t b0 = 0, h0 = 0, q0 = 0, k0 = 0;  // its origin in the larger tensor
  int64_t H_all = 0, Q_all = 0, K_all = 0;  // the larger tensor's extents
};

struct Dropout {
  float p = 0.0f;     // probability of dropping a weight, in [0, 1]
  uint64_t key = 0;   // per-call key
  DropoutFrame frame = {};  // unset: indices are the call's own
  bool active() const { return p > 0.0f; }
  // The index in the larger tensor of the call's flat index x (the kernels
  // index (b, h, q, k) row-major over the call's extents).
  uint64_t framed(uint64_t x) const {
    const DropoutFrame& f = frame;
    const auto K = static_cast<uint64_t>(f.K), Q = static_cast<uint64_t>(f.Q), H = static_cast<uint64_t>(f.H);
    const uint64_t j = x % K, i = (x / K) % Q, h = (x / K / Q) % H, b = x / K / Q / H;
    return ((((b + static_cast<uint64_t>(f.b0)) * static_cast<uint64_t>(f.H_all) + h + static_cast<uint64_t>(f.h0)) *
                 static_cast<uint64_t>(f.Q_all) +
             i + static_cast<uint64_t>(f.q0)) *
                static_cast<uint64_t>(f.K_all) +
            j + static_cast<uint64_t>(f.k0));
  }
  // nn.Dropout scales survivors by 1/(1-p); p = 1 drops everything.
  float survivor_scale() const { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

  // The multiplier of weight number `index` (row-major in (B, h, Q, K)):
  // 0 when dropped, survivor_scale() when kept; 1 when dropout is off.
  float multiplier(uint64_t index) const {
    if (!active()) return 1.0f;
    if (frame.K != 0) index = framed(index);
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
