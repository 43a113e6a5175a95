// tools/bench_masks.h: `mha bench --masks` (tools/bench_masks.cpp), the
// fused kernel with causal and key padding masks against no mask.
#pragma once

#include <vector>

namespace mha::tools {

// Prints, per thread count, masked / unmasked times of the fused kernel
// alone and of TorchMultiheadAttention on the Fused and BLAS kernels.
void run_mask_bench(const std::vector<int>& threads, double budget);

}  // namespace mha::tools
