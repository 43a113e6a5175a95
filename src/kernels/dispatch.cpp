#include "kernels/dispatch.h"

#include "kernels/attention_fused.h"
#include "kernels/features.h"

namespace mha::kernels {

void attention_forward(AttentionKernel kernel, const AttentionForward& p) {
  switch (kernel) {
    case AttentionKernel::Reference: attention_forward_reference(p); return;
    case AttentionKernel::Blas: attention_forward_blas(p); return;
    case AttentionKernel::Fused:
      // Key axes below 2^24 (float key indices); the BLAS path otherwise.
      if (p.K() <= kFusedMaxKeys && supports(AttentionKernel::Fused, p)) attention_forward_fused(p);
      else attention_forward_blas(p);
      return;
  }
}

void attention_backward(AttentionKernel kernel, const AttentionBackward& p) {
  // Never a backward that would drop one of p's options (kernels/features.h).
  switch (kernel_for(kernel, p)) {
    case AttentionKernel::Reference: attention_backward_reference(p); return;
    case AttentionKernel::Blas: attention_backward_blas(p); return;
    case AttentionKernel::Fused: break;  // its backward needs the fused forward's statistics: BLAS
  }
  attention_backward_blas(p);
}

}  // namespace mha::kernels
