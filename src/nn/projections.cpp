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

// Adds g's products to `batch`; the stacked biases they read go to `keep`.
void project_group(const Group& g, Projected& result, cpu::GemmBatch& batch,
                   std::vector<Tensor>& keep, std::vector<Tensor>* reuse) {
  const Tensor& x = *g.x;
  const int64_t B = x.size(0), L = x.size(1), in = x.size(2);
  const int64_t n = static_cast<int64_t>(g.outs.size());
  const int64_t D = g.outs[0].layer->out_features();
  const int64_t ldc = n * D;
  const bool has_bias = g.outs[0].layer->has_bias();
  Tensor buf = take_buffer({B, L, ldc}, reuse);

  // [W_q; W_v; W_k] (those this input feeds) as one right-hand matrix, read
  // in place (GemmBatch::add_stacked), so that one product reads each input
  // row once; each output element's sum is the same as in a product of its
  // own. Only the biases are stacked (n*D floats).
  Tensor b_stack;
  if (has_bias && n > 1) {
    b_stack = Tensor({n * D});
    for (int64_t o = 0; o < n; ++o)
      std::memcpy(b_stack.data() + o * D, g.outs[static_cast<size_t>(o)].layer->bias().data(),
                  sizeof(float) * D);
  }
  // Rows [row0, row0 + rows) through outputs [o0, o1), written at their
  // column blocks.
  auto product = [&](int64_t row0, int64_t rows, int64_t o0, int64_t o1) {
    if (rows <= 0 || o1 <= o0) return;
    const float* X = x.data() + row0 * in;
    float* C = buf.data() + row0 * ldc + o0 * D;
    if (o1 - o0 == 1) {
      const LazyLinear& layer = *g.outs[static_cast<size_t>(o0)].layer;
      batch.add(rows, D, in, X, in, layer.weight().data(), in, true,
                has_bias ? layer.bias().data() : nullptr, C, ldc);
      return;
    }
    std::vector<std::pair<const float*, int64_t>> weights;
    for (int64_t o = o0; o < o1; ++o) weights.push_back({g.outs[static_cast<size_t>(o)].layer->weight().data(), D});
    batch.add_stacked(rows, in, X, in, weights, has_bias ? b_stack.data() + o0 * D : nullptr, C, ldc);
  };

  bool all_rows = true;
  for (const Output& o : g.outs)
    if (o.rows)
      for (int64_t r : *o.rows) all_rows = all_rows && r >= L;
  if (all_rows) {
    product(0, B * L, 0, n);
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
        product(b * L + lo, hi - lo, 0, o);
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
  if (!b_stack.empty()) keep.push_back(std::move(b_stack));  // read by batch.run()
}

}  // namespace

Projected project_qkv(const Tensor& queries, const Tensor& keys, const Tensor& values,
                      const LazyLinear& W_q, const LazyLinear& W_k, const LazyLinear& W_v,
                      const RowNeeds& needs, std::vector<Tensor>* reuse) {
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
  // Every product of every input in one batch of row blocks: one parallel
  // region for all of them, however many batch rows padding splits them into.
  cpu::GemmBatch batch;
  std::vector<Tensor> stacks;
  for (const Group& g : groups) project_group(g, result, batch, stacks, reuse);
  batch.run();
  return result;
}

Tensor take_buffer(const Shape& shape, std::vector<Tensor>* reuse) {
  if (reuse)
    for (Tensor& t : *reuse)
      if (t.shape() == shape) {
        Tensor out = std::move(t);
        t = Tensor();
        return out;
      }
  return Tensor(shape);
}

void project_rows(const Tensor& x, const LazyLinear& layer, int64_t b, int64_t r0, int64_t r1,
                  const TensorView& dst) {
  const int64_t L = x.size(1), in = x.size(2);
  cpu::parallel_sgemm(r1 - r0, layer.out_features(), in, x.data() + (b * L + r0) * in, in,
                      layer.weight().data(), in, true,
                      layer.has_bias() ? layer.bias().data() : nullptr, dst.ptr(b, r0), dst.stride[1]);
}

}  // namespace mha::nn
