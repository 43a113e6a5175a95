// The decode kernel's reference: the d2l chapter's attention of the Qn new
// queries over the K = lengths[b] cached keys, one query row at a time, in
// double, with the chapter's -1e6 (or -inf) for keys past a query's valid
// length or outside its key mask (kernels/params.h says what the
// lengths and masks mean). The score options: the scaled score softcapped
// (softcap * tanh(s / softcap)), ALiBi's -slope_h * |pos_q - j| added
// (pos_q = K - Qn + i, query i's position among the row's keys), then the
// key bias and the masks; a head's sink joins the denominator with no value,
// so no row is fully masked with sinks (under -inf, a row with no live key
// gets 0).
//   q:[B,Hq,Qn,d] k:[B,Hkv,capacity,d] v:[B,Hkv,capacity,dv] -> out:[B,Hq,Qn,dv]
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "kernels/params.h"
#include "kernels/validate.h"

namespace mha::kernels {

namespace {

// Element c of cache row j of (b, head): float32 or bfloat16 storage.
double cache_at(const void* base, CacheDtype dtype, int64_t offset) {
  if (dtype == CacheDtype::BF16) return core::from_bf16(static_cast<const uint16_t*>(base)[offset]);
  return static_cast<const float*>(base)[offset];
}

}  // namespace

void decode_attention_reference(const DecodeParams& p) {
  check_decode_params(p, "decode_attention_reference");
  std::vector<double> w;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t K = p.lengths[b], lo = p.held_from(b);  // a ring holds positions lo .. K-1
    w.assign(static_cast<size_t>(K), 0.0);
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t hk = h / p.group();
      for (int64_t i = 0; i < p.Qn; ++i) {
        const float* q = p.q + b * p.q_stride_b + h * p.q_stride_h + i * p.q_stride_i;
        float* out = p.out + b * p.out_stride_b + h * p.out_stride_h + i * p.out_stride_i;
        if (K == 0) {  // no keys: nothing to attend to
          std::fill(out, out + p.dv, 0.0f);
          continue;
        }
        const int64_t valid = p.valid_len(b, K, i), first = p.first_key(K, i);
        const double fill = p.masks.fill == MaskFill::Seed ? static_cast<double>(kMaskFill) : -INFINITY;
        const double cap = p.masks.softcap;
        const double sink = p.masks.sinks ? static_cast<double>(p.masks.sinks[h]) : -INFINITY;
        double row_max = -INFINITY;
        for (int64_t j = lo; j < K; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < p.d; ++c)
            dot += q[c] * cache_at(p.k, p.dtype, b * p.k_stride_b + hk * p.k_stride_h + p.slot(j) * p.k_stride_j + c);
          const bool kept = j >= first && j < valid && (!p.masks.key_keep || p.masks.keep_row(b, K)[j]);
          double s = dot / p.scale_divisor;
          if (cap > 0.0) s = cap * std::tanh(s / cap);
          if (p.masks.alibi_slopes)
            s -= static_cast<double>(p.masks.alibi_slopes[h]) * static_cast<double>(std::llabs(K - p.Qn + i - j));
          w[j] = kept ? s + (p.masks.key_bias ? p.masks.bias_row(b, K)[j] : 0.0) : fill;
          row_max = std::isnan(w[j]) ? w[j] : std::max(row_max, w[j]);  // a NaN score makes the row NaN
        }
        if (row_max == -INFINITY && !p.masks.sinks) {  // every score -inf: the fully-masked policy
          for (int64_t c = 0; c < p.dv; ++c) {
            double acc = 0.0;
            if (p.masks.fully_masked == FullyMaskedRows::Uniform)
              for (int64_t j = lo; j < K; ++j)
                acc += cache_at(p.v, p.dtype, b * p.v_stride_b + hk * p.v_stride_h + p.slot(j) * p.v_stride_j + c);
            out[c] = static_cast<float>(acc / static_cast<double>(K - lo));
          }
          continue;
        }
        row_max = std::max(row_max, sink);  // the sink: one more term of the denominator
        double sum = p.masks.sinks ? std::exp(sink - row_max) : 0.0;
        for (int64_t j = lo; j < K; ++j) sum += (w[j] = std::exp(w[j] - row_max));
        for (int64_t c = 0; c < p.dv; ++c) {
          double acc = 0.0;
          for (int64_t j = lo; j < K; ++j)
            acc += w[j] * cache_at(p.v, p.dtype, b * p.v_stride_b + hk * p.v_stride_h + p.slot(j) * p.v_stride_j + c);
          out[c] = static_cast<float>(acc / sum);
        }
      }
    }
  }
}

}  // namespace mha::kernels
