#include "kernels/dispatch.h"

#include "kernels/attention_fused.h"

namespace mha::kernels {

void attention_forward(AttentionKernel kernel, const AttentionForward& p) {
  switch (kernel) {
    case AttentionKernel::Reference: attention_forward_reference(p); return;
    case AttentionKernel::Blas: attention_forward_blas(p); return;
    case AttentionKernel::Fused: attention_forward_fused(p); return;
  }
}

}  // namespace mha::kernels
