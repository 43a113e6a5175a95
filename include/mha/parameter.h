// mha/parameter.h: a trainable parameter as optimisers see it.
//
// Modules hand out their parameters as (name, value, gradient) triples that
// point into the module; an optimiser updates `value` from `grad` in place.
// The pointers stay valid as long as the module lives and is not moved.
//
//   for (mha::ParamRef& p : attention.parameters())   // "W_q.weight", ...
//     std::printf("%s %s\n", p.name.c_str(), mha::shape_str(p.value->shape()).c_str());
#pragma once

#include <string>
#include <vector>

#include "mha/tensor.h"

namespace mha {

// One trainable parameter: its name, and pointers to its value and gradient
// inside the module that owns them.
struct ParamRef {
  std::string name;      // the state-dict name
  // The parameter itself, updated in place by an optimiser.
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // same shape as *value; accumulated by backward()
};

// A module's parameters, in the module's order (e.g. the d2l chapter's
// parameters(): W_q, W_k, W_v, W_o, weight before bias).
using ParamList = std::vector<ParamRef>;

}  // namespace mha
