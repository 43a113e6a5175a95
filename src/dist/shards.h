// src/dist/shards.h: where a head shard's parameters sit in the full
// module's, for HeadParallelAttention, GridAttention and RingAttention's head groups.
//
// A shard owns a contiguous range of heads, that is columns [first, first +
// width) of the model: rows of W_q/k/v and of their biases, columns of W_o.
// W_o.bias is not sharded (every shard holds the full one).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "mha/multihead.h"
#include "mha/tensor.h"

namespace mha::dist {

// The shape of the state-dict tensor `name` shaped like `like` when its
// heads span `width` columns of the model (width = num_hiddens: the full
// module's).
inline Shape shard_shape(const std::string& name, const Tensor& like, int64_t width) {
  Shape shape = like.shape();
  if (name != "W_o.bias") shape[name == "W_o.weight" ? 1 : 0] = width;
  return shape;
}

// Writes the shard tensor `part` of `name` (heads over columns [first, first
// + width)) into the full module's tensor `full`; W_o.bias is not sharded
// and not written.
inline void place_shard(const std::string& name, int64_t first, int64_t width, const Tensor& part, Tensor& full) {
  if (name == "W_o.bias") return;
  if (name == "W_o.weight") {  // [rows, width] -> columns [first, first + width) of [rows, num_hiddens]
    const int64_t rows = full.size(0), stride = full.size(1);
    for (int64_t o = 0; o < rows; ++o)
      std::copy(part.data() + o * width, part.data() + (o + 1) * width, full.data() + o * stride + first);
  } else {  // rows [first, first + width) of a weight (width x in) or a bias
    const int64_t row = part.dim() == 2 ? part.size(1) : 1;
    std::copy(part.data(), part.data() + part.numel(), full.data() + first * row);
  }
}

// The state dict of heads [first, first + count) of a module whose heads are
// d wide: their rows of W_q, W_k, W_v (and biases), their columns of W_o;
// W_o's bias kept when `output_bias`, else zero.
inline StateDict slice_heads(const StateDict& full, int64_t first, int64_t count, int64_t d, bool output_bias) {
  StateDict part;
  const int64_t r0 = first * d, n = count * d;
  for (const auto& [name, t] : full) {
    if (name == "W_o.weight") {
      const int64_t rows = t.size(0), cols = t.size(1);
      Tensor w({rows, n});
      for (int64_t o = 0; o < rows; ++o) std::copy(t.data() + o * cols + r0, t.data() + o * cols + r0 + n, w.data() + o * n);
      part[name] = w;
    } else if (name == "W_o.bias") {
      part[name] = output_bias ? t : Tensor(t.shape());
    } else {  // a weight (rows x in) or a bias (rows)
      const int64_t width = t.dim() == 2 ? t.size(1) : 1;
      Shape shape = t.shape();
      shape[0] = n;
      Tensor w(shape);
      std::copy(t.data() + r0 * width, t.data() + (r0 + n) * width, w.data());
      part[name] = w;
    }
  }
  return part;
}

}  // namespace mha::dist
