// mha/random.h: a seedable random generator with a platform-independent stream.
//
// std::mt19937_64 is fully specified by the standard, but the standard
// distributions are not; this class draws its floats and Bernoulli samples
// from the raw 64-bit words itself, so a seed gives the same numbers with any
// compiler and standard library.
#pragma once

#include <cstdint>
#include <random>

namespace mha {

// The library's random source: mt19937_64 and its own distributions.
// Not thread-safe: one generator per thread, or a lock around it.
class Generator {
 public:
  // A generator whose stream is fixed by `seed`.
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  // Restart the stream from `s`.
  void seed(uint64_t s) { engine_.seed(s); }

  // Uniform in [0, 1) with 24 random bits (every float32 step is reachable).
  float uniform() { return static_cast<float>(engine_() >> 40) * 0x1.0p-24f; }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform_double() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller on uniform_double, one value per call).
  double normal();
  // Integer uniform in [0, n), n > 0, without modulo bias.
  uint64_t below(uint64_t n);
  // Raw 64 random bits.
  uint64_t next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

}  // namespace mha
