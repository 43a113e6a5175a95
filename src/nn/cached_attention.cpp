// A cached call of either module (nn/cached_attention.h).
#include "nn/cached_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/memory.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "mha/threads.h"
#include "nn/call_masks.h"
#include "nn/projections.h"

namespace mha::nn {

Tensor cached_attention_forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                const EngineLayers& layers, const CachedCall& call, KVCache& cache) {
  const RowLayout& layout = call.layout;
  const int64_t B = layout.B, n = call.n, H = call.H, Hkv = call.who.Hkv, d = call.who.d, E = H * d;
  call.valid_lens.check(call.op, B, n);
  check_window(call.op, call.window);
  AttentionMasks scored;  // the modules' checks of softcap, the slopes and the sinks (one per query head)
  add_score_options(call.op, call.scores, {true, B, n, n, n, H}, scored);
  CacheAccess::check_call(call.op, cache, call.who, B, n, call.window.left);
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
  kernels::AttentionForward p;
  CacheAccess::point(cache, p);
  p.masks = kernels::causal_masks();
  // q and out: (B, H, n, d) views, set once projected (sized here for the plan).
  p.q.rank = p.out.rank = 4;
  p.q.shape[0] = p.out.shape[0] = B, p.q.shape[1] = p.out.shape[1] = H;
  p.q.shape[2] = p.out.shape[2] = n, p.q.shape[3] = p.out.shape[3] = d;
  p.scale_divisor = std::sqrt(static_cast<float>(d));
  if (!call.valid_lens.is_none()) {
    p.length_kind = call.valid_lens.kind() == ValidLens::Kind::PerBatch ? kernels::LengthKind::PerBatch
                                                                       : kernels::LengthKind::PerQuery;
    p.lens = call.valid_lens.data();
  }
  p.masks.key_keep = kpm.keep_data();
  p.masks.key_bias = kpm.bias_data();
  p.masks.key_stride_b = S;
  p.masks.fill = call.fill;
  p.masks.fully_masked = call.fully_masked;
  p.masks.window_left = call.window.left, p.masks.window_right = call.window.right;
  p.masks.softcap = scored.softcap;
  p.masks.alibi_slopes = scored.alibi_slopes.empty() ? nullptr : scored.alibi_slopes.data();
  p.masks.sinks = scored.sinks.empty() ? nullptr : scored.sinks.data();  // once per row (the decode kernel)
  std::vector<int64_t> lengths = cache.lengths();
  for (int64_t& len : lengths) len += n;
  p.cache.lengths = lengths.data();

  // Everything the call allocates, before anything is.
  core::MemoryPlan plan(call.op);
  plan.add("projected queries", {B, n, E})
      .add("projected keys", {B, n, Hkv * d})
      .add("projected values", {B, n, Hkv * d})
      .add("concatenated heads", {B, n, E})
      .add("output", call.out_shape)
      .add("decode kernel working memory", {kernels::decode_forward_working_bytes(p, num_threads())}, 1);
  plan.check();

  // Only the new positions are projected: the engine's projections (one
  // product per layer against its packed weight; a step of one row as dot
  // products, cpu/gemm/few_rows.h).
  const int64_t rows = B * n;
  const Precision precision = call.precision;
  ProjectionShape shape{layout, n, n, n, H, Hkv, d, precision};
  shape.few_rows_as_dots = true;
  const std::vector<int64_t> first = cache.lengths();  // row b's new positions follow its cached ones
  shape.rotary = call.rotary;  // rotated in the products' epilogue
  shape.rotary_first = first.data();
  Projected proj = project_qkv(queries, keys, values, layers.q, layers.k, layers.v, shape, RowNeeds{});
  if (precision == Precision::BFloat16) round_to_bf16(proj);
  Tensor concat({B * n, E});
  const TensorView out = layout.heads(concat.data(), n, H, d, E);
  p.q = proj.q;
  p.out = out;
  (void)kernels::decode_params(p, call.op);  // checked before the cache changes
  CacheAccess::write(cache, proj.k, proj.v);
  CacheAccess::point(cache, p);  // the lengths now count the new positions
  kernels::decode_forward(p, call.op);

  // Head gates, then W_o, as the engine's forward.
  apply_head_gates(concat, layers.head_gates, H, d);
  Tensor output(call.out_shape);
  layers.o.forward_rows(concat.data(), rows, output.data(), layers.o.out_features(), precision,
                        /*few_rows_as_dots=*/true);
  return output;
}

}  // namespace mha::nn
