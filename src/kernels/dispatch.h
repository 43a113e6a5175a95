// src/kernels/dispatch.h: runs the kernel a module chose.
#pragma once

#include "kernels/attention_backward.h"
#include "kernels/attention_params.h"
#include "kernels/features.h"
#include "mha/attention.h"
#include "mha/valid_lens.h"

namespace mha::kernels {

void attention_forward(AttentionKernel kernel, const AttentionForward& p);
// A kernel without a backward of its own uses the BLAS one: all kernels
// compute the same function, so any backward differentiates any forward.
// So does a kernel whose backward lacks an option p uses (kernels/features.h).
void attention_backward(AttentionKernel kernel, const AttentionBackward& p);

// Fills p.length_kind / p.lens from a validated ValidLens.
inline void set_lengths(AttentionForward& p, const ValidLens& lens) {
  switch (lens.kind()) {
    case ValidLens::Kind::None: p.length_kind = LengthKind::None; break;
    case ValidLens::Kind::PerBatch: p.length_kind = LengthKind::PerBatch; break;
    case ValidLens::Kind::PerQuery: p.length_kind = LengthKind::PerQuery; break;
  }
  p.lens = lens.data();
}
inline void set_lengths(AttentionBackward& p, const ValidLens& lens) {
  AttentionForward f;
  set_lengths(f, lens);
  p.length_kind = f.length_kind;
  p.lens = f.lens;
}

}  // namespace mha::kernels
