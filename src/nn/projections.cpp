#include "nn/projections.h"

#include <algorithm>
#include <cstring>

#include "cpu/parallel_gemm.h"

namespace mha::nn {

namespace {

bool same_tensor(const Tensor& a, const Tensor& b) {
  return &a == &b || (a.data() == b.data() && a.shape() == b.shape());
}

struct Output {
  const LazyLinear* layer;
  const std::vector<int64_t>* rows;  // rows needed per batch row; null: all
  TensorView* view;
};

struct Group {
  const Tensor* x;
  std::vector<Output> outs;  // in the order q, v, k
};

// C rows of `rows` flat input rows through the first `n_outs` stacked layers:
// C = bias + X W^T, written at row stride ldc.
void stacked_product(const float* X, int64_t rows, int64_t in, const float* W, const float* bias,
                     int64_t n_cols, float* C, int64_t ldc) {
  if (rows <= 0) return;
  if (bias)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(C + r * ldc, bias, sizeof(float) * n_cols);
  cpu::parallel_sgemm(false, true, rows, n_cols, in, 1.0f, X, in, W, in, bias ? 1.0f : 0.0f, C, ldc);
}

void project_group(const Group& g, Projected& result) {
  const Tensor& x = *g.x;
  const int64_t B = x.size(0), L = x.size(1), in = x.size(2);
  const int64_t n = static_cast<int64_t>(g.outs.size());
  const int64_t D = g.outs[0].layer->out_features();
  const int64_t ldc = n * D;
  const bool has_bias = g.outs[0].layer->has_bias();
  Tensor buf({B, L, ldc});

  // [W_q; W_v; W_k] (those this input feeds), copied once per call: D*in
  // floats each, against the product's rows*D*in multiply-adds.
  const float* W = g.outs[0].layer->weight().data();
  const float* bias = has_bias ? g.outs[0].layer->bias().data() : nullptr;
  Tensor w_stack, b_stack;
  if (n > 1) {
    w_stack = Tensor({n * D, in});
    if (has_bias) b_stack = Tensor({n * D});
    for (int64_t o = 0; o < n; ++o) {
      const LazyLinear& layer = *g.outs[static_cast<size_t>(o)].layer;
      std::memcpy(w_stack.data() + o * D * in, layer.weight().data(), sizeof(float) * D * in);
      if (has_bias) std::memcpy(b_stack.data() + o * D, layer.bias().data(), sizeof(float) * D);
    }
    W = w_stack.data();
    bias = has_bias ? b_stack.data() : nullptr;
  }

  bool all_rows = true;
  for (const Output& o : g.outs)
    if (o.rows)
      for (int64_t r : *o.rows) all_rows = all_rows && r >= L;
  if (all_rows) {
    stacked_product(x.data(), B * L, in, W, bias, n * D, buf.data(), ldc);
  } else {
    std::vector<int64_t> need(static_cast<size_t>(n));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t o = 0; o < n; ++o) {
        const Output& out = g.outs[static_cast<size_t>(o)];
        int64_t r = out.rows ? std::clamp<int64_t>((*out.rows)[static_cast<size_t>(b)], 0, L) : L;
        if (o > 0) r = std::min(r, need[static_cast<size_t>(o - 1)]);  // needs only shrink
        need[static_cast<size_t>(o)] = r;
      }
      // Rows [need[o], need[o-1]) feed outputs 0..o-1; rows below need[n-1]
      // feed all n.
      for (int64_t o = n; o >= 1; --o) {
        const int64_t lo = o < n ? need[static_cast<size_t>(o)] : 0;
        const int64_t hi = need[static_cast<size_t>(o - 1)];
        const int64_t row0 = b * L + lo;
        stacked_product(x.data() + row0 * in, hi - lo, in, W, bias, o * D, buf.data() + row0 * ldc,
                        ldc);
      }
    }
  }

  for (int64_t o = 0; o < n; ++o) {
    TensorView& v = *g.outs[static_cast<size_t>(o)].view;
    v.data = buf.data() + o * D;
    v.rank = 3;
    v.shape[0] = B; v.stride[0] = L * ldc;
    v.shape[1] = L; v.stride[1] = ldc;
    v.shape[2] = D; v.stride[2] = 1;
  }
  result.buffers.push_back(std::move(buf));  // the heap block, and so the views, stay put
}

}  // namespace

Projected project_qkv(const Tensor& queries, const Tensor& keys, const Tensor& values,
                      const LazyLinear& W_q, const LazyLinear& W_k, const LazyLinear& W_v,
                      const RowNeeds& needs) {
  Projected result;
  const Output wanted[] = {
      {&W_q, nullptr, &result.q},
      {&W_v, needs.v_rows.empty() ? nullptr : &needs.v_rows, &result.v},
      {&W_k, needs.k_rows.empty() ? nullptr : &needs.k_rows, &result.k},
  };
  const Tensor* inputs[] = {&queries, &values, &keys};
  std::vector<Group> groups;
  for (int i = 0; i < 3; ++i) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return same_tensor(*g.x, *inputs[i]); });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{inputs[i], {}});
    it->outs.push_back(wanted[i]);
  }
  for (const Group& g : groups) project_group(g, result);
  return result;
}

void project_rows(const Tensor& x, const LazyLinear& layer, int64_t b, int64_t r0, int64_t r1,
                  const TensorView& dst) {
  const int64_t L = x.size(1), in = x.size(2);
  stacked_product(x.data() + (b * L + r0) * in, r1 - r0, in, layer.weight().data(),
                  layer.has_bias() ? layer.bias().data() : nullptr, layer.out_features(),
                  dst.ptr(b, r0), dst.stride[1]);
}

}  // namespace mha::nn
