// Attention sinks (ScoreOptions::sinks) on both modules: forward against a
// plain double-precision composition (projections, scores / sqrt(d), the
// masks, a softmax whose denominator holds exp(sink_h), W_o), the sinks'
// gradient (InputGrads::sinks) against central differences of that
// composition, cached decoding against the uncached causal call, and the
// errors. The comparison with PyTorch's autograd for every gradient lives in
// tests/python/test_module_sinks.py.
#include <cmath>
#include <vector>

#include "mha/error.h"
#include "mha/multihead.h"
#include "mha/torch_mha.h"
#include "test_util.h"

using namespace mha;
using mha::test::all_close;
using mha::test::random_tensor;
using mha::test::throws_with;

namespace {

const AttentionKernel kKernels[] = {AttentionKernel::Reference, AttentionKernel::Blas, AttentionKernel::Fused};

// x:[rows, in] W:[out, in] -> x W^T in double.
std::vector<double> project(const Tensor& x, const Tensor& W) {
  const int64_t out = W.size(0), in = W.size(1), rows = x.numel() / in;
  std::vector<double> y(static_cast<size_t>(rows * out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t c = 0; c < in; ++c) s += static_cast<double>(x.data()[r * in + c]) * W.data()[o * in + c];
      y[static_cast<size_t>(r * out + o)] = s;
    }
  return y;
}

struct Case {
  int64_t B = 2, L = 7, D = 12, H = 3;
  std::vector<float> lens;  // per batch row, or empty
  bool causal = false;      // masks: -inf for masked keys (the chapter's -1e6 for lengths alone)
};

// Self-attention over x:[B, L, D] with W_q, W_k, W_v, W_o:[D, D] and sinks
// [H] -> [B, L, D] in double (key j of query i kept iff j < lens[b] and,
// with causal, j <= i).
std::vector<double> reference(const Case& c, const Tensor& x, const Tensor* W, const std::vector<double>& sinks) {
  const int64_t B = c.B, L = c.L, D = c.D, H = c.H, d = D / H;
  const std::vector<double> q = project(x, W[0]), k = project(x, W[1]), v = project(x, W[2]);
  std::vector<double> concat(static_cast<size_t>(B * L * D), 0.0);
  const double fill = c.causal ? -INFINITY : -1e6;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<size_t>(L));
        double mx = sinks.empty() ? -INFINITY : sinks[static_cast<size_t>(h)];
        for (int64_t j = 0; j < L; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e) dot += q[(b * L + i) * D + h * d + e] * k[(b * L + j) * D + h * d + e];
          const bool kept = (c.lens.empty() || j < c.lens[static_cast<size_t>(b)]) && (!c.causal || j <= i);
          s[static_cast<size_t>(j)] = kept ? dot / std::sqrt(static_cast<double>(d)) : fill;
          mx = std::fmax(mx, s[static_cast<size_t>(j)]);
        }
        double sum = sinks.empty() ? 0.0 : std::exp(sinks[static_cast<size_t>(h)] - mx);
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int64_t j = 0; j < L; ++j)
          for (int64_t e = 0; e < d; ++e)
            concat[(b * L + i) * D + h * d + e] += s[static_cast<size_t>(j)] / sum * v[(b * L + j) * D + h * d + e];
      }
  std::vector<double> out(static_cast<size_t>(B * L * D), 0.0);
  for (int64_t r = 0; r < B * L; ++r)
    for (int64_t o = 0; o < D; ++o)
      for (int64_t e = 0; e < D; ++e) out[r * D + o] += concat[r * D + e] * W[3].data()[o * D + e];
  return out;
}

Tensor to_float(const std::vector<double>& x, const Shape& shape) {
  Tensor t(shape);
  for (size_t i = 0; i < x.size(); ++i) t.data()[i] = static_cast<float>(x[i]);
  return t;
}

double dot(const std::vector<double>& a, const Tensor& g) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * g.data()[i];
  return s;
}

// d sum(out * G) / d sinks by central differences of the double reference.
std::vector<double> sink_gradient(const Case& c, const Tensor& x, const Tensor* W, const std::vector<double>& sinks,
                                  const Tensor& G) {
  std::vector<double> g(sinks.size());
  const double eps = 1e-4;
  for (size_t h = 0; h < sinks.size(); ++h) {
    std::vector<double> up = sinks, down = sinks;
    up[h] += eps;
    down[h] -= eps;
    g[h] = (dot(reference(c, x, W, up), G) - dot(reference(c, x, W, down), G)) / (2 * eps);
  }
  return g;
}

// Sinks of every kind: dominating (+20), negligible (-20), ordinary.
std::vector<float> draw_sinks(int64_t H, Generator& gen) {
  std::vector<float> s(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) s[static_cast<size_t>(h)] = h % 3 == 0 ? 20.0f : h % 3 == 1 ? -20.0f : gen.uniform(-2.0f, 2.0f);
  return s;
}

void expect_sink_grads(const Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.shape(), (Shape{static_cast<int64_t>(want.size())}));
  double scale = 1e-3;
  for (double w : want) scale = std::fmax(scale, std::fabs(w));
  for (size_t h = 0; h < want.size(); ++h) EXPECT_NEAR(got.data()[h], want[h], 2e-4 * scale) << "head " << h;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  Case plain;
  out.push_back(plain);
  Case lens;
  lens.L = 9, lens.lens = {4, 0};  // a row of length 0: the sink against the chapter's -1e6 fill
  out.push_back(lens);
  Case causal;
  causal.B = 3, causal.L = 5, causal.H = 4, causal.D = 8, causal.causal = true, causal.lens = {5, 2, 3};
  out.push_back(causal);
  return out;
}

}  // namespace

TEST(ModuleSinks, TheChaptersModuleMatchesThePlainCompositionAndItsSinksGradient) {
  Generator gen(21);
  for (const Case& c : cases()) {
    MultiHeadAttention m(c.D, c.H, 0.0f, /*bias=*/false, 3);
    const Tensor x = random_tensor({c.B, c.L, c.D}, gen, -2.0f, 2.0f);
    m.initialize(c.D, c.D, c.D);
    const StateDict sd = m.state_dict();
    const Tensor W[4] = {sd.at("W_q.weight"), sd.at("W_k.weight"), sd.at("W_v.weight"), sd.at("W_o.weight")};
    const std::vector<float> sinks = draw_sinks(c.H, gen);
    const std::vector<double> sinks_d(sinks.begin(), sinks.end());
    const Tensor want = to_float(reference(c, x, W, sinks_d), {c.B, c.L, c.D});
    const Tensor G = random_tensor({c.B, c.L, c.D}, gen);
    const std::vector<double> want_g = sink_gradient(c, x, W, sinks_d, G);
    CallMasks masks;
    if (c.causal) masks.causal = Causal::TopLeft;
    masks.scores.sinks = sinks;
    const ValidLens lens = c.lens.empty() ? ValidLens() : ValidLens::per_batch(c.lens);
    for (AttentionKernel kernel : kKernels) {
      SCOPED_TRACE(static_cast<int>(kernel));
      m.set_kernel(kernel);
      m.train();
      EXPECT_TRUE(all_close(m.forward(x, x, x, lens, masks), want, 1e-5, 1e-5));
      const MultiHeadAttention::InputGrads g = m.backward(G);
      expect_sink_grads(g.sinks, want_g);
      // Without sinks the gradient is absent, and the output differs.
      CallMasks no_sinks = masks;
      no_sinks.scores.sinks.clear();
      const Tensor without = m.forward(x, x, x, lens, no_sinks);
      EXPECT_TRUE(m.backward(G).sinks.empty());
      EXPECT_FALSE(all_close(without, want, 1e-3, 1e-3)) << "the sinks changed nothing";
    }
  }
}

TEST(ModuleSinks, TheDropInMatchesThePlainCompositionAndItsSinksGradient) {
  Generator gen(22);
  for (Case c : cases()) {
    c.causal = true;  // the drop-in's masks are -inf ones; lengths become a key padding mask
    const int64_t E = c.D;
    StateDict sd;
    sd["in_proj_weight"] = random_tensor({3 * E, E}, gen, -0.5f, 0.5f);
    sd["out_proj.weight"] = random_tensor({E, E}, gen, -0.5f, 0.5f);
    TorchMultiheadAttention t = TorchMultiheadAttention::from_state_dict(sd, c.H, mha::test::batch_first_options());
    Tensor W[4] = {Tensor({E, E}), Tensor({E, E}), Tensor({E, E}), sd.at("out_proj.weight")};
    for (int p = 0; p < 3; ++p)
      std::copy(sd.at("in_proj_weight").data() + p * E * E, sd.at("in_proj_weight").data() + (p + 1) * E * E,
                W[p].data());
    const Tensor x = random_tensor({c.B, c.L, E}, gen, -2.0f, 2.0f);
    const std::vector<float> sinks = draw_sinks(c.H, gen);
    const std::vector<double> sinks_d(sinks.begin(), sinks.end());
    const Tensor want = to_float(reference(c, x, W, sinks_d), {c.B, c.L, E});
    const Tensor G = random_tensor({c.B, c.L, E}, gen);
    const std::vector<double> want_g = sink_gradient(c, x, W, sinks_d, G);
    TorchMhaCall call;
    call.causal = Causal::TopLeft;
    call.need_weights = false;
    call.scores.sinks = sinks;
    if (!c.lens.empty()) {
      std::vector<uint8_t> pad(static_cast<size_t>(c.B * c.L));
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t j = 0; j < c.L; ++j) pad[static_cast<size_t>(b * c.L + j)] = j >= c.lens[static_cast<size_t>(b)];
      call.key_padding_mask = mask_from_torch_mha({c.B, c.L}, pad);
    }
    for (AttentionKernel kernel : kKernels) {
      SCOPED_TRACE(static_cast<int>(kernel));
      t.set_kernel(kernel);
      t.train();
      EXPECT_TRUE(all_close(t.forward(x, x, x, call).output, want, 1e-5, 1e-5));
      expect_sink_grads(t.backward(G).sinks, want_g);
    }
  }
}

TEST(ModuleSinks, CachedDecodingInStepsEqualsTheUncachedCausalCall) {
  Generator gen(23);
  const int64_t B = 2, L = 9, E = 8, H = 4;
  const Tensor x = random_tensor({B, L, E}, gen, -2.0f, 2.0f);
  ScoreOptions scores;
  scores.sinks = {20.0f, -20.0f, 0.5f, -1.5f};
  MultiHeadAttention m(E, H, 0.0f, true, 4);
  m.eval();
  CallMasks causal;
  causal.causal = Causal::BottomRight;
  causal.scores = scores;
  const Tensor want = m.forward(x, x, x, {}, causal);
  StateDict sd;
  sd["in_proj_weight"] = random_tensor({3 * E, E}, gen);
  sd["out_proj.weight"] = random_tensor({E, E}, gen);
  TorchMultiheadAttention t = TorchMultiheadAttention::from_state_dict(sd, H, mha::test::batch_first_options());
  t.eval();
  TorchMhaCall tc;
  tc.causal = Causal::TopLeft;
  tc.need_weights = false;
  tc.scores = scores;
  const Tensor want_t = t.forward(x, x, x, tc).output;
  KVCache cm = m.kv_cache(B, L), ct = t.kv_cache(B, L);
  Tensor got({B, L, E}), got_t({B, L, E});
  const int64_t steps[][2] = {{0, 4}, {4, 5}, {5, 7}, {7, 8}, {8, 9}};
  for (const auto& s : steps) {
    const int64_t n = s[1] - s[0];
    Tensor part({B, n, E});
    for (int64_t b = 0; b < B; ++b)
      std::copy(x.data() + (b * L + s[0]) * E, x.data() + (b * L + s[1]) * E, part.data() + b * n * E);
    const Tensor o = m.forward(part, part, part, ValidLens(), cm, Window{}, scores);
    const Tensor ot = t.forward(part, part, part, ct, Mask(), Window{}, scores);
    for (int64_t b = 0; b < B; ++b) {
      std::copy(o.data() + b * n * E, o.data() + (b + 1) * n * E, got.data() + (b * L + s[0]) * E);
      std::copy(ot.data() + b * n * E, ot.data() + (b + 1) * n * E, got_t.data() + (b * L + s[0]) * E);
    }
  }
  EXPECT_TRUE(all_close(got, want, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(got_t, want_t, 1e-5, 1e-5));
}

TEST(ModuleSinks, BadSinksAreRefusedNamingTheArgument) {
  const Tensor x({2, 3, 8}, 0.5f);
  MultiHeadAttention m(8, 2);
  CallMasks masks;
  masks.scores.sinks = {0.5f};
  EXPECT_TRUE(throws_with([&] { m.forward(x, x, x, {}, masks); },
                          "[MultiHeadAttention.forward] sinks: 1 logits for 2 heads; wanted one per query head"));
  masks.scores.sinks = {0.5f, NAN};
  EXPECT_TRUE(throws_with([&] { m.forward(x, x, x, {}, masks); }, "sinks[1]: nan; wanted a finite logit"));
  m.eval();
  KVCache cache = m.kv_cache(2, 3);
  ScoreOptions bad;
  bad.sinks = {1.0f, 2.0f, 3.0f};
  EXPECT_TRUE(throws_with([&] { m.forward(x, x, x, ValidLens(), cache, Window{}, bad); },
                          "sinks: 3 logits for 2 heads; wanted one per query head"));
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{0, 0}));  // a call that throws leaves the cache
  StateDict sd;
  sd["in_proj_weight"] = Tensor({24, 8}, 0.1f);
  sd["out_proj.weight"] = Tensor({8, 8}, 0.1f);
  TorchMultiheadAttention t = TorchMultiheadAttention::from_state_dict(sd, 2, mha::test::batch_first_options());
  TorchMhaCall call;
  call.scores.sinks = {INFINITY, 0.0f};
  EXPECT_TRUE(throws_with([&] { t.forward(x, x, x, call); }, "sinks[0]: inf; wanted a finite logit"));
}
