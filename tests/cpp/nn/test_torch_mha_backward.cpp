// TorchMultiheadAttention::backward: central finite differences of the
// module itself (every option at once, dropout held fixed by reseeding),
// the two layouts agreeing, gradients accumulating and zeroing, parameters()
// covering the state dict for the optimisers, no NaN on fully masked rows,
// and errors. Parity with PyTorch's autograd is in
// tests/python/test_torch_mha_backward.py (it needs torch).
#include <cmath>
#include <string>

#include "mha/error.h"
#include "mha/masks.h"
#include "mha/optim.h"
#include "mha/torch_mha.h"
#include "test_util.h"

using namespace mha;
using mha::test::all_close;
using mha::test::random_tensor;
using mha::test::throws_with;

namespace {

StateDict random_state(Generator& gen, int64_t E, int64_t Ekv, int64_t kdim, int64_t vdim,
                       bool bias, bool bias_kv) {
  StateDict s;
  if (kdim == E && vdim == E && Ekv == E) {
    s["in_proj_weight"] = random_tensor({3 * E, E}, gen, -0.5f, 0.5f);
  } else {
    s["q_proj_weight"] = random_tensor({E, E}, gen, -0.5f, 0.5f);
    s["k_proj_weight"] = random_tensor({Ekv, kdim}, gen, -0.5f, 0.5f);
    s["v_proj_weight"] = random_tensor({Ekv, vdim}, gen, -0.5f, 0.5f);
  }
  s["out_proj.weight"] = random_tensor({E, E}, gen, -0.5f, 0.5f);
  if (bias) {
    s["in_proj_bias"] = random_tensor({E + 2 * Ekv}, gen);
    s["out_proj.bias"] = random_tensor({E}, gen);
  }
  if (bias_kv) {
    s["bias_k"] = random_tensor({1, 1, Ekv}, gen);
    s["bias_v"] = random_tensor({1, 1, Ekv}, gen);
  }
  return s;
}

// (B, L, W) <-> (L, B, W)
Tensor swap01(const Tensor& t) {
  Tensor out({t.size(1), t.size(0), t.size(2)});
  for (int64_t a = 0; a < t.size(0); ++a)
    for (int64_t b = 0; b < t.size(1); ++b)
      for (int64_t c = 0; c < t.size(2); ++c) out.at({b, a, c}) = t.at({a, b, c});
  return out;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.data()[i]) * b.data()[i];
  return s;
}

bool finite(const Tensor& t) {
  for (float x : t.values())
    if (!std::isfinite(x)) return false;
  return true;
}

struct FdSetup {
  StateDict state;
  TorchMhaOptions options = test::batch_first_options();
  int64_t H;
  Tensor q, k, v, grad_out;
  TorchMhaCall call;
};

// sum(output * grad_out) of a fresh module (training mode, dropout key fixed).
double loss(const FdSetup& s, const StateDict& state, const Tensor& q, const Tensor& k, const Tensor& v) {
  auto m = TorchMultiheadAttention::from_state_dict(state, s.H, s.options);
  m.seed(99);
  return dot(m.forward(q, k, v, s.call).output, s.grad_out);
}

}  // namespace

TEST(TorchMhaBackward, ModuleGradientsMatchFiniteDifferencesWithEveryOption) {
  // Sequence-first, grouped heads (4 of 2 kv), kdim/vdim, biases, bias_k/v,
  // add_zero_attn, a boolean padding mask with a fully padded batch row, an
  // additive per-head attn_mask, bottom-right causal, dropout. float32
  // differences with step 1e-2: the bound is 2e-3 of the gradient's scale.
  Generator gen(31);
  const int64_t E = 8, H = 4, Hkv = 2, d = E / H, B = 2, L = 3, S = 5;
  FdSetup s;
  s.H = H;
  s.state = random_state(gen, E, Hkv * d, 6, 7, true, true);
  s.options.batch_first = false;
  s.options.add_zero_attn = true;
  s.options.num_kv_heads = Hkv;
  s.options.dropout = 0.25f;
  s.q = random_tensor({L, B, E}, gen);
  s.k = random_tensor({S, B, 6}, gen);
  s.v = random_tensor({S, B, 7}, gen);
  s.grad_out = random_tensor({L, B, E}, gen);
  s.call.key_padding_mask = mask_from_torch_mha({B, S}, {0, 1, 0, 0, 1, 1, 1, 1, 1, 1});
  Tensor bias = random_tensor({B * H, L, S}, gen);
  bias.data()[7] = -INFINITY;
  s.call.attn_mask = Mask::additive(bias);
  s.call.causal = Causal::BottomRight;
  for (FullyMaskedRows policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros}) {
    s.options.fully_masked_rows = policy;
    auto m = TorchMultiheadAttention::from_state_dict(s.state, H, s.options);
    m.seed(99);
    m.forward(s.q, s.k, s.v, s.call);
    const auto g = m.backward(s.grad_out);
    const StateDict pg = m.grads();
    ASSERT_EQ(pg.size(), s.state.size());
    const float h = 1e-2f;
    auto check = [&](const Tensor& got, auto&& perturbed_loss, const std::string& what) {
      double scale = 0.0;
      for (float x : got.values()) scale = std::max(scale, static_cast<double>(std::fabs(x)));
      ASSERT_TRUE(finite(got)) << what;
      for (int64_t e = 0; e < got.numel(); ++e) {
        const double fd = (perturbed_loss(e, h) - perturbed_loss(e, -h)) / (2.0 * h);
        EXPECT_NEAR(got.data()[e], fd, 2e-3 * scale + 1e-5) << what << "[" << e << "]";
      }
    };
    const Tensor* grads[] = {&g.query, &g.key, &g.value};
    for (int t = 0; t < 3; ++t)
      check(*grads[t], [&](int64_t e, float step) {
        Tensor x[] = {s.q, s.k, s.v};
        x[t].data()[e] += step;
        return loss(s, s.state, x[0], x[1], x[2]);
      }, "input " + std::to_string(t));
    for (const auto& [name, value] : s.state) {
      ASSERT_EQ(pg.at(name).shape(), value.shape()) << name;
      const std::string n = name;
      check(pg.at(name), [&](int64_t e, float step) {
        StateDict st = s.state;
        st.at(n).data()[e] += step;
        return loss(s, st, s.q, s.k, s.v);
      }, name);
    }
  }
}

TEST(TorchMhaBackward, LayoutsGiveTheSameGradients) {
  Generator gen(32);
  const StateDict state = random_state(gen, 12, 12, 12, 12, true, true);
  TorchMhaOptions bf = test::batch_first_options(), sf = test::batch_first_options();
  sf.batch_first = false;
  bf.add_zero_attn = sf.add_zero_attn = true;
  auto a = TorchMultiheadAttention::from_state_dict(state, 3, bf);
  auto b = TorchMultiheadAttention::from_state_dict(state, 3, sf);
  const int64_t B = 3, L = 4, S = 6;
  const Tensor q = random_tensor({B, L, 12}, gen), k = random_tensor({B, S, 12}, gen),
               v = random_tensor({B, S, 12}, gen), go = random_tensor({B, L, 12}, gen);
  const Mask kpm = mask_from_torch_mha({B, S}, {0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1});
  a(q, k, v, kpm, false, {}, true, true);
  b(swap01(q), swap01(k), swap01(v), kpm, false, {}, true, true);
  const auto ga = a.backward(go);
  const auto gb = b.backward(swap01(go));
  EXPECT_TRUE(all_close(swap01(gb.query), ga.query, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(swap01(gb.key), ga.key, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(swap01(gb.value), ga.value, 1e-5, 1e-6));
  const StateDict pa = a.grads(), pb = b.grads();
  for (const auto& [name, t] : pa) EXPECT_TRUE(all_close(pb.at(name), t, 1e-5, 1e-6)) << name;
}

TEST(TorchMhaBackward, GradientsAccumulateUntilZeroGrad) {
  Generator gen(33);
  auto m = TorchMultiheadAttention::from_state_dict(random_state(gen, 8, 8, 5, 8, true, true), 2, test::batch_first_options());
  for (const auto& [name, g] : m.grads())
    for (float x : g.values()) EXPECT_EQ(x, 0.0f) << name;  // zeros before any backward
  const Tensor x = random_tensor({2, 3, 8}, gen), y = random_tensor({2, 4, 5}, gen),
               z = random_tensor({2, 4, 8}, gen), go = random_tensor({2, 3, 8}, gen);
  m(x, y, z);
  const auto first = m.backward(go);
  const StateDict once = m.grads();
  m(x, y, z);
  const auto second = m.backward(go);
  EXPECT_TRUE(first.query == second.query && first.key == second.key && first.value == second.value);
  for (const auto& [name, g] : m.grads()) {
    Tensor twice = once.at(name);
    for (float& v : twice.values()) v *= 2.0f;
    EXPECT_TRUE(all_close(g, twice, 1e-6, 1e-7)) << name;
  }
  m.zero_grad();
  for (const auto& [name, g] : m.grads())
    for (float v : g.values()) EXPECT_EQ(v, 0.0f) << name;
}

TEST(TorchMhaBackward, ParametersCoverTheStateDictForTheOptimisers) {
  // One SGD step must move every state-dict entry by -lr * its gradient,
  // packed in_proj_weight and in_proj_bias included.
  Generator gen(34);
  for (bool packed : {true, false}) {
    const StateDict state = random_state(gen, 8, 8, 8, packed ? 8 : 6, true, true);
    auto m = TorchMultiheadAttention::from_state_dict(state, 2, test::batch_first_options());
    int64_t covered = 0, total = 0;
    for (const ParamRef& p : m.parameters()) covered += p.value->numel();
    for (const auto& [name, t] : state) total += t.numel();
    EXPECT_EQ(covered, total);
    const Tensor x = random_tensor({2, 3, 8}, gen), k = random_tensor({2, 4, 8}, gen),
                 v = random_tensor({2, 4, packed ? 8 : 6}, gen);
    m(x, k, v);
    m.backward(random_tensor({2, 3, 8}, gen));
    const StateDict g = m.grads();
    optim::SGD sgd(m.parameters(), {.lr = 0.5});
    sgd.step();
    const StateDict after = m.state_dict();
    for (const auto& [name, t] : state) {
      Tensor want = t;
      for (int64_t i = 0; i < t.numel(); ++i) want.data()[i] -= 0.5f * g.at(name).data()[i];
      EXPECT_TRUE(all_close(after.at(name), want, 1e-6, 1e-7)) << name;
    }
  }
}

TEST(TorchMhaBackward, FullyMaskedRowsGiveFiniteGradientsAndZerosPassNoneToKeys) {
  Generator gen(35);
  const StateDict state = random_state(gen, 8, 8, 8, 8, true, false);
  const int64_t B = 2, L = 3, S = 4;
  // Batch row 1 has every key padded.
  const Mask kpm = mask_from_torch_mha({B, S}, {0, 1, 0, 0, 1, 1, 1, 1});
  const Tensor q = random_tensor({B, L, 8}, gen), k = random_tensor({B, S, 8}, gen),
               v = random_tensor({B, S, 8}, gen), go = random_tensor({B, L, 8}, gen);
  for (FullyMaskedRows policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros})
    for (float dropout : {0.0f, 0.5f})
      for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Blas, AttentionKernel::Fused})
        for (bool need_weights : {false, true}) {
          TorchMhaOptions o = test::batch_first_options();
          o.fully_masked_rows = policy;
          o.dropout = dropout;
          auto m = TorchMultiheadAttention::from_state_dict(state, 2, o);
          m.set_kernel(kernel);
          m(q, k, v, kpm, need_weights);
          const auto g = m.backward(go);
          ASSERT_TRUE(finite(g.query) && finite(g.key) && finite(g.value));
          for (const auto& [name, t] : m.grads()) ASSERT_TRUE(finite(t)) << name;
          // Batch row 1's queries see no key: no gradient reaches them or its keys.
          for (int64_t x = 0; x < L * 8; ++x) EXPECT_EQ(g.query.data()[L * 8 + x], 0.0f);
          for (int64_t x = 0; x < S * 8; ++x) EXPECT_EQ(g.key.data()[S * 8 + x], 0.0f);
          double row1_values = 0.0;
          for (int64_t x = 0; x < S * 8; ++x) row1_values += std::fabs(g.value.data()[S * 8 + x]);
          if (policy == FullyMaskedRows::Zeros) EXPECT_EQ(row1_values, 0.0);
          else EXPECT_GT(row1_values, 0.0);
        }
}

TEST(TorchMhaBackward, LastDropoutMaskIsTheForwardsMask) {
  Generator gen(36);
  TorchMhaOptions o = test::batch_first_options();
  o.dropout = 0.5f;
  o.add_zero_attn = true;
  auto m = TorchMultiheadAttention::from_state_dict(random_state(gen, 8, 8, 8, 8, false, false), 2, o);
  const Tensor x = random_tensor({2, 5, 8}, gen);
  const auto r = m(x, x, x, {}, true, {}, false);
  const Tensor mask = m.last_dropout_mask();
  ASSERT_EQ(mask.shape(), (Shape{2, 2, 5, 6}));
  for (float v : mask.values()) EXPECT_TRUE(v == 0.0f || v == 2.0f);
  // The weights returned are after dropout: zero exactly where the mask is.
  for (int64_t i = 0; i < mask.numel(); ++i) EXPECT_EQ(r.weights->data()[i] == 0.0f, mask.data()[i] == 0.0f);
}

TEST(TorchMhaBackward, RefusesWithoutATrainingForwardAndOnBadShapes) {
  Generator gen(37);
  auto m = TorchMultiheadAttention::from_state_dict(random_state(gen, 8, 8, 8, 8, true, false), 2, test::batch_first_options());
  const Tensor x = random_tensor({2, 3, 8}, gen);
  EXPECT_TRUE(throws_with([&] { m.backward(x); }, "TorchMultiheadAttention.backward"));
  EXPECT_TRUE(throws_with([&] { m.backward(x); }, "no training-mode forward"));
  EXPECT_TRUE(throws_with([&] { m.last_dropout_mask(); }, "no training-mode forward"));
  m(x, x, x);
  EXPECT_TRUE(throws_with([&] { m.backward(Tensor({2, 3, 7})); },
                          "grad_output: shape (2, 3, 7) is not the output's (2, 3, 8)"));
  m.eval();
  m(x, x, x);  // an eval-mode call keeps nothing
  EXPECT_TRUE(throws_with([&] { m.backward(x); }, "no training-mode forward"));
}
