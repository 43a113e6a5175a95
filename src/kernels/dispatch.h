// src/kernels/dispatch.h: runs the kernel a module chose.
#pragma once

#include "kernels/attention_params.h"
#include "mha/attention.h"
#include "mha/valid_lens.h"

namespace mha::kernels {

void attention_forward(AttentionKernel kernel, const AttentionForward& p);

// Fills p.length_kind / p.lens from a validated ValidLens.
inline void set_lengths(AttentionForward& p, const ValidLens& lens) {
  switch (lens.kind()) {
    case ValidLens::Kind::None: p.length_kind = LengthKind::None; break;
    case ValidLens::Kind::PerBatch: p.length_kind = LengthKind::PerBatch; break;
    case ValidLens::Kind::PerQuery: p.length_kind = LengthKind::PerQuery; break;
  }
  p.lens = lens.data();
}

}  // namespace mha::kernels
