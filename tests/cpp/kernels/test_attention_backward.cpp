// The unfused attention backwards (reference, BLAS): keys past the lengths
// get exactly zero gradient. (Every backward against the reference:
// test_kernel_cases.cpp.)
#include <gtest/gtest.h>

#include <vector>

#include "cpu/blas/attention_blas.h"
#include "cpu/reference/reference.h"
#include "kernels/case_data.h"

namespace mha::kernels {
namespace {

TEST(AttentionBackward, MaskedKeysGetExactlyZeroGradient) {
  for (float dropout : {0.0f, 0.5f}) {
    Case c;
    c.family = "masked keys";
    c.B = 3, c.H = c.Hkv = 2, c.Q = 6, c.K = 10, c.d = 5, c.dv = 3;
    c.length_kind = LengthKind::PerBatch;
    c.lens = {4.0f, 1.0f, 7.5f};
    c.dropout = dropout;
    c.seed = 11;
    const CaseData data(c);
    Tensor out = data.new_out(), weights = data.new_weights();
    AttentionForward f = data.forward();
    f.out = out.view().split_heads(c.H);
    f.weights = weights.data();
    attention_forward_reference(f);
    for (auto* kernel : {&attention_backward_reference, &attention_backward_blas}) {
      Tensor gq({c.B, c.Q, c.H * c.d}), gk({c.B, c.K, c.H * c.d}), gv({c.B, c.K, c.H * c.dv});
      AttentionBackward p;
      p.fwd = f;  // with the saved weights
      p.grad_out = data.grad_out.view().split_heads(c.H);
      p.grad_q = gq.view().split_heads(c.H);
      p.grad_k = gk.view().split_heads(c.H);
      p.grad_v = gv.view().split_heads(c.H);
      kernel(p);
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t j = 0; j < c.K; ++j) {
          if (static_cast<float>(j) < c.lens[static_cast<size_t>(b)]) continue;  // a valid key
          for (int64_t x = 0; x < c.H * c.d; ++x) EXPECT_EQ(gk.at({b, j, x}), 0.0f) << b << " " << j;
          for (int64_t x = 0; x < c.H * c.dv; ++x) EXPECT_EQ(gv.at({b, j, x}), 0.0f) << b << " " << j;
        }
    }
  }
}

}  // namespace
}  // namespace mha::kernels
