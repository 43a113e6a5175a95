#include "mha/random.h"

#include <cmath>

namespace mha {

double Generator::normal() {
  // 1 - u keeps the logarithm's argument in (0, 1].
  const double u1 = 1.0 - uniform_double();
  const double u2 = uniform_double();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Generator::below(uint64_t n) {
  // Rejection sampling: accept only words below the largest multiple of n.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = engine_();
  } while (x >= limit);
  return x % n;
}

}  // namespace mha
