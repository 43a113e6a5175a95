// The decode interface (kernels/params.h) on the fused attention
// kernel (cpu/fused/attention_fused.h): for long prefills, where many new
// queries attend over the cache and, causally, over each other. The decode
// kernel computes every (query, key) score of a block and masks the ones
// after each query; the fused kernel tiles queries against keys with
// register-blocked products and skips the tiles past every query's limit,
// which wins once a block has enough queries (cpu/dispatch.cpp decides,
// by measurement).
//
// One fused call per batch row, over that row's own K = lengths[b] keys (a
// ragged batch has no common key axis, and slots past a row's length are
// not keys). The masks map one to one: causal -> Causal::BottomRight over the
// row's keys, the chapter's lengths -> the row's (1,) or (1, Qn) lengths,
// key_keep / key_bias -> the row's [1, K] slice, fill and fully_masked as
// they are, the score options (softcap, ALiBi slopes and sinks per query
// head) as they are but for a bfloat16 call's first query head (ALiBi's
// bottom-right distance over the row's K keys is pos_q - j as the decode
// kernel's). A bfloat16 cache is widened to float32 (exact) a few cache
// heads at a time, up to kFusedWidenBytes (at least one head): the extra
// memory is bounded, and each fused call still has the query heads of
// several cache heads to spread over the threads.
#include <algorithm>
#include <vector>

#include "core/parallel.h"
#include "cpu/decode/decode.h"
#include "cpu/fused/attention_fused.h"
#include "kernels/params.h"
#include "kernels/validate.h"
#include "mha/threads.h"

namespace mha::kernels {

namespace {

// The most bytes of widened bfloat16 rows one fused call reads (one cache
// head's worth when a head alone is larger).
constexpr int64_t kFusedWidenBytes = int64_t{64} << 20;

TensorView view4(const float* data, int64_t n1, int64_t n2, int64_t n3, int64_t s1, int64_t s2) {
  TensorView t;
  t.data = const_cast<float*>(data);  // the kernel only reads q, k, v
  t.rank = 4;
  t.shape[0] = 1, t.shape[1] = n1, t.shape[2] = n2, t.shape[3] = n3;
  t.stride[0] = 0, t.stride[1] = s1, t.stride[2] = s2, t.stride[3] = 1;
  return t;
}

}  // namespace

int64_t decode_fused_working_bytes(const DecodeParams& p) {
  if (p.dtype != CacheDtype::BF16) return 0;
  int64_t K = 0;
  for (int64_t b = 0; b < p.B; ++b) K = std::max(K, p.lengths[b]);
  const int64_t head = 4 * K * (p.d + p.dv);
  return head * std::clamp<int64_t>(kFusedWidenBytes / std::max<int64_t>(head, 1), 1, p.Hkv);
}

void decode_attention_fused(const DecodeParams& p) {
  check_decode_params(p, "decode_attention_fused");
  const bool bf16 = p.dtype == CacheDtype::BF16;
  std::vector<float> k32, v32;  // one widened cache head (bfloat16 caches)
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t K = p.lengths[b];
    if (K == 0) {  // no keys: the output is 0 (kernels/params.h)
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t i = 0; i < p.Qn; ++i) {
          float* out = p.out + b * p.out_stride_b + h * p.out_stride_h + i * p.out_stride_i;
          std::fill(out, out + p.dv, 0.0f);
        }
      continue;
    }
    AttentionForward f;
    f.scale_divisor = p.scale_divisor;
    f.length_kind = p.length_kind;
    if (p.lens) f.lens = p.lens + (p.length_kind == LengthKind::PerBatch ? b : b * p.Qn);
    f.masks = p.masks;  // the row's slice of the key masks
    f.masks.key_keep = p.masks.keep_row(b, K);
    f.masks.key_bias = p.masks.bias_row(b, K);
    f.masks.key_stride_b = 0;
    const float* q = p.q + b * p.q_stride_b;
    float* out = p.out + b * p.out_stride_b;
    if (!bf16) {  // the cache in place: every head of the row in one call
      f.q = view4(q, p.Hq, p.Qn, p.d, p.q_stride_h, p.q_stride_i);
      f.k = view4(static_cast<const float*>(p.k) + b * p.k_stride_b, p.Hkv, K, p.d, p.k_stride_h, p.k_stride_j);
      f.v = view4(static_cast<const float*>(p.v) + b * p.v_stride_b, p.Hkv, K, p.dv, p.v_stride_h, p.v_stride_j);
      f.out = view4(out, p.Hq, p.Qn, p.dv, p.out_stride_h, p.out_stride_i);
      attention_forward_fused(f);
      continue;
    }
    // bfloat16: cache heads widened kFusedWidenBytes at a time (at least one
    // head), each batch of them with the query heads reading it.
    const int64_t G = p.group(), head_floats = K * (p.d + p.dv);
    const int64_t per_call = std::clamp<int64_t>(kFusedWidenBytes / (4 * head_floats), 1, p.Hkv);
    k32.resize(static_cast<size_t>(per_call * K * p.d));
    v32.resize(static_cast<size_t>(per_call * K * p.dv));
    for (int64_t g0 = 0; g0 < p.Hkv; g0 += per_call) {
      const int64_t ng = std::min(per_call, p.Hkv - g0);
      const int64_t rows = ng * K;
      const double work = static_cast<double>(rows) * static_cast<double>(p.d + p.dv);
      core::parallel_for(rows, core::team_for(work, rows), [&](int64_t r) {  // r = (head within the batch) * K + key
        const int64_t g = g0 + r / K, j = r % K;
        const uint16_t* ks = static_cast<const uint16_t*>(p.k) + b * p.k_stride_b + g * p.k_stride_h + j * p.k_stride_j;
        const uint16_t* vs = static_cast<const uint16_t*>(p.v) + b * p.v_stride_b + g * p.v_stride_h + j * p.v_stride_j;
        float* kd = k32.data() + r * p.d;
        float* vd = v32.data() + r * p.dv;
        for (int64_t x = 0; x < p.d; ++x) kd[x] = core::from_bf16(ks[x]);
        for (int64_t x = 0; x < p.dv; ++x) vd[x] = core::from_bf16(vs[x]);
      });
      f.q = view4(q + g0 * G * p.q_stride_h, ng * G, p.Qn, p.d, p.q_stride_h, p.q_stride_i);
      f.k = view4(k32.data(), ng, K, p.d, K * p.d, p.d);
      f.v = view4(v32.data(), ng, K, p.dv, K * p.dv, p.dv);
      f.out = view4(out + g0 * G * p.out_stride_h, ng * G, p.Qn, p.dv, p.out_stride_h, p.out_stride_i);
      // The call's query heads start at g0 * G: so do their slopes and sinks.
      f.masks.alibi_slopes = p.masks.alibi_slopes ? p.masks.alibi_slopes + g0 * G : nullptr;
      f.masks.sinks = p.masks.sinks ? p.masks.sinks + g0 * G : nullptr;
      attention_forward_fused(f);
    }
  }
}

}  // namespace mha::kernels
