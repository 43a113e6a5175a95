// tests/cpp/nn/test_layer_ref.cpp: calls on weights passed with the call
// (src/nn/layer_ref.h, src/nn/module_calls.h), as mha.torch makes them.
//
// Held here: the drop-in's forward run as a function of layers that point
// into a state dict gives the module's output, weights and gradients bit for
// bit (the module runs the same function on its own layers); the WeightPacks
// cache packs a weight once per version, packs again for a new version, and
// never keeps version 0 (a call's own weights); and a changed weight under a
// new version changes the result.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "cpu/gemm/packed_weight.h"
#include "mha/torch_mha.h"
#include "nn/attention_engine.h"
#include "nn/layer_ref.h"
#include "nn/module_calls.h"
#include "test_util.h"

namespace mha {
namespace {

using test::random_tensor;

bool same_bits(const Tensor& x, const Tensor& y) {
  return x.shape() == y.shape() && std::memcmp(x.data(), y.data(), sizeof(float) * static_cast<size_t>(x.numel())) == 0;
}

struct Drop {
  StateDict state;
  int64_t E = 12, H = 3;
};

Drop make_state(Generator& gen) {
  Drop d;
  d.state["in_proj_weight"] = random_tensor({3 * d.E, d.E}, gen, -0.5f, 0.5f);
  d.state["in_proj_bias"] = random_tensor({3 * d.E}, gen);
  d.state["out_proj.weight"] = random_tensor({d.E, d.E}, gen, -0.5f, 0.5f);
  d.state["out_proj.bias"] = random_tensor({d.E}, gen);
  return d;
}

// Layers pointing into the state dict's tensors (row blocks of in_proj).
nn::EngineLayers layers_of(const Drop& d, nn::WeightPacks* packs, uint64_t version) {
  const int64_t E = d.E;
  const float* w = d.state.at("in_proj_weight").data();
  const float* b = d.state.at("in_proj_bias").data();
  nn::EngineLayers l;
  l.q = nn::LayerRef(w, b, E, E, packs, 0, version);
  l.k = nn::LayerRef(w + E * E, b + E, E, E, packs, 1, version);
  l.v = nn::LayerRef(w + 2 * E * E, b + 2 * E, E, E, packs, 2, version);
  l.o = nn::LayerRef(d.state.at("out_proj.weight").data(), d.state.at("out_proj.bias").data(), E, E, packs, 3,
                     version);
  return l;
}

TEST(LayerRef, DropInOnPassedWeightsIsTheModuleBitForBit) {
  Generator gen(11);
  const Drop d = make_state(gen);
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(d.state, d.H, test::batch_first_options());
  m.train();
  const Tensor q = random_tensor({2, 5, d.E}, gen), kv = random_tensor({2, 7, d.E}, gen);
  TorchMhaCall call;
  call.need_weights = true;
  call.causal = Causal::TopLeft;
  const TorchMhaResult want = m.forward(q, kv, kv, call);
  nn::WeightPacks packs;
  nn::CallSettings s;
  s.keep_for_backward = true;
  const nn::TorchMhaShape shape{d.E, d.H, d.H, d.E / d.H, true, FullyMaskedRows::Zeros};
  nn::TorchMhaForward got = nn::torch_mha_forward("test", shape, layers_of(d, &packs, 7), q, kv, kv, call, s);
  EXPECT_TRUE(same_bits(got.result.output, want.output));
  EXPECT_TRUE(same_bits(*got.result.weights, *want.weights));
  // The backward on the passed layers gives the module's gradients.
  const Tensor g = random_tensor(want.output.shape(), gen);
  const auto module_grads = m.backward(g);
  Tensor dw[4], db[4];
  nn::EngineGrads grads;
  nn::LinearGrads* lg[] = {&grads.q, &grads.k, &grads.v, &grads.o};
  for (int i = 0; i < 4; ++i) {
    dw[i] = Tensor({d.E, d.E});
    db[i] = Tensor({d.E});
    lg[i]->weight = &dw[i];
    lg[i]->bias = &db[i];
  }
  const nn::EngineInputGrads in = nn::attention_backward(*got.context, layers_of(d, nullptr, 0), g, grads);
  EXPECT_TRUE(same_bits(in.queries, module_grads.query));
  EXPECT_TRUE(same_bits(in.keys, module_grads.key));
  const StateDict mg = m.grads();
  const Tensor& in_proj = mg.at("in_proj_weight");
  EXPECT_EQ(std::memcmp(dw[1].data(), in_proj.data() + d.E * d.E, sizeof(float) * static_cast<size_t>(d.E * d.E)), 0);
  EXPECT_TRUE(same_bits(dw[3], mg.at("out_proj.weight")));
}

TEST(LayerRef, WeightPacksPackOncePerVersionAndNeverKeepVersionZero) {
  Generator gen(12);
  const Tensor W = random_tensor({16, 8}, gen);
  nn::WeightPacks packs;
  const int64_t before = cpu::packed_weight_count();
  auto a = packs.get(0, 5, W.data(), 16, 8, Precision::Float32);
  auto b = packs.get(0, 5, W.data(), 16, 8, Precision::Float32);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(cpu::packed_weight_count(), before + 1);
  auto c = packs.get(0, 6, W.data(), 16, 8, Precision::Float32);  // a new version
  EXPECT_NE(a.get(), c.get());
  auto other_slot = packs.get(1, 6, W.data(), 16, 8, Precision::Float32);
  EXPECT_NE(c.get(), other_slot.get());
  auto z1 = packs.get(2, 0, W.data(), 16, 8, Precision::Float32);
  auto z2 = packs.get(2, 0, W.data(), 16, 8, Precision::Float32);
  EXPECT_NE(z1.get(), z2.get());  // version 0: packed per call
  EXPECT_EQ(cpu::packed_weight_count(), before + 5);
  packs.clear();
  auto d = packs.get(0, 6, W.data(), 16, 8, Precision::Float32);
  EXPECT_NE(d.get(), c.get());
}

TEST(LayerRef, ANewVersionOfChangedWeightsChangesTheResult) {
  Generator gen(13);
  Drop d = make_state(gen);
  nn::WeightPacks packs;
  const Tensor q = random_tensor({1, 4, d.E}, gen);
  TorchMhaCall call;
  call.need_weights = false;
  const nn::TorchMhaShape shape{d.E, d.H, d.H, d.E / d.H, true, FullyMaskedRows::Zeros};
  const Tensor first =
      nn::torch_mha_forward("test", shape, layers_of(d, &packs, 21), q, q, q, call, {}).result.output;
  for (float& x : d.state.at("out_proj.weight").values()) x *= 2.0f;
  // Same version: the packing made from the old values is reused (the caller's contract) ...
  const Tensor stale =
      nn::torch_mha_forward("test", shape, layers_of(d, &packs, 21), q, q, q, call, {}).result.output;
  EXPECT_TRUE(same_bits(stale, first));
  // ... a new version packs the new values.
  const Tensor fresh =
      nn::torch_mha_forward("test", shape, layers_of(d, &packs, 22), q, q, q, call, {}).result.output;
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(d.state, d.H, test::batch_first_options());
  m.eval();
  TorchMhaCall no_weights;
  no_weights.need_weights = false;
  EXPECT_TRUE(same_bits(fresh, m.forward(q, q, q, no_weights).output));
  EXPECT_FALSE(same_bits(fresh, first));
}

}  // namespace
}  // namespace mha
