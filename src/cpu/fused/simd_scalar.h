// src/cpu/fused/simd_scalar.h: the fused kernel's portable "vector": four
// floats in plain loops, for CPUs without AVX2. The compiler turns the loops
// into SSE2 where it can; correctness, not speed, is the point of this path.
#pragma once

#include <cmath>

#include "cpu/isa/registers.h"

namespace mha::kernels::fused {

struct Scalar4 : cpu::SseRegisters {  // kRegisters: for the traits' budget
  struct Reg {
    float v[4];
  };
  static constexpr const char* kName = "scalar";

  template <class F>
  static Reg map(F f) {
    Reg r;
    for (int i = 0; i < 4; ++i) r.v[i] = f(i);
    return r;
  }
  static Reg zero() { return set1(0.0f); }
  static Reg set1(float x) { return map([&](int) { return x; }); }
  static Reg load(const float* p) { return map([&](int i) { return p[i]; }); }
  static void store(float* p, Reg x) {
    for (int i = 0; i < 4; ++i) p[i] = x.v[i];
  }
  static Reg add(Reg a, Reg b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
  static Reg sub(Reg a, Reg b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
  static Reg mul(Reg a, Reg b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
  static Reg div(Reg a, Reg b) { return map([&](int i) { return a.v[i] / b.v[i]; }); }
  static Reg rcp(Reg x) { return map([&](int i) { return 1.0f / x.v[i]; }); }  // as the vector versions
  static Reg min(Reg a, Reg b) {
    return map([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; });
  }
  static Reg max(Reg a, Reg b) {
    return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; });
  }
  static Reg fmadd(Reg a, Reg b, Reg c) {
    return map([&](int i) { return a.v[i] * b.v[i] + c.v[i]; });
  }
  static Reg select_lt(Reg a, Reg b, Reg x, Reg y) {
    return map([&](int i) { return a.v[i] < b.v[i] ? x.v[i] : y.v[i]; });
  }
  // 0 below -125, as the vector versions.
  static Reg exp2(Reg x) {
    return map([&](int i) { return x.v[i] < -125.0f ? 0.0f : std::exp2(x.v[i]); });
  }
};

}  // namespace mha::kernels::fused
