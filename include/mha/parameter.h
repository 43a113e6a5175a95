// mha/parameter.h: a trainable parameter as optimisers see it.
//
// Modules hand out their parameters as (name, value, gradient) triples that
// point into the module; an optimiser updates `value` from `grad` in place.
// The pointers stay valid as long as the module lives and is not moved.
// What writes a value in place calls written() afterwards (mha's optimisers
// do): a module keeps copies derived from its weights (each weight packed
// for the matrix products, made once per version, src/cpu/gemm/packed_weight.h)
// and remakes them only when the version says the weight changed.
//
//   for (mha::ParamRef& p : attention.parameters())   // "W_q.weight", ...
//     std::printf("%s %s\n", p.name.c_str(), mha::shape_str(p.value->shape()).c_str());
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "mha/tensor.h"

namespace mha {

// A parameter's version: a number that changes with every write a module
// can see, unique in the process, so that what is derived from the
// parameter's values (a packed copy of a weight) is remade when, and only
// when, the values may have changed. A copy holds the same number as the
// original (they hold the same values until one is written).
class ParamVersion {
 public:
  // A version never held before.
  ParamVersion() : value_(next()) {}
  // The same version as `o` (a copy of the parameter holds the same values).
  ParamVersion(const ParamVersion& o) : value_(o.get()) {}
  // Takes `o`'s version, as the parameter takes its values.
  ParamVersion& operator=(const ParamVersion& o) {
    value_.store(o.get(), std::memory_order_release);
    return *this;
  }
  // The version now.
  uint64_t get() const { return value_.load(std::memory_order_acquire); }
  // Marks the values written: a new version, never held before.
  void bump() { value_.store(next(), std::memory_order_release); }

 private:
  static uint64_t next();  // the process's next unused version
  std::atomic<uint64_t> value_;
};

// One trainable parameter: its name, and pointers to its value and gradient
// inside the module that owns them.
struct ParamRef {
  std::string name;      // the state-dict name
  // The parameter itself, updated in place by an optimiser.
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // same shape as *value; accumulated by backward()
  // The version of the layer that owns the value (null: nothing is derived
  // from it). Bumped by written().
  ParamVersion* version = nullptr;
  // Call after writing *value in place (mha's optimisers do, after each
  // step): the module then repacks the weight before its next call.
  void written() const {
    if (version) version->bump();
  }
};

// A module's parameters, in the module's order (e.g. the d2l chapter's
// parameters(): W_q, W_k, W_v, W_o, weight before bias).
using ParamList = std::vector<ParamRef>;

}  // namespace mha
