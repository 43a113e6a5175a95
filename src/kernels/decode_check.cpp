// Validation of a cached call at the decode kernels' edge, and its flat
// form (DecodeParams) made from the forward: every message names the
// operation, the argument, the value seen and the value wanted.
#include <cmath>

#include "kernels/params.h"
#include "kernels/validate.h"
#include "mha/error.h"

namespace mha::kernels {

void check_decode_params(const DecodeParams& p, const char* op) {
  if (p.B < 0 || p.Qn < 1 || p.d < 1 || p.dv < 1 || p.capacity < 0)
    fail(op, "shapes: q (", p.B, ", ", p.Hq, ", ", p.Qn, ", ", p.d, "), cache capacity ", p.capacity,
         ", value width ", p.dv, "; wanted B >= 0, Qn >= 1, d >= 1, dv >= 1, capacity >= 0");
  if (p.Hq < 1 || p.Hkv < 1 || p.Hq % p.Hkv != 0)
    fail(op, "heads: q has ", p.Hq, " heads and the cache ", p.Hkv,
         "; wanted a positive number of query heads that is a multiple of the cache's");
  if (!(p.scale_divisor > 0.0f))
    fail(op, "scale_divisor: ", p.scale_divisor, "; wanted a positive number (sqrt(d))");
  if (p.chunk_keys < 0 || p.chunk_keys % kDecodeTile != 0)
    fail(op, "chunk_keys: ", p.chunk_keys, "; wanted 0 (the kernel's choice) or a positive multiple of ",
         kDecodeTile, " keys");
  const MaskOptions& m = p.masks;
  if (!(m.softcap >= 0.0f) || !std::isfinite(m.softcap))
    fail(op, "masks: softcap ", m.softcap, "; wanted a finite number >= 0 (0: off)");
  for (int64_t h = 0; h < p.Hq; ++h) {
    if (m.alibi_slopes && !std::isfinite(m.alibi_slopes[h]))
      fail(op, "masks: alibi_slopes[", h, "]: ", m.alibi_slopes[h], "; wanted a finite number per query head");
    if (m.sinks && !std::isfinite(m.sinks[h]))
      fail(op, "masks: sinks[", h, "]: ", m.sinks[h], "; wanted a finite logit per query head");
  }
  if (p.B == 0) return;
  if (!p.q || !p.k || !p.v || !p.out || !p.lengths)
    fail(op, "a null pointer among q, k, v, out, lengths; wanted all set for B = ", p.B);
  const bool bad_stride = p.q_stride_i < p.d || p.k_stride_j < p.d || p.v_stride_j < p.dv ||
                          p.out_stride_i < p.dv || p.q_stride_h < 0 || p.q_stride_b < 0 ||
                          p.k_stride_h < 0 || p.k_stride_b < 0 || p.v_stride_h < 0 ||
                          p.v_stride_b < 0 || p.out_stride_h < 0 || p.out_stride_b < 0;
  if (bad_stride)
    fail(op, "strides: a row stride below its row width (q ", p.q_stride_i, " for d ", p.d, ", k ",
         p.k_stride_j, ", v ", p.v_stride_j, " and out ", p.out_stride_i, " for dv ", p.dv,
         "); wanted the innermost axis contiguous and rows not overlapping");
  if ((p.length_kind == LengthKind::None) != (p.lens == nullptr))
    fail(op, "lens: ", p.lens ? "given" : "null", " with length kind ",
         p.length_kind == LengthKind::None ? "None" : "PerBatch/PerQuery",
         "; wanted lens exactly when the kind is PerBatch or PerQuery");
  if (p.lens) {
    const int64_t count = p.length_kind == LengthKind::PerBatch ? p.B : p.B * p.Qn;
    for (int64_t x = 0; x < count; ++x)
      if (!(p.lens[x] >= 0.0f))
        fail(op, "lens[", x, "]: ", p.lens[x], "; wanted a number >= 0 (the chapter's valid length)");
  }
  if (p.masks.pair_keep || p.masks.pair_bias)
    fail(op, "masks: a pair mask (per query and key); wanted key masks only (key_keep, key_bias): a cached call "
         "takes nn.MultiheadAttention's key_padding_mask, not attn_mask");
  if (p.masks.window_left < -1 || p.masks.window_right < -1)
    fail(op, "masks: window (", p.masks.window_left, ", ", p.masks.window_right,
         "); wanted each side -1 (unbounded) or >= 0");
  if (p.masks.doc_offsets) fail(op, "masks: doc_offsets set (a packed batch of documents); wanted none: a packed batch is not a cache");
  if (p.masks.diagonal_shift != 0)
    fail(op, "masks: diagonal_shift ", p.masks.diagonal_shift,
         "; wanted 0: a cached call places its queries by the cache's lengths");
  // A ring holds the last `capacity` positions: every query's window must
  // lie within them (query 0 of Qn reaches back window_left keys).
  if (p.ring && (p.masks.window_left < 0 || p.masks.window_left + p.Qn > p.capacity))
    fail(op, "ring: a ring buffer of ", p.capacity, " slots with window (", p.masks.window_left, ", ",
         p.masks.window_right, ") and ", p.Qn, " new queries; wanted window_left >= 0 and window_left + new "
         "queries <= the slots (a ring keeps only the last ones)");
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t n = p.lengths[b];
    if (p.masks.has_key_mask() && p.masks.key_stride_b < n)
      fail(op, "key_stride_b: ", p.masks.key_stride_b, " for row ", b, " of ", n,
           " keys; wanted at least every row's length (one mask entry per key)");
    if (n < 0 || (n > p.capacity && !p.ring))
      fail(op, "lengths[", b, "]: ", n, "; wanted 0 <= length <= the cache capacity ", p.capacity);
    if (p.masks.causal == Causal::BottomRight && n > 0 && n < p.Qn)
      fail(op, "lengths[", b, "]: ", n, " keys cannot hold the ", p.Qn,
           " new ones of a causal step; wanted 0 or at least Qn = ", p.Qn);
  }
}

DecodeParams decode_params(const AttentionForward& p, const char* op, bool check) {
  const TensorView* views[] = {&p.q, &p.k, &p.v, &p.out};
  const char* names[] = {"q", "k", "v", "out"};
  for (int x = 0; x < 4; ++x)
    if (views[x]->rank != 4)
      fail(op, names[x], ": rank ", views[x]->rank, "; wanted 4 ([B,H,Q,d], the cache [B,Hkv,capacity,d])");
  if (!p.cache.active())  // read by every use
    fail(op, "cache.lengths: null; wanted a cached call (the keys each row of the cache holds)");
  const bool bf16 = p.cache.dtype == CacheDtype::BF16;
  if (check && (bf16 != (p.cache.k_bf16 != nullptr && p.cache.v_bf16 != nullptr) || (bf16 && (p.k.data || p.v.data))))
    fail(op, "cache: ", bf16 ? "bfloat16" : "float32", " storage with ", p.cache.k_bf16 ? "" : "no ",
         "bfloat16 keys and ", p.k.data ? "" : "no ",
         "float32 keys; wanted the pointers of its dtype only (k_bf16 and v_bf16 for BF16, k.data and v.data for F32)");
  DecodeParams d;
  d.B = p.q.shape[0], d.Hq = p.q.shape[1], d.Qn = p.q.shape[2], d.d = p.q.shape[3];
  d.Hkv = p.k.shape[1], d.capacity = p.k.shape[2], d.dv = p.v.shape[3];
  d.q = p.q.data;
  d.q_stride_b = p.q.stride[0], d.q_stride_h = p.q.stride[1], d.q_stride_i = p.q.stride[2];
  d.k = bf16 ? static_cast<const void*>(p.cache.k_bf16) : p.k.data;
  d.v = bf16 ? static_cast<const void*>(p.cache.v_bf16) : p.v.data;
  d.k_stride_b = p.k.stride[0], d.k_stride_h = p.k.stride[1], d.k_stride_j = p.k.stride[2];
  d.v_stride_b = p.v.stride[0], d.v_stride_h = p.v.stride[1], d.v_stride_j = p.v.stride[2];
  d.dtype = p.cache.dtype;
  d.out = p.out.data;
  d.out_stride_b = p.out.stride[0], d.out_stride_h = p.out.stride[1], d.out_stride_i = p.out.stride[2];
  d.lengths = p.cache.lengths;
  d.scale_divisor = p.scale_divisor;
  d.length_kind = p.length_kind;
  d.lens = p.lens;
  d.masks = p.masks;
  d.chunk_keys = p.cache.chunk_keys;
  d.ring = p.cache.ring;
  if (!check) return d;
  // What a cached call cannot carry: the fused kernel's saves, dropout and
  // the bfloat16 products are the uncached forward's (the modules never set
  // them here).
  if (p.weights || !p.stats.empty() || p.dropout.active() || p.read_all_keys)
    fail(op, "a cached call with ", p.weights ? "weights" : !p.stats.empty() ? "statistics" : p.dropout.active() ? "dropout" : "read_all_keys",
         "; wanted none of weights, statistics, dropout and read_all_keys (only the uncached forward takes them)");
  if (p.q.stride[3] != 1 || p.k.stride[3] != 1 || p.v.stride[3] != 1 || p.out.stride[3] != 1)
    fail(op, "strides: an innermost stride other than 1; wanted every view's rows contiguous");
  if (p.k.shape[0] != d.B || p.v.shape[0] != d.B || p.v.shape[1] != d.Hkv || p.v.shape[2] != d.capacity ||
      p.k.shape[3] != d.d || p.out.shape[0] != d.B || p.out.shape[1] != d.Hq || p.out.shape[2] != d.Qn ||
      p.out.shape[3] != d.dv)
    fail(op, "shapes: k (", p.k.shape[0], ", ", p.k.shape[1], ", ", p.k.shape[2], ", ", p.k.shape[3], "), v (",
         p.v.shape[0], ", ", p.v.shape[1], ", ", p.v.shape[2], ", ", p.v.shape[3], "), out (", p.out.shape[0], ", ",
         p.out.shape[1], ", ", p.out.shape[2], ", ", p.out.shape[3], ") for q (", d.B, ", ", d.Hq, ", ", d.Qn, ", ", d.d,
         "); wanted k (B, Hkv, capacity, d), v (B, Hkv, capacity, dv), out (B, H, Q, dv)");
  check_decode_params(d, op);
  return d;
}

}  // namespace mha::kernels
