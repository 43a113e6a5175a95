// Masks as values, and TorchMultiheadAttention's own rules: loading, layouts,
// weights, grouped heads, fully masked rows, errors. Parity with PyTorch
// itself is in tests/python/test_torch_mha.py (it needs torch).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "mha/error.h"
#include "mha/masks.h"
#include "mha/safetensors.h"
#include "mha/torch_mha.h"
#include "test_util.h"

using namespace mha;
using mha::test::all_close;
using mha::test::random_tensor;
using mha::test::throws_with;

TEST(Masks, ConventionsConvertBothWays) {
  // nn.MultiheadAttention: True = masked out; SDPA and mha: True = takes part.
  const Mask m = mask_from_torch_mha({2, 2}, {1, 0, 0, 7});
  ASSERT_TRUE(m.is_keep());
  EXPECT_EQ(m.keep_values(), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(mask_to_torch_mha(m), (std::vector<uint8_t>{1, 0, 0, 1}));
  const Mask s = mask_from_sdpa({2, 2}, {1, 0, 0, 7});
  EXPECT_EQ(s.keep_values(), (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(mask_to_sdpa(s), (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(mask_to_sdpa(mask_from_torch_mha({3}, {1, 0, 1})),
            (std::vector<uint8_t>{0, 1, 0}));
}

TEST(Masks, AdditiveRefusesNaNAndPlusInfinity) {
  EXPECT_TRUE(Mask::additive(Tensor({2}, std::vector<float>{0.0f, -INFINITY})).is_additive());
  EXPECT_TRUE(throws_with([] { Mask::additive(Tensor({2}, std::vector<float>{0.0f, NAN})); },
                          "element 1 of shape (2,) is"));
  EXPECT_TRUE(throws_with([] { Mask::additive(Tensor({1}, std::vector<float>{INFINITY})); },
                          "finite values or -inf"));
  EXPECT_TRUE(throws_with([] { Mask::keep({2, 3}, {1, 0}); }, "2 values given for shape (2, 3)"));
}

namespace {

// A PyTorch-shaped state dict with random values (biases included).
StateDict random_state(Generator& gen, int64_t E, int64_t Ekv, int64_t kdim, int64_t vdim,
                       bool bias, bool bias_kv) {
  StateDict s;
  if (kdim == E && vdim == E) {
    s["in_proj_weight"] = random_tensor({E + 2 * Ekv, E}, gen, -0.5f, 0.5f);
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

// (B, L, W) -> (L, B, W)
Tensor swap01(const Tensor& t) {
  Tensor out({t.size(1), t.size(0), t.size(2)});
  for (int64_t a = 0; a < t.size(0); ++a)
    for (int64_t b = 0; b < t.size(1); ++b)
      for (int64_t c = 0; c < t.size(2); ++c) out.at({b, a, c}) = t.at({a, b, c});
  return out;
}

bool finite(const Tensor& t) {
  for (float x : t.values())
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

TEST(TorchMha, StateDictRoundTripsInBothLayouts) {
  Generator gen(1);
  for (int64_t kdim : {int64_t{8}, int64_t{5}}) {
    const StateDict s = random_state(gen, 8, 8, kdim, 8 + 3 * (kdim != 8), true, true);
    auto m = TorchMultiheadAttention::from_state_dict(s, 2, test::batch_first_options());
    const StateDict back = m.state_dict();
    ASSERT_EQ(back.size(), s.size());
    for (const auto& [name, t] : s) EXPECT_TRUE(back.at(name) == t) << name;
    EXPECT_TRUE(m.has_bias() && m.has_bias_kv());
    EXPECT_EQ(m.kdim(), kdim);
  }
}

TEST(TorchMha, SafetensorsFileGivesTheSameModule) {
  Generator gen(2);
  const StateDict s = random_state(gen, 6, 6, 6, 6, true, false);
  const std::string path = ::testing::TempDir() + "torch_mha_test.safetensors";
  save_safetensors(path, s);
  auto from_file = TorchMultiheadAttention::from_safetensors(path, 3, test::batch_first_options());
  auto from_dict = TorchMultiheadAttention::from_state_dict(s, 3, test::batch_first_options());
  std::remove(path.c_str());
  const Tensor x = random_tensor({2, 4, 6}, gen);
  EXPECT_TRUE(from_file(x, x, x).output == from_dict(x, x, x).output);
}

TEST(TorchMha, LayoutsAndUnbatchedInputsAgree) {
  Generator gen(3);
  const StateDict s = random_state(gen, 12, 12, 5, 7, true, true);
  TorchMhaOptions bf = test::batch_first_options(), sf = test::batch_first_options();
  sf.batch_first = false;
  bf.add_zero_attn = sf.add_zero_attn = true;
  auto a = TorchMultiheadAttention::from_state_dict(s, 3, bf);
  auto b = TorchMultiheadAttention::from_state_dict(s, 3, sf);
  const int64_t B = 3, L = 4, S = 6;
  const Tensor q = random_tensor({B, L, 12}, gen), k = random_tensor({B, S, 5}, gen),
               v = random_tensor({B, S, 7}, gen);
  const Mask kpm = mask_from_torch_mha({B, S}, {0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1});
  auto ra = a(q, k, v, kpm, true, {}, false, true);
  auto rb = b(swap01(q), swap01(k), swap01(v), kpm, true, {}, false, true);
  EXPECT_TRUE(all_close(swap01(rb.output), ra.output, 1e-6, 1e-7));
  ASSERT_TRUE(ra.weights && rb.weights);
  EXPECT_EQ(ra.weights->shape(), (Shape{B, 3, L, S + 2}));  // bias_k and the zero key
  EXPECT_TRUE(all_close(*rb.weights, *ra.weights, 1e-6, 1e-7));
  // Batch row 1 alone, unbatched: (L, E) in, (L, E) out, weights (h, L, S').
  Tensor q1({L, 12}), k1({S, 5}), v1({S, 7});
  for (int64_t i = 0; i < L * 12; ++i) q1.data()[i] = q.data()[L * 12 + i];
  for (int64_t i = 0; i < S * 5; ++i) k1.data()[i] = k.data()[S * 5 + i];
  for (int64_t i = 0; i < S * 7; ++i) v1.data()[i] = v.data()[S * 7 + i];
  const Mask kpm1 = mask_from_torch_mha({S}, {1, 0, 0, 0, 0, 0});
  auto r1 = a(q1, k1, v1, kpm1, true, {}, false, true);
  EXPECT_EQ(r1.output.shape(), (Shape{L, 12}));
  EXPECT_EQ(r1.weights->shape(), (Shape{3, L, S + 2}));
  for (int64_t i = 0; i < L * 12; ++i)
    EXPECT_NEAR(r1.output.data()[i], ra.output.data()[L * 12 + i], 1e-6) << i;
}

TEST(TorchMha, AveragedWeightsAreTheMeanOverHeadsAndNeedWeightsFalseGivesNone) {
  Generator gen(4);
  auto m = TorchMultiheadAttention::from_state_dict(random_state(gen, 8, 8, 8, 8, false, false), 4, test::batch_first_options());
  const Tensor x = random_tensor({2, 3, 8}, gen), y = random_tensor({2, 5, 8}, gen);
  auto per_head = m(x, y, y, {}, true, {}, false);
  auto averaged = m(x, y, y, {}, true, {}, true);
  auto none = m(x, y, y, {}, false);
  EXPECT_FALSE(none.weights.has_value());
  EXPECT_TRUE(all_close(none.output, per_head.output, 0, 0));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        double sum = 0;
        for (int64_t h = 0; h < 4; ++h) sum += per_head.weights->at({b, h, i, j});
        EXPECT_NEAR(averaged.weights->at({b, i, j}), sum / 4, 1e-7);
      }
}

TEST(TorchMha, GroupedHeadsEqualFullHeadsWithRepeatedKvWeights) {
  // num_kv_heads = 2 of 6 heads: query head h reads kv head h / 3, which is
  // what a plain 6-head module computes when kv head g's weight rows are
  // repeated for heads 3g .. 3g+2.
  Generator gen(5);
  const int64_t E = 12, H = 6, Hkv = 2, d = 2, Ekv = Hkv * d;
  const StateDict g = random_state(gen, E, Ekv, 5, 3, true, true);
  StateDict full = g;
  auto repeat_rows = [&](const Tensor& w) {  // (Ekv, ...) -> (E, ...)
    const int64_t cols = w.dim() == 2 ? w.size(1) : 1;
    Shape shape = w.shape();
    shape[w.dim() == 3 ? 2 : 0] = E;
    Tensor out(shape);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < d; ++r)
        for (int64_t c = 0; c < cols; ++c)
          out.data()[(h * d + r) * cols + c] = w.data()[((h / (H / Hkv)) * d + r) * cols + c];
    return out;
  };
  full["k_proj_weight"] = repeat_rows(g.at("k_proj_weight"));
  full["v_proj_weight"] = repeat_rows(g.at("v_proj_weight"));
  full["bias_k"] = repeat_rows(g.at("bias_k"));
  full["bias_v"] = repeat_rows(g.at("bias_v"));
  const Tensor& b = g.at("in_proj_bias");
  Tensor bk({Ekv}), bv({Ekv});
  for (int64_t i = 0; i < Ekv; ++i) {
    bk.data()[i] = b.data()[E + i];
    bv.data()[i] = b.data()[E + Ekv + i];
  }
  const Tensor bk_full = repeat_rows(bk), bv_full = repeat_rows(bv);
  Tensor b_full({3 * E});
  for (int64_t i = 0; i < E; ++i) {
    b_full.data()[i] = b.data()[i];
    b_full.data()[E + i] = bk_full.data()[i];
    b_full.data()[2 * E + i] = bv_full.data()[i];
  }
  full["in_proj_bias"] = b_full;
  TorchMhaOptions o = test::batch_first_options();
  o.num_kv_heads = Hkv;
  auto grouped = TorchMultiheadAttention::from_state_dict(g, H, o);
  auto plain = TorchMultiheadAttention::from_state_dict(full, H, test::batch_first_options());
  EXPECT_EQ(grouped.num_kv_heads(), Hkv);
  const Tensor q = random_tensor({2, 4, E}, gen), k = random_tensor({2, 7, 5}, gen),
               v = random_tensor({2, 7, 3}, gen);
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Blas, AttentionKernel::Fused}) {
    grouped.set_kernel(kernel);
    auto rg = grouped(q, k, v, {}, true, {}, false, true);
    auto rp = plain(q, k, v, {}, true, {}, false, true);
    EXPECT_TRUE(all_close(rg.output, rp.output, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(*rg.weights, *rp.weights, 1e-5, 1e-6));
  }
}

TEST(TorchMha, FullyMaskedRowsFollowThePolicyWithDropoutToo) {
  Generator gen(6);
  const StateDict s = random_state(gen, 8, 8, 8, 8, true, false);
  const int64_t B = 2, L = 3, S = 4;
  // Batch row 1 has every key padded; row 0 none.
  const Mask kpm = mask_from_torch_mha({B, S}, {0, 0, 0, 0, 1, 1, 1, 1});
  const Tensor q = random_tensor({B, L, 8}, gen), k = random_tensor({B, S, 8}, gen);
  for (FullyMaskedRows policy : {FullyMaskedRows::Uniform, FullyMaskedRows::Zeros}) {
    for (float dropout : {0.0f, 0.5f}) {
      TorchMhaOptions o = test::batch_first_options();
      o.fully_masked_rows = policy;
      o.dropout = dropout;
      auto m = TorchMultiheadAttention::from_state_dict(s, 2, o);  // training mode
      auto r = m(q, k, k, kpm, true, {}, false);
      ASSERT_TRUE(finite(r.output) && finite(*r.weights));
      if (dropout > 0) continue;  // the weights are after dropout then
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < S; ++j)
            EXPECT_EQ(r.weights->at({1, h, i, j}), policy == FullyMaskedRows::Uniform ? 0.25f : 0.0f);
      if (policy == FullyMaskedRows::Zeros) {  // attention output 0: out_proj's bias is left
        for (int64_t i = 0; i < L; ++i)
          for (int64_t c = 0; c < 8; ++c)
            EXPECT_FLOAT_EQ(r.output.at({1, i, c}), s.at("out_proj.bias").data()[c]);
      }
    }
  }
}

TEST(TorchMha, DropoutActsInTrainingOnlyAndTheWeightsShowIt) {
  Generator gen(7);
  TorchMhaOptions o = test::batch_first_options();
  o.dropout = 0.5f;
  auto m = TorchMultiheadAttention::from_state_dict(random_state(gen, 8, 8, 8, 8, true, false), 2, o);
  const Tensor x = random_tensor({4, 16, 8}, gen);
  auto train = m(x, x, x, {}, true, {}, false);
  int64_t zeros = 0;
  for (float w : train.weights->values()) zeros += w == 0.0f;
  const double frac = static_cast<double>(zeros) / train.weights->numel();
  EXPECT_NEAR(frac, 0.5, 0.055);  // 2048 weights: 0.055 is 5 standard deviations
  m.eval();
  auto a = m(x, x, x), b = m(x, x, x);
  EXPECT_TRUE(a.output == b.output);
  for (float w : a.weights->values()) EXPECT_GT(w, 0.0f);
}

TEST(TorchMha, BadStateDictsAndCallsAreRefusedByName) {
  Generator gen(8);
  const StateDict good = random_state(gen, 8, 8, 8, 8, true, true);
  auto load = [&](StateDict s, int64_t heads = 2, TorchMhaOptions o = test::batch_first_options()) {
    return [s, heads, o] { TorchMultiheadAttention::from_state_dict(s, heads, o); };
  };
  StateDict s = good;
  s["extra"] = Tensor({1});
  EXPECT_TRUE(throws_with(load(s), "unexpected parameter 'extra'"));
  s = good;
  s.erase("out_proj.bias");
  EXPECT_TRUE(throws_with(load(s), "missing parameter 'out_proj.bias'"));
  s = good;
  s.erase("bias_v");
  EXPECT_TRUE(throws_with(load(s), "missing parameter 'bias_v'"));
  s = good;
  s["in_proj_weight"] = Tensor({23, 8});
  EXPECT_TRUE(throws_with(load(s), "in_proj_weight: shape (23, 8) is not (24, 8)"));
  EXPECT_TRUE(throws_with(load(good, 3), "num_heads: 3 does not divide embed_dim 8"));
  TorchMhaOptions o = test::batch_first_options();
  o.num_kv_heads = 3;
  EXPECT_TRUE(throws_with(load(good, 4, o), "num_kv_heads: 3 does not divide num_heads 4"));
  o = {};
  o.kdim = 5;
  EXPECT_TRUE(throws_with(load(good, 2, o), "kdim: 5 differs from the state dict's key width 8"));

  auto m = TorchMultiheadAttention::from_state_dict(good, 2, test::batch_first_options());
  const Tensor x = random_tensor({2, 3, 8}, gen), y = random_tensor({2, 5, 8}, gen);
  EXPECT_TRUE(throws_with([&] { m(x, Tensor({2, 5, 7}), y); }, "key: shape (2, 5, 7) has width 7; wanted kdim 8"));
  EXPECT_TRUE(throws_with([&] { m(x, y, Tensor({2, 4, 8})); }, "has 4 positions but key (2, 5, 8) has 5"));
  EXPECT_TRUE(throws_with([&] { m(x, Tensor({3, 5, 8}), Tensor({3, 5, 8})); }, "batch size 2"));
  EXPECT_TRUE(throws_with([&] { m(x, y, y, mask_from_torch_mha({2, 4}, std::vector<uint8_t>(8))); },
                          "key_padding_mask: shape (2, 4) is not (2, 5)"));
  EXPECT_TRUE(throws_with([&] { m(x, y, y, {}, true, mask_from_torch_mha({3, 3}, std::vector<uint8_t>(9))); },
                          "attn_mask: shape (3, 3) is not (3, 5)"));
  EXPECT_TRUE(throws_with([&] { m(x, y, y, {}, true, Mask::additive(Tensor({2, 3, 5}))); },
                          "attn_mask: shape (2, 3, 5) is not (4, 3, 5)"));
  EXPECT_TRUE(throws_with([&] { m(Tensor({8}), y, y); }, "query: shape (8,) is neither"));
}

namespace {

// Output and input gradients of one training-mode call (dropout 0) on `kernel`.
struct KernelRun {
  Tensor out;
  TorchMultiheadAttention::InputGrads grads;
};
KernelRun run_on(AttentionKernel kernel, const StateDict& s, int64_t H, const Tensor& x,
                 const Tensor& v, const Mask& kpm, bool causal, const Tensor& grad_out,
                 FullyMaskedRows policy = FullyMaskedRows::Zeros) {
  auto m = TorchMultiheadAttention::from_state_dict(s, H, test::batch_first_options());
  m.set_kernel(kernel);
  m.set_fully_masked_rows(policy);
  m.train();
  KernelRun r;
  r.out = m(x, x, v, kpm, /*need_weights=*/false, {}, true, causal).output;
  r.grads = m.backward(grad_out);
  return r;
}

}  // namespace

// The fused kernel in the drop-in: keys past a row's last kept key skipped
// with their projections, causal tiles skipped, statistics kept for its own
// backward; outputs and gradients as the BLAS path's (1e-5 of the largest
// magnitude + 1e-6) under both policies for fully masked rows (batch row 3
// has no kept key; row 1 has a hole), and a NaN value row past a row's last
// kept key still reaches that row's outputs (0 x NaN, as PyTorch).
TEST(TorchMha, FusedKernelMatchesBlasWithPaddingAndCausalMasks) {
  Generator gen(811);
  const int64_t B = 4, L = 67, E = 24, H = 4;
  const StateDict s = random_state(gen, E, E, E, E, /*bias=*/true, /*bias_kv=*/false);
  const Tensor x = random_tensor({B, L, E}, gen);
  const Tensor grad_out = random_tensor({B, L, E}, gen);
  std::vector<uint8_t> masked(static_cast<size_t>(B * L), 0);
  const int64_t kept[B] = {L, 40, 1, 0};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = kept[b]; j < L; ++j) masked[static_cast<size_t>(b * L + j)] = 1;
  masked[static_cast<size_t>(1 * L + 10)] = 1;
  const Mask kpm = mask_from_torch_mha({B, L}, masked);
  for (FullyMaskedRows policy : {FullyMaskedRows::Zeros, FullyMaskedRows::Uniform})
  for (bool causal : {false, true}) {
    SCOPED_TRACE(std::string(causal ? "causal" : "no causal mask") +
                 (policy == FullyMaskedRows::Zeros ? ", zeros" : ", uniform"));
    const KernelRun blas = run_on(AttentionKernel::Blas, s, H, x, x, kpm, causal, grad_out, policy);
    const KernelRun fused = run_on(AttentionKernel::Fused, s, H, x, x, kpm, causal, grad_out, policy);
    auto close = [](const Tensor& got, const Tensor& want, const char* what) {
      float scale = 0.0f;
      for (float w : want.values()) scale = std::max(scale, std::fabs(w));
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_NEAR(got.data()[i], want.data()[i], 1e-5f * scale + 1e-6f) << what << " at " << i;
    };
    close(fused.out, blas.out, "output");
    close(fused.grads.query, blas.grads.query, "grad query");
    close(fused.grads.key, blas.grads.key, "grad key");
    close(fused.grads.value, blas.grads.value, "grad value");
  }
  // A NaN in row 1's value input past its last kept key (position 50).
  Tensor v = x;
  v.at({1, 50, 3}) = NAN;
  const KernelRun blas = run_on(AttentionKernel::Blas, s, H, x, v, kpm, false, grad_out);
  const KernelRun fused = run_on(AttentionKernel::Fused, s, H, x, v, kpm, false, grad_out);
  for (int64_t i = 0; i < blas.out.numel(); ++i)
    ASSERT_EQ(std::isnan(fused.out.data()[i]), std::isnan(blas.out.data()[i])) << "NaN pattern at " << i;
  bool row1_nan = false;
  for (int64_t i = L * E; i < 2 * L * E; ++i) row1_nan |= std::isnan(fused.out.data()[i]);
  EXPECT_TRUE(row1_nan) << "0 x NaN reaches the outputs of the row that holds it";
}
