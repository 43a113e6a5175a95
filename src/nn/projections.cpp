#include "nn/projections.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>

#include "core/bf16.h"
#include "core/parallel.h"
#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/threads.h"
#include "nn/rotary.h"

namespace mha::nn {

TensorView RowLayout::heads(float* data, int64_t L, int64_t heads, int64_t d, int64_t ld) const {
  TensorView v;
  v.data = data;
  v.rank = 4;
  v.shape[0] = B; v.stride[0] = seq_first ? ld : L * ld;
  v.shape[1] = heads; v.stride[1] = d;
  v.shape[2] = L; v.stride[2] = seq_first ? B * ld : ld;
  v.shape[3] = d; v.stride[3] = 1;
  return v;
}

namespace {

bool same_tensor(const Tensor& a, const Tensor& b) {
  return &a == &b || (a.data() == b.data() && a.shape() == b.shape());
}

struct Output {
  const LayerRef* layer;
  const std::vector<int64_t>* rows;  // rows needed per batch row; null: all
  TensorView* view;
  int64_t heads;
  bool rotate;  // rotary on this output's rows (q and k)
};

// The rotary epilogue of one product (cpu::RowEpilogue): the product writes
// buffer rows [c_row, c_row + M) of a buffer of Lb positions per batch row;
// each finished piece of rows is rotated while still in L2, instead of a
// separate pass over the q and k buffers afterwards (which reads them back
// from memory): rotary's cost over the projections alone went from +11.0 to
// +5.6 ms at B8 L512 E768 h12 and from +13.3 to +3.0 ms at B1 L4096 E512 h8
// (one thread, loaded machine; numbers and how in cpu/gemm/gemm_schedule.h);
// at two threads (load 4-6) from +52 to +6 ms and from +56 to +15 ms (the
// separate pass's own parallel regions wait for a busy core).
//
// The table is built per call, not cached per module: it took 0.10 ms (B8
// L512, d 64) and 0.9 ms (L4096) at one thread, against ~85 and ~37 ms for
// the projections alone and ~280 and ~400 ms for the module's forward.
struct RotaryEpilogue {
  const RotaryTable* table;
  RowLayout layout;
  int64_t Lb, c_row, heads, d;
  const int64_t* first;  // [B] or null

  static void run(const void* ctx, float* C, int64_t ldc, int64_t r0, int64_t rows) {
    const RotaryEpilogue& e = *static_cast<const RotaryEpilogue*>(ctx);
    const int64_t B = e.layout.B;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t R = e.c_row + r0 + r;  // the buffer row
      const int64_t b = e.layout.seq_first ? R % B : R / e.Lb;
      const int64_t pos = e.layout.seq_first ? R / B : R % e.Lb;
      e.table->rotate_heads(C + r * ldc, e.heads, e.d, pos + (e.first ? e.first[b] : 0), /*inverse=*/false);
    }
  }
};

// One input and the outputs it feeds, in the order q, v, k.
struct Group {
  const Tensor* x;
  int64_t L;   // the input's positions per batch row
  int64_t Lb;  // the buffer's positions per batch row (>= L)
  std::vector<Output> outs;
};

// Adds g's products to `batch`; the packed weights they read go to `keep`.
// `table`: the call's rotary table (for the outputs that rotate); their
// epilogues go to `epilogues`, read by batch.run().
void project_group(const Group& g, const ProjectionShape& s, Projected& result, cpu::GemmBatch& batch,
                   std::vector<std::shared_ptr<const cpu::PackedWeight>>& keep, std::vector<Tensor>* reuse,
                   const RotaryTable& table, std::deque<RotaryEpilogue>& epilogues) {
  const Tensor& x = *g.x;
  const int64_t B = s.layout.B, L = g.L, Lb = g.Lb, in = x.size(-1);
  const int64_t n = static_cast<int64_t>(g.outs.size());
  std::vector<int64_t> col(static_cast<size_t>(n + 1), 0);  // column offsets of the outputs
  for (int64_t o = 0; o < n; ++o)
    col[static_cast<size_t>(o + 1)] = col[static_cast<size_t>(o)] + g.outs[static_cast<size_t>(o)].layer->out_features();
  const int64_t ldc = col[static_cast<size_t>(n)];
  Tensor buf = take_buffer({B * Lb, ldc}, reuse);

  // Each layer's weight packed once per version (LazyLinear::packed_weight),
  // so no call copies a weight; its outputs go to their column block of the
  // shared buffer.
  // (A decode step's products of one row read the weights in place instead,
  // so they pack nothing.)
  std::vector<const cpu::PackedWeight*> packed(g.outs.size(), nullptr);
  auto packed_of = [&](int64_t o) -> const cpu::PackedWeight& {
    const cpu::PackedWeight*& w = packed[static_cast<size_t>(o)];
    if (!w) {
      keep.push_back(g.outs[static_cast<size_t>(o)].layer->packed_weight(s.precision));
      w = keep.back().get();
    }
    return *w;
  };
  // Input rows [x_row, x_row + rows) through outputs [o0, o1), written at
  // buffer rows [c_row, ...) in their column blocks.
  auto product = [&](int64_t x_row, int64_t c_row, int64_t rows, int64_t o0, int64_t o1) {
    if (rows <= 0) return;
    const float* X = x.data() + x_row * in;
    for (int64_t o = o0; o < o1; ++o) {
      const Output& out = g.outs[static_cast<size_t>(o)];
      const LayerRef& layer = *out.layer;
      float* C = buf.data() + c_row * ldc + col[static_cast<size_t>(o)];
      cpu::RowEpilogue epilogue;
      if (out.rotate && table.enabled()) {
        epilogues.push_back({&table, s.layout, Lb, c_row, out.heads, s.d, s.rotary_first});
        epilogue = {&RotaryEpilogue::run, &epilogues.back()};
      }
      if (s.few_rows_as_dots && cpu::dot_products_serve(rows, s.precision))
        batch.add_dot_products(rows, X, in, layer.weight(), layer.out_features(), in, layer.bias(), C, ldc,
                               epilogue);
      else
        batch.add_packed(rows, X, in, packed_of(o), layer.bias(), C, ldc, epilogue);
    }
  };

  bool all_rows = true;
  for (const Output& o : g.outs)
    if (o.rows)
      for (int64_t r : *o.rows) all_rows = all_rows && r >= L;
  if (!s.layout.batch_major() || (all_rows && Lb == L)) {
    // Position-major: the L given positions of every batch row are the
    // first B*L rows of input and buffer alike. Batch-major without
    // appended rows: the same rows too.
    product(0, 0, B * L, 0, n);
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
        product(b * L + lo, b * Lb + lo, hi - lo, 0, o);
      }
    }
  }

  for (int64_t o = 0; o < n; ++o) {
    const Output& out = g.outs[static_cast<size_t>(o)];
    *out.view = s.layout.heads(buf.data() + col[static_cast<size_t>(o)], Lb, out.heads, s.d, ldc);
  }
  result.buffers.push_back(std::move(buf));  // the heap block, and so the views, stay put
}

}  // namespace

Projected project_qkv(const Tensor& queries, const Tensor& keys, const Tensor& values,
                      const LayerRef& W_q, const LayerRef& W_k, const LayerRef& W_v,
                      const ProjectionShape& s, const RowNeeds& needs, std::vector<Tensor>* reuse) {
  Projected result;
  const bool use_needs = s.layout.batch_major();
  const bool rotate = s.rotary.enabled();
  const Output wanted[] = {
      {&W_q, nullptr, &result.q, s.H, rotate},
      {&W_v, use_needs && !needs.v_rows.empty() ? &needs.v_rows : nullptr, &result.v, s.Hkv, false},
      {&W_k, use_needs && !needs.k_rows.empty() ? &needs.k_rows : nullptr, &result.k, s.Hkv, rotate},
  };
  const Tensor* inputs[] = {&queries, &values, &keys};
  const int64_t positions[] = {s.Q, s.K, s.K};
  const int64_t buffer_positions[] = {s.Q, s.Kt, s.Kt};
  std::vector<Group> groups;
  for (int i = 0; i < 3; ++i) {
    // Outputs share a buffer when they read the same input into the same
    // positions (queries join keys or values only without appended rows).
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return same_tensor(*g.x, *inputs[i]) && g.Lb == buffer_positions[i];
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{inputs[i], positions[i], buffer_positions[i], {}});
    it->outs.push_back(wanted[i]);
  }
  // Every product of every input in one batch of row blocks: one parallel
  // region for all of them, however many batch rows padding splits them into.
  // Rotary: one cos/sin table for the call's positions (q's and the given
  // keys'), read by every rotated row.
  RotaryTable table;
  if (rotate) {
    int64_t p_lo = 0, p_hi = 0;
    rotary_positions(s.rotary_first, s.layout.B, std::max(s.Q, s.K), p_lo, p_hi);
    table = RotaryTable(s.rotary, p_lo, p_hi);
  }
  std::deque<RotaryEpilogue> epilogues;  // read by batch.run() (a deque: pointers stay put)
  cpu::GemmBatch batch(s.precision);
  std::vector<std::shared_ptr<const cpu::PackedWeight>> packed;  // read by batch.run()
  for (const Group& g : groups) project_group(g, s, result, batch, packed, reuse, table, epilogues);
  batch.run();
  return result;
}

void round_to_bf16(Projected& proj) {
  for (Tensor& t : proj.buffers) {
    float* x = t.data();
    const int64_t n = t.numel(), chunk = 1 << 16;
    const int64_t chunks = (n + chunk - 1) / chunk;
    core::parallel_for(chunks, core::team_for(static_cast<double>(n), chunks), [&](int64_t c) {
      for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) x[i] = core::round_to_bf16(x[i]);
    });
  }
}

Tensor take_buffer(const Shape& shape, std::vector<Tensor>* reuse) {
  if (reuse) {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    // Any buffer of that many elements serves (its values are stale either
    // way): a kept input (B, L, E) becomes a gradient's (B*L, E) scratch.
    for (Tensor& t : *reuse)
      if (!t.empty() && t.numel() == n) {
        Tensor out(shape, std::move(t.values()));
        t = Tensor();
        return out;
      }
  }
  return Tensor(shape);
}

void project_rows(const Tensor& x, int64_t L, const LayerRef& layer, int64_t b, int64_t p0, int64_t p1,
                  const TensorView& dst, Precision precision) {
  const int64_t in = x.size(-1);
  layer.forward_rows(x.data() + (b * L + p0) * in, p1 - p0, dst.ptr(b, 0, p0), dst.stride[2], precision);
}

}  // namespace mha::nn
