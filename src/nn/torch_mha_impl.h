// src/nn/torch_mha_impl.h: what TorchMultiheadAttention's forward
// (torch_mha.cpp) and backward (torch_mha_backward.cpp) share: the call's
// geometry, head views of row buffers, the masks as the kernel reads them,
// and what a training-mode forward keeps for the backward.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/dropout.h"
#include "mha/masks.h"
#include "mha/tensor.h"

namespace mha::nn {

// The call's geometry. Rows of every buffer are (b, position) pairs in the
// caller's layout: b-major when batch_first, position-major otherwise (and
// for an unbatched call, B = 1).
struct TorchMhaGeometry {
  bool seq_first = false;
  int64_t B = 0, Q = 0, K = 0, Kt = 0;  // Kt: keys after bias_k/bias_v and the zero key
  int64_t row(int64_t b, int64_t pos, int64_t L) const { return seq_first ? pos * B + b : b * L + pos; }
};

// A buffer of B*L rows of `heads * d` floats, seen as (B, heads, L, d).
TensorView head_view(float* data, const TorchMhaGeometry& g, int64_t L, int64_t heads, int64_t d);

// One call's masks over the Kt keys (appended keys always take part),
// owned, so that a training-mode forward can keep them for the backward.
struct TorchMhaMasks {
  std::vector<uint8_t> key_keep, pair_keep;  // [B,Kt]; [slices,Q,Kt]
  std::vector<float> key_bias, pair_bias;    // [B,Kt]; [slices,Q,Kt]
  int64_t pair_stride_b = 0, pair_stride_h = 0;
  Causal causal = Causal::None;
  bool neg_inf_fill = false;
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

  // The kernel's view, pointing into the vectors above.
  kernels::MaskOptions options() const;
};

// Masks of `call` for geometry g and H query heads; shapes already checked.
// The fill (-inf) and the policy are set only when something masks, so that
// an unmasked call runs on a kernel without those options.
TorchMhaMasks build_masks(const Mask& key_padding_mask, const Mask& attn_mask, Causal causal,
                          const TorchMhaGeometry& g, int64_t H, FullyMaskedRows policy);

// a, b, c stacked along axis 0 (PyTorch's packed in_proj_weight / in_proj_bias
// from the q, k, v parts): [Na, ...], [Nb, ...], [Nc, ...] -> [Na+Nb+Nc, ...].
Tensor concat_rows(const Tensor& a, const Tensor& b, const Tensor& c);

// What a training-mode forward keeps for backward().
struct TorchMhaSaved {
  TorchMhaGeometry g;
  Tensor query, key, value;  // the inputs as given
  Tensor q;                  // [B*Q rows, E]: the projected queries
  std::vector<float> k, v;   // [B*Kt rows, E_kv]: projected keys/values + appended rows
  Tensor concat;             // [B*Q rows, E]: the heads' outputs before out_proj
  Tensor weights;            // [B,H,Q,Kt] before dropout, or empty (the backward recomputes)
  TorchMhaMasks masks;
  kernels::Dropout dropout;
  // [2,B,H,Q]: row_max2 then row_sum of a fused forward (its backward
  // recomputes the weights from them), else empty.
  std::vector<float> stats;
};

}  // namespace mha::nn
