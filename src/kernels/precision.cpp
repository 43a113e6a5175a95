#include "mha/precision.h"

#include "mha/error.h"

namespace mha {

const char* to_string(Precision p) { return p == Precision::BFloat16 ? "bfloat16" : "float32"; }

Precision parse_precision(const std::string& op, const std::string& name) {
  if (name == "float32" || name == "fp32") return Precision::Float32;
  if (name == "bfloat16" || name == "bf16") return Precision::BFloat16;
  fail(op, "precision: '", name, "' is not a precision; wanted 'float32' ('fp32') or 'bfloat16' ('bf16')");
}

}  // namespace mha
