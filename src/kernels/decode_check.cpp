// Validation of DecodeParams at the decode kernels' edge: every message names
// the operation, the argument, the value seen and the value wanted.
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
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t n = p.lengths[b];
    if (p.masks.has_key_mask() && p.masks.key_stride_b < n)
      fail(op, "key_stride_b: ", p.masks.key_stride_b, " for row ", b, " of ", n,
           " keys; wanted at least every row's length (one mask entry per key)");
    if (n < 0 || n > p.capacity)
      fail(op, "lengths[", b, "]: ", n, "; wanted 0 <= length <= the cache capacity ", p.capacity);
    if (p.masks.causal == Causal::BottomRight && n > 0 && n < p.Qn)
      fail(op, "lengths[", b, "]: ", n, " keys cannot hold the ", p.Qn,
           " new ones of a causal step; wanted 0 or at least Qn = ", p.Qn);
  }
}

}  // namespace mha::kernels
