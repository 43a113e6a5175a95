// src/nn/functional.cpp: mha::attention (mha/functional.h): the modules'
// mask and option checks (nn/call_masks.h) on tensors already projected,
// then one kernel call through the dispatch.
#include "mha/functional.h"

#include <cmath>

#include "core/finite.h"
#include "core/memory.h"
#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "mha/error.h"
#include "nn/call_masks.h"

namespace mha {

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  static const char* op = "mha::attention";
  const char* names[] = {"q", "k", "v"};
  const char* wanted[] = {"(B, H, Q, d)", "(B, Hkv, K, d)", "(B, Hkv, K, dv)"};
  const Tensor* in[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (in[i]->dim() != 4) fail(op, names[i], ": shape ", shape_str(in[i]->shape()), " is not ", wanted[i]);
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), K = k.size(2), dv = v.size(3);
  if (k.size(0) != B || k.size(3) != d)
    fail(op, "k: shape ", shape_str(k.shape()), " does not match q ", shape_str(q.shape()), "; wanted (", B,
         ", Hkv, K, ", d, ")");
  if (v.size(0) != B || v.size(1) != Hkv || v.size(2) != K)
    fail(op, "v: shape ", shape_str(v.shape()), " does not match k ", shape_str(k.shape()), "; wanted (", B, ", ",
         Hkv, ", ", K, ", dv)");
  if (Hkv <= 0 || H % Hkv != 0)
    fail(op, "k: ", Hkv, " key/value heads do not divide q's ", H, " heads");
  if (K == 0) fail(op, "k: shape ", shape_str(k.shape()), " has no keys to attend to");
  if (d == 0) fail(op, "q: shape ", shape_str(q.shape()), " has no features; the scores would be 0 / 0");
  const float scale = options.scale;
  if (!(scale == 0.0f || (std::isfinite(scale) && scale > 0.0f)))
    fail(op, "options.scale: ", scale, "; wanted 0 (1/sqrt(d)) or a finite number > 0");
  options.valid_lens.check(op, B, Q);
  const CallMasks& m = options.masks;
  const nn::MaskGeometry g{true, B, Q, K, K, H};
  nn::AttentionMasks masks =
      nn::build_masks(op, m.key_padding_mask, m.attn_mask, m.causal, m.window, m.fully_masked_rows, g);
  nn::add_score_options(op, m.scores, g, masks);
  core::MemoryPlan plan(op);
  plan.add("output", {B, H, Q, dv});
  if (options.kernel != AttentionKernel::Fused) plan.add("attention weights", {B, H, Q, K});
  plan.check();

  Tensor out({B, H, Q, dv});
  kernels::AttentionForward p;
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.out = out.view();
  kernels::set_lengths(p, options.valid_lens);
  p.masks = masks.options();
  p.scale_divisor = scale == 0.0f ? std::sqrt(static_cast<float>(d)) : 1.0f / scale;
  if (!std::isfinite(p.scale_divisor) || p.scale_divisor <= 0.0f)
    fail(op, "options.scale: ", scale, " is 0 or infinite once inverted in float32; wanted a number from ~3e-39 "
         "to ~3e38");
  (void)kernels::attention_forward(options.kernel, p);
  // Finite inputs whose scores overflow float32 give NaN rows: an error
  // instead (NaN or infinite inputs are computed through).
  if (!core::all_finite(out) && core::all_finite(q) && core::all_finite(k) && core::all_finite(v))
    fail(op, "finite q and k give scores that overflow float32 (largest magnitudes ", core::max_abs(q), " and ",
         core::max_abs(k), "); scale them down");
  return out;
}

}  // namespace mha
