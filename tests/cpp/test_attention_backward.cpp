// The attention backward kernels: BLAS against the reference on awkward
// shapes, masks and dropout; saved weights and recomputation agree; masked keys get exactly zero gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/attention_kernels.h"
#include "kernels/dispatch.h"
#include "mha/random.h"

namespace mha::kernels {
namespace {

struct Case {
  int64_t B, H, Q, K, d, dv;
  LengthKind kind;
  float dropout;
};

Tensor random_tensor(Shape shape, Generator& gen) {
  Tensor t(std::move(shape));
  for (float& x : t.values()) x = static_cast<float>(gen.normal());
  return t;
}

// Relative error of `got` against `want`, in the max norm of `want`.
double max_rel_error(const Tensor& got, const Tensor& want) {
  double err = 0.0, scale = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    err = std::fmax(err, std::fabs(static_cast<double>(got.data()[i]) - want.data()[i]));
    scale = std::fmax(scale, std::fabs(static_cast<double>(want.data()[i])));
  }
  return err / (scale + 1e-30);
}

struct Problem {
  Tensor q, k, v, dO, out, weights, lens;
  AttentionForward f;
  AttentionBackward p;
};

void build(const Case& c, Generator& gen, Problem& pr) {
  pr.q = random_tensor({c.B, c.H, c.Q, c.d}, gen);
  pr.k = random_tensor({c.B, c.H, c.K, c.d}, gen);
  pr.v = random_tensor({c.B, c.H, c.K, c.dv}, gen);
  pr.dO = random_tensor({c.B, c.H, c.Q, c.dv}, gen);
  pr.out = Tensor({c.B, c.H, c.Q, c.dv});
  pr.weights = Tensor({c.B, c.H, c.Q, c.K});
  if (c.kind == LengthKind::PerBatch) pr.lens = Tensor({c.B});
  if (c.kind == LengthKind::PerQuery) pr.lens = Tensor({c.B, c.Q});
  // Lengths 0 .. K+1 including fractions.
  for (float& x : pr.lens.values()) x = static_cast<float>(gen.below(2 * c.K + 3)) * 0.5f;
  AttentionForward& f = pr.f;
  f.q = pr.q.view(); f.k = pr.k.view(); f.v = pr.v.view(); f.out = pr.out.view();
  f.weights = pr.weights.data();
  f.length_kind = c.kind;
  f.lens = pr.lens.empty() ? nullptr : pr.lens.data();
  f.scale_divisor = std::sqrt(static_cast<float>(c.d));
  f.dropout = {c.dropout, gen.next()};
  attention_forward_reference(f);
  AttentionBackward& p = pr.p;
  p.fwd = f;
  p.fwd.weights = nullptr;  // each test hands the saved weights over or not
  p.grad_out = pr.dO.view();
}

struct Grads {
  Tensor q, k, v;
  Grads(const Case& c) : q({c.B, c.H, c.Q, c.d}), k({c.B, c.H, c.K, c.d}), v({c.B, c.H, c.K, c.dv}) {}
  void attach(AttentionBackward& p) { p.grad_q = q.view(); p.grad_k = k.view(); p.grad_v = v.view(); }
};

TEST(AttentionBackward, BlasMatchesReference) {
  Generator gen(7);
  const LengthKind kinds[] = {LengthKind::None, LengthKind::PerBatch, LengthKind::PerQuery};
  int cases = 0;
  for (int64_t Q : {1, 2, 7, 13})
    for (int64_t K : {1, 3, 11, 17})
      for (LengthKind kind : kinds)
        for (float dropout : {0.0f, 0.3f}) {
          const Case c{1 + static_cast<int64_t>(gen.below(3)), 1 + static_cast<int64_t>(gen.below(3)),
                       Q, K, 1 + static_cast<int64_t>(gen.below(9)), 1 + static_cast<int64_t>(gen.below(9)),
                       kind, dropout};
          Problem pr;
          build(c, gen, pr);
          Grads ref(c), blas(c), recomputed(c);
          AttentionBackward p = pr.p;
          ref.attach(p);
          attention_backward_reference(p);
          p.fwd.weights = pr.weights.data();
          blas.attach(p);
          attention_backward_blas(p);
          p.fwd.weights = nullptr;  // recompute the weights from q and k
          recomputed.attach(p);
          attention_backward_blas(p);
          for (const Grads* g : {&blas, &recomputed}) {
            EXPECT_LT(max_rel_error(g->q, ref.q), 1e-5) << "Q " << Q << " K " << K;
            EXPECT_LT(max_rel_error(g->k, ref.k), 1e-5) << "Q " << Q << " K " << K;
            EXPECT_LT(max_rel_error(g->v, ref.v), 1e-5) << "Q " << Q << " K " << K;
          }
          ++cases;
        }
  EXPECT_EQ(cases, 96);
}

TEST(AttentionBackward, MaskedKeysGetExactlyZeroGradient) {
  Generator gen(11);
  for (float dropout : {0.0f, 0.5f}) {
    const Case c{3, 2, 6, 10, 5, 3, LengthKind::PerBatch, dropout};
    Problem pr;
    build(c, gen, pr);
    pr.lens = Tensor({c.B}, std::vector<float>{4.0f, 1.0f, 7.5f});
    pr.p.fwd.lens = pr.f.lens = pr.lens.data();
    attention_forward_reference(pr.f);
    for (auto* kernel : {&attention_backward_reference, &attention_backward_blas}) {
      Grads g(c);
      AttentionBackward p = pr.p;
      p.fwd.weights = pr.weights.data();
      g.attach(p);
      kernel(p);
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t j = 0; j < c.K; ++j) {
            if (static_cast<float>(j) < pr.lens.data()[b]) continue;  // a valid key
            for (int64_t x = 0; x < c.d; ++x) EXPECT_EQ(g.k.at({b, h, j, x}), 0.0f) << b << h << j;
            for (int64_t x = 0; x < c.dv; ++x) EXPECT_EQ(g.v.at({b, h, j, x}), 0.0f) << b << h << j;
          }
    }
  }
}

}  // namespace
}  // namespace mha::kernels
