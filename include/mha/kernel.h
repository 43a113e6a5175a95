// mha/kernel.h: which implementation computes attention.
//
// Every module taking a kernel (DotProductAttention, MultiHeadAttention,
// TorchMultiheadAttention) reads this one enum; mha/attention.h includes it.
#pragma once

namespace mha {

// All take the same parameters and give the same results within float32
// rounding; the kernel tests (tests/cpp/kernels) hold them together.
// The default differs by class: Fused for DotProductAttention and
// MultiHeadAttention, Blas for TorchMultiheadAttention (mha/torch_mha.h),
// which runs Fused only when set_kernel asks for it. With Fused chosen, the
// modules still take the BLAS path past 2^24 keys, where the fused kernel's
// float key indices would be inexact.
enum class AttentionKernel {
  Reference,  // plain loops, double accumulation: the yardstick
  Blas,       // per-head BLAS products through a (Q, K) score matrix
  Fused,      // online softmax over key tiles: linear memory, padding skipped
};

}  // namespace mha
