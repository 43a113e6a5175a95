// mha/precision.h: the number format of a module's matrix products.
//
// Float32 (the default) is exact to the d2l chapter's PyTorch code within
// float32 rounding. BFloat16 is the mixed precision of bfloat16 inference
// and training:
// - the four projections (W_q, W_k, W_v, W_o) and their backward products
//   (dW = dy^T x, dx = dy W) round both inputs to bfloat16 (8 bits of
//   mantissa, nearest, ties to even) and sum in float32;
// - the projected q, k and v are rounded to bfloat16 (their gradients pass
//   through the rounding unchanged), and attention runs on them with the
//   chosen kernel as in float32: softmax and its statistics, the weights and
//   the attention backward stay float32; where AMX is usable the fused
//   kernel's forward forms q k^T and the weighted sum on its tiles (float32
//   sums, the weights carried as two bfloat16 parts: within 2e-5 of float32
//   attention on the same q, k, v), without dropout;
// - parameters, biases, gradients as stored and the optimisers' updates of
//   them stay float32 (the bfloat16 copies exist only inside products);
// - cached calls (mha/kv_cache.h) project and round the new positions the
//   same way, so a decoding loop matches uncached calls (to the bound of
//   tests/python/test_bf16.py; their attention kernels differ); the cache's
//   own dtype only sets how it stores the (already rounded) keys and values.
// On CPUs with AMX (AMX-BF16) the bfloat16 products run on its tile units;
// elsewhere on float32 micro-kernels fed with the rounded values (the same
// results but for the order of float32 sums; tests/python/test_bf16.py).
#pragma once

#include <string>

namespace mha {

// The number format of a module's products (see the top of this file).
enum class Precision {
  Float32,   // float32 everywhere: the d2l chapter's numbers (default)
  BFloat16,  // bfloat16 projections and q, k, v; float32 sums and attention
};

// "float32" / "bfloat16".
const char* to_string(Precision p);
// "float32" or "fp32" -> Float32; "bfloat16" or "bf16" -> BFloat16; anything
// else is an error naming `op` and the words accepted.
Precision parse_precision(const std::string& op, const std::string& name);

}  // namespace mha
