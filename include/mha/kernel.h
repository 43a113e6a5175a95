// mha/kernel.h: which implementation computes attention.
//
// Every module taking a kernel (DotProductAttention, MultiHeadAttention,
// TorchMultiheadAttention) reads this one enum; mha/attention.h includes it.
#pragma once

namespace mha {

// All take the same parameters and give the same results within float32
// rounding; the kernel tests (tests/cpp/kernels) hold them together.
enum class AttentionKernel {
  Reference,  // plain loops, double accumulation: the yardstick
  Blas,       // per-head BLAS products through a (Q, K) score matrix
  Fused,      // online softmax over key tiles: linear memory, padding skipped (default)
};

}  // namespace mha
