// The parameter structs' consistency checks (kernels/validate.h).
#include "kernels/validate.h"

#include <cmath>
#include <sstream>

namespace mha::kernels {

namespace {

std::string shape_of(const TensorView& t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t.rank; ++i) s << (i ? ", " : "") << t.shape[i];
  s << ")";
  return s.str();
}

// A view the kernels can read: rank 4, data set, innermost stride 1.
std::string check_view(const char* name, const TensorView& t) {
  if (t.rank != 4) return std::string(name) + ": rank " + std::to_string(t.rank) + ", wanted 4";
  const bool empty = t.shape[0] == 0 || t.shape[1] == 0 || t.shape[2] == 0 || t.shape[3] == 0;
  if (t.data == nullptr && !empty) return std::string(name) + ": no data";
  if (t.stride[3] != 1 && t.shape[3] > 1)
    return std::string(name) + ": innermost stride " + std::to_string(t.stride[3]) + ", wanted 1";
  return {};
}

// `t` has exactly the shape (a, b, c, e).
std::string check_shape(const char* name, const TensorView& t, int64_t a, int64_t b, int64_t c, int64_t e) {
  if (std::string why = check_view(name, t); !why.empty()) return why;
  if (t.shape[0] != a || t.shape[1] != b || t.shape[2] != c || t.shape[3] != e) {
    std::ostringstream s;
    s << name << ": shape " << shape_of(t) << ", wanted (" << a << ", " << b << ", " << c << ", " << e << ")";
    return s.str();
  }
  return {};
}

// A packed batch of documents (MaskOptions::doc_offsets): one batch row of
// Q = K rows, documents + 1 nondecreasing offsets from 0 to K.
std::string check_documents(const AttentionForward& p) {
  const MaskOptions& m = p.masks;
  if (!m.doc_offsets || m.documents < 1)
    return "masks.documents: " + std::to_string(m.documents) + " with doc_offsets " + (m.doc_offsets ? "set" : "null") +
           ", wanted offsets and at least one document, or neither";
  if (p.B() != 1 || p.Q() != p.K())
    return "masks.doc_offsets: a packed batch over q " + shape_of(p.q) + ", k " + shape_of(p.k) +
           ", wanted one batch row and as many queries as keys";
  if (m.diagonal_shift != 0)
    return "masks.diagonal_shift: " + std::to_string(m.diagonal_shift) +
           " in a packed batch, wanted 0 (documents are whole in one call)";
  const int64_t* o = m.doc_offsets;
  if (o[0] != 0 || o[m.documents] != p.K())
    return "masks.doc_offsets: from " + std::to_string(o[0]) + " to " + std::to_string(o[m.documents]) +
           ", wanted from 0 to the " + std::to_string(p.K()) + " packed rows";
  for (int64_t x = 0; x < m.documents; ++x)
    if (o[x + 1] < o[x])
      return "masks.doc_offsets: [" + std::to_string(x) + "] = " + std::to_string(o[x]) + " > [" +
             std::to_string(x + 1) + "] = " + std::to_string(o[x + 1]) + ", wanted nondecreasing offsets";
  return {};
}

// q, k, v (v optional), lengths, scale, dropout, masks and statistics.
std::string check_inputs(const AttentionForward& p, bool need_v) {
  if (p.cache.active()) return "cache.lengths: set (a cached call); wanted null here: kernels::decode_forward takes cached calls";
  if (std::string why = check_view("q", p.q); !why.empty()) return why;
  if (std::string why = check_view("k", p.k); !why.empty()) return why;
  const int64_t B = p.B(), H = p.H(), Hkv = p.Hkv(), K = p.K(), d = p.d();
  if (B < 0 || H < 1 || p.Q() < 0 || K < 1 || d < 1) return "q, k: shapes " + shape_of(p.q) + ", " + shape_of(p.k) + " have an empty head, key or width axis";
  if (std::string why = check_shape("k", p.k, B, Hkv, K, d); !why.empty()) return why;
  if (Hkv < 1 || H % Hkv != 0)
    return "k: " + std::to_string(Hkv) + " kv heads do not divide the " + std::to_string(H) + " query heads";
  if (need_v || p.v.data)
    if (std::string why = check_shape("v", p.v, B, Hkv, K, p.v.shape[3]); !why.empty()) return why;
  if ((p.length_kind == LengthKind::None) != (p.lens == nullptr))
    return p.lens ? "lens: set while length_kind is None" : "lens: null while length_kind is not None";
  if (!(p.scale_divisor > 0.0f) || !std::isfinite(p.scale_divisor))
    return "scale_divisor: " + std::to_string(p.scale_divisor) + ", wanted finite and > 0";
  if (!(p.dropout.p >= 0.0f && p.dropout.p <= 1.0f))
    return "dropout.p: " + std::to_string(p.dropout.p) + ", wanted in [0, 1]";
  if ((p.stats.row_max2 == nullptr) != (p.stats.row_sum == nullptr))
    return "stats: one of row_max2 and row_sum is set, the other null";
  if ((p.masks.pair_keep || p.masks.pair_bias) && (p.masks.pair_stride_b < 0 || p.masks.pair_stride_h < 0))
    return "masks: negative pair strides";
  if (p.masks.window_left < -1 || p.masks.window_right < -1)
    return "masks.window: (" + std::to_string(p.masks.window_left) + ", " + std::to_string(p.masks.window_right) +
           "), wanted each side >= 0, or -1 for unbounded";
  const MaskOptions& m = p.masks;
  if (!(m.softcap >= 0.0f) || !std::isfinite(m.softcap))
    return "masks.softcap: " + std::to_string(m.softcap) + ", wanted finite and >= 0 (0: off)";
  for (int64_t h = 0; h < H; ++h) {
    if (m.alibi_slopes && !std::isfinite(m.alibi_slopes[h]))
      return "masks.alibi_slopes[" + std::to_string(h) + "]: " + std::to_string(m.alibi_slopes[h]) + ", wanted finite";
    if (m.sinks && !std::isfinite(m.sinks[h]))
      return "masks.sinks[" + std::to_string(h) + "]: " + std::to_string(m.sinks[h]) + ", wanted finite";
  }
  if (p.masks.doc_offsets || p.masks.documents != 0) return check_documents(p);
  return {};
}

}  // namespace

std::string validate(const AttentionForward& p) {
  if (std::string why = check_inputs(p, true); !why.empty()) return why;
  return check_shape("out", p.out, p.B(), p.H(), p.Q(), p.dv());
}

std::string validate(const AttentionBackward& p) {
  if (std::string why = check_inputs(p.fwd, true); !why.empty()) return "fwd." + why;
  const AttentionForward& f = p.fwd;
  const int64_t B = f.B(), H = f.H(), Hkv = f.Hkv(), Q = f.Q(), K = f.K();
  if (f.out.data)
    if (std::string why = check_shape("fwd.out", f.out, B, H, Q, f.dv()); !why.empty()) return why;
  if (!f.stats.empty() && !f.out.data) return "fwd.stats: given without fwd.out, which the fused backward reads";
  if (std::string why = check_shape("grad_out", p.grad_out, B, H, Q, f.dv()); !why.empty()) return why;
  if (std::string why = check_shape("grad_q", p.grad_q, B, H, Q, f.d()); !why.empty()) return why;
  if (std::string why = check_shape("grad_k", p.grad_k, B, Hkv, K, f.d()); !why.empty()) return why;
  if (f.masks.sinks && !p.grad_sinks) return "grad_sinks: null while fwd.masks.sinks is set; wanted [h] floats for their gradient";
  return check_shape("grad_v", p.grad_v, B, Hkv, K, f.dv());
}

std::string validate(const AttentionWeightsParams& p) {
  if (std::string why = check_inputs(p.fwd, false); !why.empty()) return "fwd." + why;
  if (p.fwd.stats.empty()) return "fwd.stats: required, the weights are recomputed from them";
  if (!p.out && !p.batch_rows.empty() && !p.heads.empty()) return "out: null";
  for (int64_t b : p.batch_rows)
    if (b < 0 || b >= p.fwd.B()) return "batch_rows: " + std::to_string(b) + " is outside [0, " + std::to_string(p.fwd.B()) + ")";
  for (int64_t h : p.heads)
    if (h < 0 || h >= p.fwd.H()) return "heads: " + std::to_string(h) + " is outside [0, " + std::to_string(p.fwd.H()) + ")";
  return {};
}

}  // namespace mha::kernels
