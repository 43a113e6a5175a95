// The masked reference backward against central finite differences of a
// double-precision forward, on tiny shapes with every mask option, grouped
// heads and dropout; and its values on fully masked rows.
#include <cmath>
#include <vector>

#include "cpu/reference/attention_backward_masked.h"
#include "kernels/masked_row.h"
#include "mha/error.h"
#include "test_util.h"

using namespace mha;
using mha::test::random_tensor;

namespace {

// Tiny attention problem: q (B, Q, H*d), k (B, K, Hkv*d), v (B, K, Hkv*dv)
// buffers seen as heads, the options drawn at random.
struct Problem {
  int64_t B, H, Hkv, Q, K, d, dv;
  Tensor q, k, v, grad_out;  // grad_out (B, Q, H*dv): the loss is sum(out * grad_out)
  std::vector<uint8_t> key_keep, pair_keep;
  std::vector<float> key_bias, pair_bias, lens;
  kernels::AttentionForward p;

  Problem(Generator& gen, int trial) {
    B = 2;
    Hkv = 1 + static_cast<int64_t>(gen.below(2));
    H = Hkv * (1 + static_cast<int64_t>(gen.below(2)));
    Q = 1 + static_cast<int64_t>(gen.below(4));
    K = 1 + static_cast<int64_t>(gen.below(4));
    d = 1 + static_cast<int64_t>(gen.below(3));
    dv = d;  // the head split takes one width for k and v
    q = random_tensor({B, Q, H * d}, gen, -1.5f, 1.5f);
    k = random_tensor({B, K, Hkv * d}, gen, -1.5f, 1.5f);
    v = random_tensor({B, K, Hkv * dv}, gen);
    grad_out = random_tensor({B, Q, H * dv}, gen);
    p.scale_divisor = std::sqrt(static_cast<float>(d));
    auto coin = [&](double prob) { return gen.uniform() < prob; };
    kernels::MaskOptions& m = p.masks;
    if (coin(0.5)) {
      for (int64_t x = 0; x < B * K; ++x) key_keep.push_back(coin(0.7));
      m.key_keep = key_keep.data();
    }
    if (coin(0.4)) {
      for (int64_t x = 0; x < B * K; ++x) key_bias.push_back(coin(0.2) ? -INFINITY : gen.uniform(-2, 2));
      m.key_bias = key_bias.data();
    }
    if (coin(0.5)) {
      m.pair_stride_h = Q * K;
      m.pair_stride_b = H * Q * K;
      for (int64_t x = 0; x < B * H * Q * K; ++x) {
        pair_keep.push_back(coin(0.8));
        pair_bias.push_back(gen.uniform(-1, 1));
      }
      if (coin(0.7)) m.pair_keep = pair_keep.data();
      if (coin(0.5)) m.pair_bias = pair_bias.data();
    }
    if (coin(0.3)) {
      for (int64_t x = 0; x < B; ++x) lens.push_back(static_cast<float>(gen.below(K + 1)));
      p.length_kind = kernels::LengthKind::PerBatch;
      p.lens = lens.data();
    }
    m.causal = static_cast<Causal>(gen.below(3));
    m.fill = coin(0.5) ? kernels::MaskFill::Seed : kernels::MaskFill::NegInf;
    m.fully_masked = coin(0.5) ? FullyMaskedRows::Uniform : FullyMaskedRows::Zeros;
    if (trial % 3 == 0) p.dropout = {0.3f, gen.next()};
    p.q = q.view().split_heads(H);
    p.k = k.view().split_heads(Hkv);
    p.v = v.view().split_heads(Hkv);
  }

  // sum(out * grad_out) in double, for q, k, v given as doubles in the
  // layouts of the tensors above. Masks by takes_part (kernels/masked_row.h).
  double loss(const std::vector<double>& qd, const std::vector<double>& kd,
              const std::vector<double>& vd) const {
    const kernels::MaskOptions& m = p.masks;
    double total = 0.0;
    std::vector<double> s(static_cast<size_t>(K));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hk = h / (H / Hkv);
        for (int64_t i = 0; i < Q; ++i) {
          int64_t kept = 0, live = 0;
          double mx = -INFINITY;
          for (int64_t j = 0; j < K; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < d; ++c)
              dot += qd[(b * Q + i) * H * d + h * d + c] * kd[(b * K + j) * Hkv * d + hk * d + c];
            double x = dot / std::sqrt(static_cast<double>(d));
            if (m.key_bias) x += m.key_bias[b * K + j];
            if (m.pair_bias) x += m.pair_bias[m.pair_offset(b, h, i, K) + j];
            const bool keep = kernels::takes_part(m, p.length(b, i), b, h, i, j, Q, K);
            if (!keep) x = m.fill_value();
            kept += keep;
            live += keep && x != -INFINITY;
            s[j] = x;
            mx = std::max(mx, x);
          }
          // The policy when no key is kept or every score is -inf (see
          // kernels/params.h); a plain softmax otherwise.
          const bool any = !(kept == 0 || (live == 0 && (kept == K || m.fill == kernels::MaskFill::NegInf)));
          double sum = 0;
          for (int64_t j = 0; j < K; ++j) sum += (s[j] = any ? std::exp(s[j] - mx) : 1.0);
          const bool zeros = !any && m.fully_masked == FullyMaskedRows::Zeros;
          for (int64_t c = 0; c < dv; ++c) {
            double o = 0;
            for (int64_t j = 0; j < K; ++j) {
              const double w = zeros ? 0.0 : s[j] / sum;
              const uint64_t idx = static_cast<uint64_t>(((b * H + h) * Q + i) * K + j);
              o += w * p.dropout.multiplier(idx) * vd[(b * K + j) * Hkv * dv + hk * dv + c];
            }
            total += o * grad_out.data()[(b * Q + i) * H * dv + h * dv + c];
          }
        }
      }
    return total;
  }
};

std::vector<double> as_double(const Tensor& t) { return {t.values().begin(), t.values().end()}; }

}  // namespace

TEST(MaskBackward, ReferenceMatchesFiniteDifferencesOnEveryOption) {
  Generator gen(17);
  int with_empty_rows = 0;
  for (int trial = 0; trial < 80; ++trial) {
    Problem pr(gen, trial);
    Tensor gq(pr.q.shape()), gk(pr.k.shape()), gv(pr.v.shape());
    kernels::attention_backward_masked_reference(pr.p, pr.grad_out.view().split_heads(pr.H),
                                                 gq.view().split_heads(pr.H),
                                                 gk.view().split_heads(pr.Hkv),
                                                 gv.view().split_heads(pr.Hkv));
    std::vector<double> qd = as_double(pr.q), kd = as_double(pr.k), vd = as_double(pr.v);
    std::vector<double>* inputs[] = {&qd, &kd, &vd};
    const Tensor* grads[] = {&gq, &gk, &gv};
    const char* names[] = {"grad_q", "grad_k", "grad_v"};
    const double h = 1e-6;
    for (int t = 0; t < 3; ++t) {
      std::vector<double>& x = *inputs[t];
      for (size_t e = 0; e < x.size(); ++e) {
        const double keep = x[e];
        x[e] = keep + h;
        const double up = pr.loss(qd, kd, vd);
        x[e] = keep - h;
        const double down = pr.loss(qd, kd, vd);
        x[e] = keep;
        const double fd = (up - down) / (2 * h);
        const double got = grads[t]->data()[e];
        ASSERT_TRUE(std::isfinite(got)) << names[t] << " trial " << trial;
        EXPECT_NEAR(got, fd, 1e-5 * std::fabs(fd) + 2e-6) << names[t] << "[" << e << "] trial " << trial;
      }
    }
    // Count problems with a fully masked row, so the draw is known to test them.
    auto has_empty_row = [&] {
      for (int64_t b = 0; b < pr.B; ++b)
        for (int64_t hh = 0; hh < pr.H; ++hh)
          for (int64_t i = 0; i < pr.Q; ++i) {
            std::vector<float> row(static_cast<size_t>(pr.K));
            for (int64_t j = 0; j < pr.K; ++j) {
              double dot = 0;
              for (int64_t c = 0; c < pr.d; ++c)
                dot += pr.p.q.ptr(b, hh, i)[c] * pr.p.k.ptr(b, pr.p.kv_head(hh), j)[c];
              row[j] = static_cast<float>(dot);
            }
            if (kernels::masked_softmax_row(pr.p.masks, pr.p.length(b, i), pr.p.scale_divisor, b, hh,
                                            i, pr.Q, pr.K, row.data()))
              return true;
          }
      return false;
    };
    with_empty_rows += has_empty_row();
  }
  EXPECT_GT(with_empty_rows, 15);
}

TEST(MaskBackward, FullyMaskedRowsPassGradientOnlyToValues) {
  // One head, every key masked: uniform rows give grad_v = dO / K per key,
  // zero rows give nothing, and neither gives q or k a gradient.
  for (FullyMaskedRows policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros}) {
    Generator gen(3);
    const int64_t Q = 2, K = 4, d = 3;
    const Tensor q = random_tensor({1, Q, d}, gen), k = random_tensor({1, K, d}, gen),
                 v = random_tensor({1, K, d}, gen), dO = random_tensor({1, Q, d}, gen);
    const uint8_t none[K] = {0, 0, 0, 0};
    kernels::AttentionForward p;
    p.q = q.view().split_heads(1);
    p.k = k.view().split_heads(1);
    p.v = v.view().split_heads(1);
    p.masks.key_keep = none;
    p.masks.fill = kernels::MaskFill::NegInf;
    p.masks.fully_masked = policy;
    Tensor gq({1, Q, d}, NAN), gk({1, K, d}, NAN), gv({1, K, d}, NAN);
    kernels::attention_backward_masked_reference(p, dO.view().split_heads(1), gq.view().split_heads(1),
                                                 gk.view().split_heads(1), gv.view().split_heads(1));
    for (float x : gq.values()) EXPECT_EQ(x, 0.0f);
    for (float x : gk.values()) EXPECT_EQ(x, 0.0f);
    for (int64_t j = 0; j < K; ++j)
      for (int64_t c = 0; c < d; ++c) {
        const float want = policy == FullyMaskedRows::Uniform
                               ? (dO.at({0, 0, c}) + dO.at({0, 1, c})) / K
                               : 0.0f;
        EXPECT_NEAR(gv.at({0, j, c}), want, 1e-7);
      }
  }
}
