// mha/precision.h: the number format of a module's matrix products.
//
// Float32 (the default) is exact to the d2l chapter's PyTorch code within
// float32 rounding. BFloat16 rounds both inputs of every matrix product (the
// projections, the attention scores and the weighted sums, forward and
// backward) to bfloat16 (8 bits of mantissa, nearest, ties to even) and sums
// their products in float32; everything else (softmax and its statistics,
// masks, dropout, biases, gradients as stored, the parameters and the
// optimisers' updates of them) stays float32. On CPUs with AMX (AMX-BF16) the
// products run on its tile units; elsewhere on float32 micro-kernels fed
// with the rounded values (the same bound, tests/python/test_bf16.py).
#pragma once

#include <string>

namespace mha {

enum class Precision { Float32, BFloat16 };

// "float32" / "bfloat16".
const char* to_string(Precision p);
// "float32" or "fp32" -> Float32; "bfloat16" or "bf16" -> BFloat16; anything
// else is an error naming `op` and the words accepted.
Precision parse_precision(const std::string& op, const std::string& name);

}  // namespace mha
