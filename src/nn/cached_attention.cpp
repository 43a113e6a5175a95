// A cached call of either module (nn/cached_attention.h).
#include "nn/cached_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/memory.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "mha/threads.h"
#include "nn/projections.h"

namespace mha::nn {

namespace {

// A decode step projects a few rows (B * n) through weights of millions of
// floats. Before weights were packed once per version (cpu/packed_weight.h),
// mha's GEMM packed the weight per call, which at a few rows cost far more
// than the product (a one-row step with 4096 features: 350-430 ms, ~70% in
// PackedB::pack), so up to 16 rows went through the dot products below. With
// the packing kept, the product against it is the faster one from two rows
// on; one row is still best as dot products, each weight row read in place
// once. Measured (one thread, loaded machine, median of 100 steps, B rows of
// one new position, alternating builds): D 1024: 1 row 0.86-0.88 ms dot /
// 0.85-0.96 packed, 2 rows 1.17-1.62 / 1.00-1.10, 4 rows 2.0-2.5 / 1.24-1.35,
// 8 rows 4.5-5.4 / 1.9-2.0; D 4096: 1 row 17-24 / 27-29, 4 rows 36-38 / 29-33.
// Each element is summed by one thread in one order on either path: the same
// bits at any thread count.
constexpr int64_t kDotRows = 1;

void few_rows_linear(const LayerRef& layer, const float* x, int64_t rows, float* y, int64_t ldy) {
  const int64_t N = layer.out_features(), K = layer.in_features();
  const float* W = layer.weight();
  const float* bias = layer.bias();
  const int threads = static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(rows) >= 2e5
                          ? num_threads() : 1;
  // Four weight rows at a time: four independent sums in flight (one sum's
  // adds wait on each other; four hide the latency).
  const int64_t blocks = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t ob = 0; ob < blocks; ++ob) {
    const int64_t o = ob * 4;
    if (o + 4 <= N) {
      const float *w0 = W + o * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * K;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t i = 0; i < K; ++i) {
          s0 += xr[i] * w0[i];
          s1 += xr[i] * w1[i];
          s2 += xr[i] * w2[i];
          s3 += xr[i] * w3[i];
        }
        float* yr = y + r * ldy + o;
        yr[0] = bias ? s0 + bias[o] : s0;
        yr[1] = bias ? s1 + bias[o + 1] : s1;
        yr[2] = bias ? s2 + bias[o + 2] : s2;
        yr[3] = bias ? s3 + bias[o + 3] : s3;
      }
      continue;
    }
    for (int64_t oo = o; oo < N; ++oo) {  // the last 1-3 outputs
      const float* w = W + oo * K;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * K;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < K; ++i) sum += xr[i] * w[i];
        y[r * ldy + oo] = bias ? sum + bias[oo] : sum;
      }
    }
  }
}

}  // namespace

Tensor cached_attention_forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                const EngineLayers& layers, const CachedCall& call, KVCache& cache) {
  const RowLayout& layout = call.layout;
  const int64_t B = layout.B, n = call.n, H = call.H, Hkv = call.who.Hkv, d = call.who.d, E = H * d;
  CacheAccess::check_call(call.op, cache, call.who, B, n);
  call.valid_lens.check(call.op, B, n);
  const Mask& kpm = call.key_padding_mask;
  int64_t S = 0;  // the key axis a key_padding_mask covers: the longest row after the append
  for (int64_t len : cache.lengths()) S = std::max(S, len + n);
  if (!kpm.is_none()) {
    const Shape wanted = call.unbatched ? Shape{S} : Shape{B, S};
    if (kpm.shape() != wanted)
      fail(call.op, "key_padding_mask: shape ", shape_str(kpm.shape()), " is not ", shape_str(wanted),
           ": a cached call's mask covers every key it attends to, the longest row's ", S - n,
           " cached positions and the ", n, " new ones");
  }

  // The decode kernel's view of the call; the lengths it reads are the ones
  // after this call's append (the new keys are the last n of each row).
  kernels::DecodeParams p;
  CacheAccess::point(cache, p);
  p.Hq = H, p.Qn = n;
  p.causal = true;
  p.scale_divisor = std::sqrt(static_cast<float>(d));
  if (!call.valid_lens.is_none()) {
    p.length_kind = call.valid_lens.kind() == ValidLens::Kind::PerBatch ? kernels::LengthKind::PerBatch
                                                                       : kernels::LengthKind::PerQuery;
    p.lens = call.valid_lens.data();
  }
  p.key_keep = kpm.keep_data();
  p.key_bias = kpm.bias_data();
  p.key_stride_b = S;
  p.fill = call.fill;
  p.fully_masked = call.fully_masked;
  std::vector<int64_t> lengths = cache.lengths();
  for (int64_t& len : lengths) len += n;
  p.lengths = lengths.data();

  // Everything the call allocates, before anything is.
  core::MemoryPlan plan(call.op);
  plan.add("projected queries", {B, n, E})
      .add("projected keys", {B, n, Hkv * d})
      .add("projected values", {B, n, Hkv * d})
      .add("concatenated heads", {B, n, E})
      .add("output", call.out_shape)
      .add("decode kernel working memory", {kernels::decode_forward_working_bytes(p, num_threads())}, 1);
  plan.check();

  // Only the new positions are projected (one product per layer against its
  // packed weight; a single row by few_rows_linear).
  const int64_t rows = B * n;
  const Precision precision = call.precision;
  // The dot products are float32's: bfloat16 always takes the packed
  // product (its packing, half the bytes of the weight, is what a step reads).
  const bool dots = rows <= kDotRows && precision == Precision::Float32;
  Projected proj;
  if (dots) {
    proj.buffers = {Tensor({rows, E}), Tensor({rows, Hkv * d}), Tensor({rows, Hkv * d})};
    few_rows_linear(layers.q, queries.data(), rows, proj.buffers[0].data(), E);
    few_rows_linear(layers.k, keys.data(), rows, proj.buffers[1].data(), Hkv * d);
    few_rows_linear(layers.v, values.data(), rows, proj.buffers[2].data(), Hkv * d);
    proj.q = layout.heads(proj.buffers[0].data(), n, H, d, E);
    proj.k = layout.heads(proj.buffers[1].data(), n, Hkv, d, Hkv * d);
    proj.v = layout.heads(proj.buffers[2].data(), n, Hkv, d, Hkv * d);
  } else {
    proj = project_qkv(queries, keys, values, layers.q, layers.k, layers.v,
                       {layout, n, n, n, H, Hkv, d, precision}, RowNeeds{});
    if (precision == Precision::BFloat16) round_to_bf16(proj);
  }
  Tensor concat({B * n, E});
  const TensorView out = layout.heads(concat.data(), n, H, d, E);
  p.q = proj.q.data;
  p.q_stride_b = proj.q.stride[0], p.q_stride_h = proj.q.stride[1], p.q_stride_i = proj.q.stride[2];
  p.out = out.data;
  p.out_stride_b = out.stride[0], p.out_stride_h = out.stride[1], p.out_stride_i = out.stride[2];
  kernels::check_decode_params(p, call.op);  // before the cache changes
  CacheAccess::write(cache, proj.k, proj.v);
  CacheAccess::point(cache, p);  // the lengths now count the new positions
  kernels::decode_forward(p);

  // Head gates, then W_o.
  if (layers.head_gates)
    for (int64_t r = 0; r < B * n; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const float g = layers.head_gates[h];
        if (g == 1.0f) continue;
        float* col = concat.data() + r * E + h * d;
        for (int64_t c = 0; c < d; ++c) col[c] *= g;
      }
  Tensor output(call.out_shape);
  if (dots) few_rows_linear(layers.o, concat.data(), rows, output.data(), layers.o.out_features());
  else layers.o.forward_rows(concat.data(), rows, output.data(), layers.o.out_features(), precision);
  return output;
}

}  // namespace mha::nn
