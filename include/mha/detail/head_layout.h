// mha/detail/head_layout.h: which heads a module kept, and their gates.
//
// Both modules (MultiHeadAttention, TorchMultiheadAttention) number their
// heads as they were built, gate each head's output before the output
// projection, and can remove heads for good; this is that bookkeeping, once.
// Not part of the API: the modules' headers hold one.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/linear.h"
#include "mha/tensor.h"

namespace mha::detail {

struct HeadLayout {
  int64_t head_dim = 0;        // d, unchanged by pruning
  int64_t original = 0;        // heads as built
  std::vector<int64_t> kept;   // ascending numbers (as built) of the heads that remain
  std::vector<float> gates;    // [kept.size()]: each kept head's gate (default 1)
  Tensor gate_grad;            // [kept.size()]: dL/dgate, accumulated by backward()

  // `heads` heads of width d, all kept, gates 1.
  void init(int64_t heads, int64_t d);
  // Checks new gates (one finite value per kept head); mha::Error naming op.
  void check_gates(const char* op, const std::vector<float>& g) const;
  // Checks that `remove` names distinct kept heads, leaving at least one;
  // returns the positions (in the current layout) of the heads that stay,
  // or an empty vector when `remove` is empty. mha::Error naming op.
  std::vector<int64_t> staying(const char* op, const std::vector<int64_t>& remove) const;
  // Keeps the heads at positions `stay` (with their gates); gradients reset.
  void keep(const std::vector<int64_t>& stay);
  // keep(stay) and the layers to match: q, k, v keep those heads' rows (and
  // biases), o their columns. Uninitialised layers stay so, with the new
  // widths. All four are formed before anything is replaced.
  void keep(const std::vector<int64_t>& stay, const char* op, LazyLinear& q, LazyLinear& k, LazyLinear& v,
            LazyLinear& o);
  bool pruned() const { return static_cast<int64_t>(kept.size()) < original; }
};

// w:[rows, cols] (or [rows]) -> its row blocks [h*d, (h+1)*d) for each h in
// `heads`, in order: [heads.size()*d, cols].
Tensor take_row_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d);
// w:[rows, cols] -> its column blocks [h*d, (h+1)*d) of each h in `heads`.
Tensor take_column_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d);
// The inverse of take_row_blocks into a zero tensor of `rows` rows:
// w:[heads.size()*d, cols] -> [rows, cols] with block i at head heads[i].
Tensor put_row_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d, int64_t rows);
// The inverse of take_column_blocks: w:[rows, heads.size()*d] -> [rows, cols].
Tensor put_column_blocks(const Tensor& w, const std::vector<int64_t>& heads, int64_t d, int64_t cols);

}  // namespace mha::detail
