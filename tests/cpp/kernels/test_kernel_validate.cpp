// kernels::validate: each parameter struct a module can fill wrong is
// reported, and a consistent one is not; the dispatcher refuses a bad
// struct in every build.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/validate.h"
#include "mha/error.h"
#include "mha/tensor.h"

namespace mha::kernels {
namespace {

// A consistent call: B 2, H 4, Hkv 2, Q 3, K 5, d 6, dv 7, per-batch lengths.
struct Consistent {
  Tensor q{{2, 4, 3, 6}}, k{{2, 2, 5, 6}}, v{{2, 2, 5, 7}}, out{{2, 4, 3, 7}};
  Tensor dO{{2, 4, 3, 7}}, gq{{2, 4, 3, 6}}, gk{{2, 2, 5, 6}}, gv{{2, 2, 5, 7}};
  std::vector<float> lens{3.0f, 5.0f}, stats = std::vector<float>(2 * 2 * 4 * 3);
  AttentionForward f;
  AttentionBackward b;
  AttentionWeightsParams w;
  Tensor w_out{{1, 1, 3, 5}};
  Consistent() {
    f.q = q.view(); f.k = k.view(); f.v = v.view(); f.out = out.view();
    f.length_kind = LengthKind::PerBatch;
    f.lens = lens.data();
    f.scale_divisor = std::sqrt(6.0f);
    b.fwd = f;
    b.grad_out = dO.view(); b.grad_q = gq.view(); b.grad_k = gk.view(); b.grad_v = gv.view();
    w.fwd = f;
    w.fwd.stats = {stats.data(), stats.data() + 24};
    w.batch_rows = {1};
    w.heads = {3};
    w.out = w_out.data();
  }
};

// `why` names `field`.
::testing::AssertionResult names(const std::string& why, const std::string& field) {
  if (why.find(field) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << why << "' does not name " << field;
}

TEST(KernelValidate, AConsistentStructPasses) {
  Consistent c;
  EXPECT_EQ(validate(c.f), "");
  EXPECT_EQ(validate(c.b), "");
  EXPECT_EQ(validate(c.w), "");
}

TEST(KernelValidate, EachInconsistencyIsNamed) {
  {
    Consistent c;
    c.f.q.stride[3] = 2;  // innermost not contiguous
    EXPECT_TRUE(names(validate(c.f), "q: innermost stride"));
  }
  {
    Consistent c;
    c.f.v.shape[2] = 4;  // K differs between k and v
    EXPECT_TRUE(names(validate(c.f), "v: shape"));
  }
  {
    Consistent c;
    c.f.out.shape[3] = 6;  // out is not dv wide
    EXPECT_TRUE(names(validate(c.f), "out: shape"));
  }
  {
    Consistent c;
    Tensor k3({2, 3, 5, 6}), v3({2, 3, 5, 7});
    c.f.k = k3.view();  // 3 kv heads do not divide 4
    c.f.v = v3.view();
    EXPECT_TRUE(names(validate(c.f), "kv heads do not divide"));
  }
  {
    Consistent c;
    c.f.lens = nullptr;  // kind PerBatch without lengths
    EXPECT_TRUE(names(validate(c.f), "lens"));
    Consistent d;
    d.f.length_kind = LengthKind::None;  // lengths without a kind
    EXPECT_TRUE(names(validate(d.f), "lens"));
  }
  {
    Consistent c;
    c.f.stats.row_max2 = c.stats.data();  // one statistics pointer of two
    EXPECT_TRUE(names(validate(c.f), "stats"));
  }
  {
    Consistent c;
    c.f.scale_divisor = 0.0f;
    EXPECT_TRUE(names(validate(c.f), "scale_divisor"));
    Consistent d;
    d.f.dropout.p = 1.5f;
    EXPECT_TRUE(names(validate(d.f), "dropout.p"));
  }
  {
    Consistent c;
    c.b.grad_k.shape[1] = 4;  // grad_k has the query heads, not the kv heads
    EXPECT_TRUE(names(validate(c.b), "grad_k"));
    Consistent d;
    d.b.grad_out.shape[2] = 2;
    EXPECT_TRUE(names(validate(d.b), "grad_out"));
    Consistent e;
    e.b.fwd.k.stride[3] = 3;  // the forward's fields are checked too
    EXPECT_TRUE(names(validate(e.b), "fwd.k"));
    Consistent s;
    s.b.fwd.stats = {s.stats.data(), s.stats.data() + 24};
    s.b.fwd.out = TensorView{};  // statistics without the output the fused backward reads
    EXPECT_TRUE(names(validate(s.b), "fwd.stats"));
  }
  {
    Consistent c;
    c.w.fwd.stats = {};
    EXPECT_TRUE(names(validate(c.w), "fwd.stats"));
    Consistent d;
    d.w.heads = {4};
    EXPECT_TRUE(names(validate(d.w), "heads"));
    Consistent e;
    e.w.batch_rows = {-1};
    EXPECT_TRUE(names(validate(e.w), "batch_rows"));
  }
}

// In every build the dispatcher checks every struct before any kernel reads
// it, and throws naming the entry and the field.
TEST(KernelValidate, DispatchRefusesABadStructInEveryBuild) {
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  Consistent c;
  c.f.v.shape[2] = 4;
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Blas, AttentionKernel::Fused})
    EXPECT_EQ(message([&] { (void)attention_forward(kernel, c.f); }).rfind(
                  "[kernels::attention_forward] inconsistent kernel parameters: v: shape", 0),
              0u);
  Consistent d;
  d.b.grad_v.shape[3] = 6;
  EXPECT_NE(message([&] { attention_backward(AttentionKernel::Blas, d.b); })
                .find("[kernels::attention_backward] inconsistent kernel parameters: grad_v"),
            std::string::npos);
  Consistent w;
  w.w.heads = {4};
  EXPECT_NE(message([&] { attention_weights(w.w); }).find("inconsistent kernel parameters: heads: 4"),
            std::string::npos);
}

}  // namespace
}  // namespace mha::kernels
