// The attention engine's forward, backward and weights (nn/attention_engine.h).
#include "nn/attention_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/finite.h"
#include "core/parallel.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "mha/threads.h"
#include "nn/linear_backward.h"
#include "nn/rotary.h"
#include "nn/row_plan.h"

namespace mha::nn {

kernels::MaskOptions AttentionMasks::options() const {
  kernels::MaskOptions m;
  m.key_keep = key_keep.empty() ? nullptr : key_keep.data();
  m.key_bias = key_bias.empty() ? nullptr : key_bias.data();
  m.pair_keep = pair_keep.empty() ? nullptr : pair_keep.data();
  m.pair_bias = pair_bias.empty() ? nullptr : pair_bias.data();
  m.pair_stride_b = pair_stride_b;
  m.pair_stride_h = pair_stride_h;
  m.causal = causal;
  m.window_left = window.left;
  m.window_right = window.right;
  m.softcap = softcap;
  m.alibi_slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.data();
  m.sinks = sinks.empty() ? nullptr : sinks.data();
  m.fill = neg_inf_fill ? kernels::MaskFill::NegInf : kernels::MaskFill::Seed;
  m.fully_masked = fully_masked;
  return m;
}

bool gates_are_ones(const float* gates, int64_t H) {
  if (!gates) return true;
  for (int64_t h = 0; h < H; ++h)
    if (gates[h] != 1.0f) return false;
  return true;
}

void apply_head_gates(Tensor& concat, const float* gates, int64_t H, int64_t d) {
  if (gates_are_ones(gates, H)) return;
  const int64_t width = H * d, rows = concat.numel() / width;
  float* x = concat.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const float g = gates[h];
      if (g == 1.0f) continue;
      float* col = x + r * width + h * d;
      for (int64_t c = 0; c < d; ++c) col[c] *= g;
    }
}

namespace {

// gated[., h*d + c] = g_h * out[., h*d + c], so
//   dL/dg_h = sum over rows and c of d_gated * out,  dL/dout = g_h * d_gated.
// d_gated becomes dL/dout in place; dL/dg adds into gate_grad (if given).
// Sums in double: a gate's gradient adds rows*d terms.
void gates_backward(const float* gates, const Tensor& heads_out, Tensor& d_gated, int64_t H, int64_t d,
                    Tensor* gate_grad) {
  const int64_t width = H * d, rows = d_gated.numel() / width;
  std::vector<double> sums(static_cast<size_t>(H), 0.0);
  const float* o = heads_out.data();
  float* dg = d_gated.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const float g = gates ? gates[h] : 1.0f;
      const float* oc = o + r * width + h * d;
      float* dc = dg + r * width + h * d;
      double s = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        s += static_cast<double>(dc[c]) * oc[c];
        dc[c] *= g;
      }
      sums[static_cast<size_t>(h)] += s;
    }
  if (gate_grad)
    for (int64_t h = 0; h < H; ++h) gate_grad->data()[h] += static_cast<float>(sums[static_cast<size_t>(h)]);
}

// The appended key/value rows: bias_k / bias_v at position K of every batch
// row, then a zero row (written: the buffer may be a reused one).
void append_rows(const TensorView& view, const float* bias_row, bool zero_row, int64_t K) {
  const int64_t B = view.shape[0], width = view.shape[1] * view.shape[3];
  int64_t pos = K;
  if (bias_row) {
    for (int64_t b = 0; b < B; ++b) std::memcpy(view.ptr(b, 0, pos), bias_row, sizeof(float) * static_cast<size_t>(width));
    ++pos;
  }
  if (zero_row)
    for (int64_t b = 0; b < B; ++b) std::fill(view.ptr(b, 0, pos), view.ptr(b, 0, pos) + width, 0.0f);
}

bool finite_layers(const EngineLayers& l) {
  for (const LayerRef* layer : {&l.q, &l.k, &l.v, &l.o}) {
    if (!core::all_finite(layer->weight(), layer->weight_numel())) return false;
    if (layer->has_bias() && !core::all_finite(layer->bias(), layer->out_features())) return false;
  }
  const int64_t n = l.k.out_features();
  for (const float* row : {l.bias_k, l.bias_v})
    if (row)
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(row[i])) return false;
  return true;
}

// A copy of x in a buffer from `reuse` where one fits: a training step keeps
// its inputs, and fresh pages for them cost ~5% of a B8 L512 step.
Tensor kept_copy(const Tensor& x, std::vector<Tensor>* reuse) {
  Tensor t = take_buffer(x.shape(), reuse);
  std::copy(x.values().begin(), x.values().end(), t.values().begin());
  return t;
}

kernels::AttentionForward forward_params(const AttentionContext& ctx) {
  kernels::AttentionForward p;
  p.q = ctx.proj.q;
  p.k = ctx.proj.k;
  p.v = ctx.proj.v;
  kernels::set_lengths(p, ctx.lens);
  p.scale_divisor = ctx.scale_divisor;
  p.dropout = ctx.dropout;
  p.masks = ctx.masks.options();
  p.read_all_keys = ctx.read_all_keys.empty() ? nullptr : ctx.read_all_keys.data();
  p.precision = ctx.precision;
  if (!ctx.stats.empty()) {
    const size_t n = ctx.stats.size() / 2;
    p.stats = {const_cast<float*>(ctx.stats.data()), const_cast<float*>(ctx.stats.data()) + n};  // read only
  }
  return p;
}

}  // namespace

std::vector<Tensor> release_buffers(AttentionContext& c) {
  std::vector<Tensor> buffers = std::move(c.proj.buffers);
  for (Tensor* t : {&c.concat, &c.queries, &c.keys, &c.values})
    if (!t->empty()) buffers.push_back(std::move(*t));
  return buffers;
}

void add_call_memory(core::MemoryPlan& plan, const EngineCall& call, const EngineLayers& layers, int64_t Dout) {
  const int64_t B = call.layout.B, Kt = call.Kt(layers);
  const bool fused = kernels::runs_fused(call.kernel, Kt);
  // The fused kernel forms no (B, h, Q, K) weights unless asked, only two
  // floats per query (and per thread, one head's keys and values, packed).
  if (fused)
    plan.add("softmax statistics", {2, B, call.H, call.Q});
  if (call.need_weights || (!fused && (call.keep_for_backward || call.keep_for_weights)))
    plan.add("attention weights", {B, call.H, call.Q, Kt});
  plan.add("projected queries", {B, call.Q, call.H * call.d})
      .add("projected keys", {B, Kt, call.Hkv * call.d})
      .add("projected values", {B, Kt, call.Hkv * call.d})
      .add("concatenated heads", {B, call.Q, call.H * call.d})
      .add("output", {B, call.Q, Dout});
}

EngineOutput attention_forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                               const EngineLayers& layers, EngineCall call, std::vector<Tensor>* reuse) {
  const RowLayout& layout = call.layout;
  const int64_t B = layout.B, Q = call.Q, K = call.K, Kt = call.Kt(layers);
  const int64_t H = call.H, Hkv = call.Hkv, d = call.d, E = H * d;
  const bool fused = kernels::runs_fused(call.kernel, Kt);
  const bool keep = call.keep_for_backward || call.keep_for_weights;
  auto ctx = std::make_shared<AttentionContext>();
  AttentionContext& c = *ctx;
  c.layout = layout;
  c.Q = Q, c.K = K, c.Kt = Kt, c.H = H, c.Hkv = Hkv, c.d = d;
  c.scale_divisor = std::sqrt(static_cast<float>(d));
  c.kernel = call.kernel;
  c.precision = call.precision;
  c.rotary = call.rotary;
  c.lens = std::move(call.lens);
  c.masks = std::move(call.masks);
  c.dropout = call.dropout;

  // Projections of the rows the kernel reads (nn/row_plan.h: the fused
  // kernels, forward and backward, never read keys past the lengths or the
  // last kept key; the other kernels read every row).
  const bool masked = !c.lens.is_none() || c.masks.any();
  RowPlan plan = fused ? plan_rows(c.lens, c.masks, layout, Q, K, Kt, values, layers.v) : RowPlan{};
  ProjectionShape shape{layout, Q, K, Kt, H, Hkv, d, call.precision};
  shape.rotary = call.rotary;  // q and the K given keys at positions 0.., rotated in the products' epilogue
  c.proj = project_qkv(queries, keys, values, layers.q, layers.k, layers.v, shape, plan.needs, reuse);
  if (Kt > K) {
    append_rows(c.proj.k, layers.bias_k, layers.zero_row, K);
    append_rows(c.proj.v, layers.bias_v, layers.zero_row, K);
  }
  if (fused && masked) {
    flag_nonfinite_values(plan, c.proj.v, Hkv * d);
    if (!c.masks.neg_inf_fill)
      complete_values_near_fill(c.proj, plan.needs, values, K, layers.v, c.scale_divisor, call.precision);
  }
  if (call.precision == Precision::BFloat16) round_to_bf16(c.proj);
  c.read_all_keys = std::move(plan.read_all_keys);

  // The kernel writes each head's output into its columns of `concat`, so
  // the chapter's transpose_output costs nothing.
  Tensor concat = take_buffer({B * Q, E}, reuse);  // fully written by the kernel
  kernels::AttentionForward p = forward_params(c);
  p.out = layout.heads(concat.data(), Q, H, d, E);
  const bool form_weights = call.need_weights || (!fused && keep);
  if (form_weights) {
    c.weights = Tensor({B, H, Q, Kt});
    p.weights = c.weights.data();
  }
  // The fused kernel keeps its softmax statistics when the call is kept:
  // the weights and the backward are recomputed from them.
  if (fused && keep) {
    c.stats.resize(static_cast<size_t>(2 * B * H * Q));
    const size_t n = static_cast<size_t>(B * H * Q);
    p.stats = {c.stats.data(), c.stats.data() + n};
  }
  if (kernels::attention_forward(call.kernel, p).empty()) c.stats.clear();
  c.have_all = form_weights;

  // Head gates, then W_o.
  if (!gates_are_ones(layers.head_gates, H)) {
    if (call.keep_for_backward) c.ungated = concat;
    apply_head_gates(concat, layers.head_gates, H, d);
  }
  EngineOutput out;
  out.output = take_buffer(call.out_shape, reuse);  // fully written by W_o's product
  layers.o.forward_rows(concat.data(), B * Q, out.output.data(), layers.o.out_features(), call.precision);
  // Finite inputs and parameters whose projections or scores overflow
  // float32 (inputs ~1e20) would give NaN: an error instead. NaN or infinite
  // inputs are computed through, as PyTorch does (docs/errors.md).
  if (!core::all_finite(out.output) && core::all_finite(queries) && core::all_finite(keys) &&
      core::all_finite(values) && finite_layers(layers))
    fail(call.op, "finite ", call.inputs, " and parameters give a projection or score that overflows float32 "
         "(largest input magnitude ", std::fmax(core::max_abs(queries), std::fmax(core::max_abs(keys), core::max_abs(values))),
         "); scale the inputs down");
  c.concat = std::move(concat);

  if (call.need_weights) {
    if (keep) {
      out.weights = c.weights;
    } else {
      out.weights = std::move(c.weights);
      c.have_all = false;
    }
  }
  if (call.keep_for_backward) {
    c.for_backward = true;
    c.queries = kept_copy(queries, reuse);
    c.keys = kept_copy(keys, reuse);
    c.values = kept_copy(values, reuse);
  } else if (c.have_all) {
    // The weights are all a later access needs: the projections go back.
    if (reuse)
      for (Tensor& t : c.proj.buffers) reuse->push_back(std::move(t));
    c.proj = {};
  }
  out.context = std::move(ctx);
  return out;
}

namespace {

// dy:[B*Kt rows, width] (the key or value rows, appended ones included) ->
// the gradient of the K given rows through `layer` (x:[B*K rows, in] -> dx),
// laid out as the projections wrote them.
void keys_backward(const LayerRef& layer, const Tensor& x, const Tensor& dy, const AttentionContext& c,
                   Tensor& dx, const LinearGrads& g) {
  const int64_t width = layer.out_features(), in = layer.in_features(), B = c.B();
  if (c.layout.seq_first || c.Kt == c.K) {
    // The K given positions are the first B*K rows in both layouts here.
    linear_backward(layer, x.data(), dy.data(), B * c.K, dx.data(), *g.weight, g.bias, c.precision);
    return;
  }
  for (int64_t b = 0; b < B; ++b)
    linear_backward(layer, x.data() + b * c.K * in, dy.data() + b * c.Kt * width, c.K, dx.data() + b * c.K * in,
                    *g.weight, g.bias, c.precision);
}

// grad (width elements) += the sum over the batch of dy's row at `pos`.
void appended_row_backward(const Tensor& dy, const AttentionContext& c, int64_t pos, int64_t width, Tensor& grad) {
  for (int64_t col = 0; col < width; ++col) {
    double sum = 0.0;
    for (int64_t b = 0; b < c.B(); ++b) sum += dy.data()[c.layout.row(b, pos, c.Kt) * width + col];
    grad.data()[col] += static_cast<float>(sum);
  }
}

}  // namespace

EngineInputGrads attention_backward(const AttentionContext& c, const EngineLayers& layers,
                                    const Tensor& grad_output, const EngineGrads& grads, std::vector<Tensor>* reuse) {
  // Scratch from `reuse` (stale: zeroed, which costs far less than fresh pages).
  auto scratch = [&](const Shape& shape) {
    Tensor t = take_buffer(shape, reuse);
    std::fill(t.values().begin(), t.values().end(), 0.0f);
    return t;
  };
  const int64_t B = c.B(), H = c.H, Hkv = c.Hkv, d = c.d, E = H * d, Ekv = Hkv * d;
  const RowLayout& layout = c.layout;
  // out = concat W_o^T + b_o.
  Tensor d_concat = scratch({B * c.Q, E});
  linear_backward(layers.o, c.concat.data(), grad_output.data(), B * c.Q, d_concat.data(), *grads.o.weight,
                  grads.o.bias, c.precision);
  // concat = the heads' outputs scaled by the head gates.
  const Tensor& heads_out = c.heads_out();
  if (layers.head_gates || grads.head_gates)
    gates_backward(layers.head_gates, heads_out, d_concat, H, d, grads.head_gates);

  // The heads' outputs = attention(q, k, v) with the forward's lengths,
  // masks and dropout key.
  Tensor dq = scratch({B * c.Q, E}), dk = scratch({B * c.Kt, Ekv}), dv = scratch({B * c.Kt, Ekv});
  kernels::AttentionBackward p;
  p.fwd = forward_params(c);
  p.fwd.out = layout.heads(const_cast<float*>(heads_out.data()), c.Q, H, d, E);
  p.grad_out = layout.heads(d_concat.data(), c.Q, H, d, E);
  p.grad_q = layout.heads(dq.data(), c.Q, H, d, E);
  p.grad_k = layout.heads(dk.data(), c.Kt, Hkv, d, Ekv);
  p.grad_v = layout.heads(dv.data(), c.Kt, Hkv, d, Ekv);
  // With the forward's statistics the fused backward recomputes the weights
  // tile by tile (linear memory) and reads only the key rows that forward
  // projected; else the saved weights, or none (recomputed from q and k).
  // (Without statistics, have_all is forward's, fixed before the context was
  // shared: all_weights() never writes those weights.)
  p.fwd.weights = c.stats.empty() && c.have_all.load(std::memory_order_acquire) ? c.weights.data() : nullptr;
  Tensor d_sinks = c.masks.sinks.empty() ? Tensor() : Tensor({H});  // written whole by the kernel
  p.grad_sinks = d_sinks.empty() ? nullptr : d_sinks.data();
  kernels::attention_backward(c.kernel, p);
  if (c.rotary.enabled()) {  // the gradients of the unrotated projections (one table for both)
    const RotaryTable table(c.rotary, 0, std::max(c.Q, c.K));
    apply_rotary(p.grad_q, c.Q, table, nullptr, /*inverse=*/true);
    apply_rotary(p.grad_k, c.K, table, nullptr, /*inverse=*/true);
  }

  // bias_k / bias_v: row K of every batch row's keys / values.
  if (layers.bias_k && grads.bias_k) appended_row_backward(dk, c, c.K, Ekv, *grads.bias_k);
  if (layers.bias_v && grads.bias_v) appended_row_backward(dv, c, c.K, Ekv, *grads.bias_v);

  // q = queries W_q^T + b_q, and likewise for the K given keys and values.
  // (Written whole by the products below: buffers from `reuse` serve.)
  EngineInputGrads g{take_buffer(c.queries.shape(), reuse), take_buffer(c.keys.shape(), reuse),
                     take_buffer(c.values.shape(), reuse), std::move(d_sinks)};
  linear_backward(layers.q, c.queries.data(), dq.data(), B * c.Q, g.queries.data(), *grads.q.weight, grads.q.bias,
                  c.precision);
  keys_backward(layers.k, c.keys, dk, c, g.keys, grads.k);
  keys_backward(layers.v, c.values, dv, c, g.values, grads.v);
  if (reuse)
    for (Tensor* t : {&d_concat, &dq, &dk, &dv}) reuse->push_back(std::move(*t));
  return g;
}

namespace {

// The fused kernel's weights of (rows x heads) from the context's statistics.
Tensor fused_weights(const AttentionContext& c, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& heads) {
  const int64_t nr = static_cast<int64_t>(rows.size()), nh = static_cast<int64_t>(heads.size());
  Tensor out({nr, nh, c.Q, c.Kt});
  kernels::AttentionWeightsParams p;
  p.fwd = forward_params(c);
  p.batch_rows = rows;
  p.heads = heads;
  p.out = out.data();
  kernels::attention_weights(p);
  return out;
}

}  // namespace

Tensor all_weights(const AttentionContext& c) {
  std::call_once(c.weights_once, [&] {
    if (c.have_all.load(std::memory_order_acquire)) return;  // formed by forward()
    std::vector<int64_t> rows(static_cast<size_t>(c.B())), heads(static_cast<size_t>(c.H));
    for (int64_t b = 0; b < c.B(); ++b) rows[static_cast<size_t>(b)] = b;
    for (int64_t h = 0; h < c.H; ++h) heads[static_cast<size_t>(h)] = h;
    c.weights = fused_weights(c, rows, heads);
    c.have_all.store(true, std::memory_order_release);
  });
  return c.weights;
}

Tensor weights_of(const AttentionContext& c, const std::vector<int64_t>& rows,
                  const std::vector<int64_t>& heads) {
  const int64_t nr = static_cast<int64_t>(rows.size()), nh = static_cast<int64_t>(heads.size());
  if (c.have_all.load(std::memory_order_acquire)) {  // formed: copy them
    Tensor out({nr, nh, c.Q, c.Kt});
    const int64_t block = c.Q * c.Kt;
    for (int64_t i = 0; i < nr; ++i)
      for (int64_t j = 0; j < nh; ++j)
        std::memcpy(out.data() + (i * nh + j) * block,
                    c.weights.data() + (rows[static_cast<size_t>(i)] * c.H + heads[static_cast<size_t>(j)]) * block,
                    sizeof(float) * static_cast<size_t>(block));
    return out;
  }
  return fused_weights(c, rows, heads);
}

Tensor checked_all_weights(const char* op, const AttentionContext& c) {
  // The weights, and the copy returned, are this call's allocation.
  core::MemoryPlan(op).add("attention weights", {c.B(), c.H, c.Q, c.Kt}).check();
  return all_weights(c);
}

Tensor checked_weights_of(const char* op, const char* which, const AttentionContext& c,
                          const std::vector<int64_t>& rows, const std::vector<int64_t>& heads) {
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= c.B())
      fail(op, "batch_rows: entry ", i, " is ", rows[i], "; ", which, " had rows 0..", c.B() - 1, " (batch size ",
           c.B(), ")");
  for (size_t i = 0; i < heads.size(); ++i)
    if (heads[i] < 0 || heads[i] >= c.H) fail(op, "heads: entry ", i, " is ", heads[i], "; wanted 0 <= head < ", c.H);
  core::MemoryPlan(op)
      .add("attention weights", {static_cast<int64_t>(rows.size()), static_cast<int64_t>(heads.size()), c.Q, c.Kt})
      .check();
  return weights_of(c, rows, heads);
}

Tensor dropout_mask(const AttentionContext& c) {
  Tensor mask({c.B(), c.H, c.Q, c.Kt});
  float* m = mask.data();
  for (int64_t i = 0; i < mask.numel(); ++i) m[i] = c.dropout.multiplier(static_cast<uint64_t>(i));
  return mask;
}

}  // namespace mha::nn
