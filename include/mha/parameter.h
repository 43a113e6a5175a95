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

struct ParamRef {
  std::string name;      // the state-dict name
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // same shape as *value; accumulated by backward()
};

using ParamList = std::vector<ParamRef>;

}  // namespace mha
