#include "kernels/dispatch.h"

#include <string>

#include "cpu/blas/attention_blas.h"
#include "cpu/decode/decode.h"
#include "cpu/fused/attention_fused.h"
#include "cpu/fused/limits.h"
#include "cpu/reference/reference.h"
#include "kernels/validate.h"
#include "mha/error.h"

namespace mha::kernels {

namespace {

// Every build: a module that filled a struct wrong gets an mha::Error naming
// the field here, rather than a kernel reading out of bounds. The checks are
// a few comparisons per call (kernels/validate.h).
template <class Params>
void check_params(const char* entry, const Params& p) {
  if (const std::string why = validate(p); !why.empty()) fail(entry, "inconsistent kernel parameters: ", why);
}

}  // namespace

bool runs_fused(AttentionKernel kernel, int64_t keys) {
  // Key axes up to kFusedMaxKeys (float key indices); the BLAS path otherwise.
  return kernel == AttentionKernel::Fused && keys <= kFusedMaxKeys;
}

SoftmaxStats attention_forward(AttentionKernel kernel, const AttentionForward& p) {
  check_params("kernels::attention_forward", p);
  if (runs_fused(kernel, p.K())) {
    attention_forward_fused(p);
    return p.stats;
  }
  switch (kernel) {
    case AttentionKernel::Reference: attention_forward_reference(p); break;
    case AttentionKernel::Blas:
    case AttentionKernel::Fused: attention_forward_blas(p); break;
  }
  return {};
}

void attention_backward(AttentionKernel kernel, const AttentionBackward& p) {
  check_params("kernels::attention_backward", p);
  if (!p.fwd.stats.empty()) {
    attention_backward_fused(p);
    return;
  }
  if (kernel == AttentionKernel::Reference) attention_backward_reference(p);
  else attention_backward_blas(p);
}

void attention_weights(const AttentionWeightsParams& p) {
  check_params("kernels::attention_weights", p);
  attention_weights_fused(p);
}

bool decode_runs_fused(const DecodeParams& p) {
  // The switch point (cpu/decode/decode.h): see the measurements above
  // kDecodeFusedMinQueries.
  if (p.Qn < decode_fused_min_queries(p.dtype)) return false;
  if (p.ring) return false;  // the fused kernel reads each row's keys in slot order from slot 0
  for (int64_t b = 0; b < p.B; ++b)
    if (p.lengths[b] > kFusedMaxKeys) return false;
  return true;
}

void decode_forward(const DecodeParams& p) {  // both kernels validate p themselves
  if (decode_runs_fused(p)) decode_attention_fused(p);
  else decode_attention(p);
}

bool decode_runs_fused(const AttentionForward& p) {
  return decode_runs_fused(decode_params(p, "kernels::decode_runs_fused", /*check=*/false));
}

void decode_forward(const AttentionForward& p, const char* op) { decode_forward(decode_params(p, op)); }

int64_t decode_forward_working_bytes(const AttentionForward& p, int threads) {
  const DecodeParams d = decode_params(p, "kernels::decode_forward_working_bytes", /*check=*/false);
  return decode_runs_fused(d) ? decode_fused_working_bytes(d) : decode_working_bytes(d, threads);
}

}  // namespace mha::kernels
