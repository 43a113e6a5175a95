// tests/cpp/nn/test_packed_weights.cpp: weights packed once per version
// (src/cpu/gemm/packed_weight.h, LazyLinear::packed_weight).
//
// Held here: a product against a packed weight gives the bits of the
// per-call packing (any rows, both precisions, both bfloat16 paths); a
// layer packs once per version, not per call; every write that mha sees
// (set_weight, the non-const accessors, optimiser steps, load_state_dict,
// pruning, parameters_written) makes the next call use the new values,
// checked bit for bit against a module built fresh from the same state; and
// a switch of kernels (float32 ISA, AMX off) repacks.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cpu/gemm/gemm.h"
#include "cpu/gemm/gemm_amx.h"
#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/linear.h"
#include "mha/multihead.h"
#include "mha/optim.h"
#include "mha/torch_mha.h"
#include "test_util.h"

namespace mha {
namespace {

using test::random_tensor;

bool same_bits(const Tensor& x, const Tensor& y) {
  return x.shape() == y.shape() && std::memcmp(x.data(), y.data(), sizeof(float) * static_cast<size_t>(x.numel())) == 0;
}

// y:[M,N] = x:[M,K] W^T + b through the per-call packing (GemmBatch::add).
Tensor per_call(const Tensor& x, const Tensor& W, const Tensor& b, Precision p) {
  const int64_t M = x.size(0), K = x.size(1), N = W.size(0);
  Tensor y({M, N});
  cpu::GemmBatch batch(p);
  batch.add(M, N, K, x.data(), K, W.data(), K, true, b.data(), y.data(), N);
  batch.run();
  return y;
}

Tensor packed_once(const Tensor& x, const cpu::PackedWeight& w, const Tensor& b, Precision p) {
  const int64_t M = x.size(0), K = x.size(1), N = w.N;
  Tensor y({M, N});
  cpu::GemmBatch batch(p);
  batch.add_packed(M, x.data(), K, w, b.data(), y.data(), N);
  batch.run();
  return y;
}

// Few rows (the unpacked path per call), many rows (row blocks), odd widths;
// float32, bfloat16 on AMX where usable and bfloat16's portable path.
TEST(PackedWeight, SameBitsAsPackingPerCall) {
  Generator gen(3);
  const int64_t shapes[][3] = {{1, 100, 100}, {10, 100, 100}, {33, 17, 65}, {700, 129, 300}, {1500, 768, 96}};
  for (const Precision p : {Precision::Float32, Precision::BFloat16})
    for (const bool amx : {true, false}) {
      if (p == Precision::Float32 && !amx) continue;
      cpu::set_amx_enabled(amx);
      for (const auto& s : shapes) {
        const Tensor x = random_tensor({s[0], s[2]}, gen), W = random_tensor({s[1], s[2]}, gen);
        const Tensor b = random_tensor({s[1]}, gen);
        const std::shared_ptr<cpu::PackedWeight> w = cpu::pack_weight(W.data(), s[1], s[2], p);
        EXPECT_EQ(w->tiles != nullptr, p == Precision::BFloat16 && cpu::amx_usable());
        EXPECT_TRUE(same_bits(packed_once(x, *w, b, p), per_call(x, W, b, p)))
            << to_string(p) << " amx " << amx << " M " << s[0] << " N " << s[1] << " K " << s[2];
      }
    }
  cpu::set_amx_enabled(true);
}

TEST(PackedWeight, LayerPacksOncePerVersion) {
  Generator gen(5);
  LazyLinear layer(48, true);
  layer.initialize(40, gen);
  const Tensor x = random_tensor({6, 40}, gen);
  Tensor y({6, 48});
  const int64_t before = cpu::packed_weight_count();
  layer.forward_rows(x.data(), 6, y.data(), 48);
  layer.forward_rows(x.data(), 6, y.data(), 48);
  const LazyLinear& read_only = layer;
  (void)read_only.weight();  // reading changes nothing
  layer.forward_rows(x.data(), 6, y.data(), 48);
  EXPECT_EQ(cpu::packed_weight_count() - before, 1);
  layer.forward_rows(x.data(), 6, y.data(), 48, Precision::BFloat16);  // its own packing
  EXPECT_EQ(cpu::packed_weight_count() - before, 2);

  // A write through the non-const accessor: the next call packs the new weight.
  layer.weight().data()[7] += 0.5f;
  layer.forward_rows(x.data(), 6, y.data(), 48);
  EXPECT_EQ(cpu::packed_weight_count() - before, 3);
  EXPECT_TRUE(same_bits(y, per_call(x, layer.weight(), layer.bias(), Precision::Float32)));
  // A write through a kept pointer, then the version bumped.
  float* w = layer.weight().data();
  layer.forward_rows(x.data(), 6, y.data(), 48);
  w[3] = 2.0f;
  layer.version().bump();
  layer.forward_rows(x.data(), 6, y.data(), 48);
  EXPECT_TRUE(same_bits(y, per_call(x, layer.weight(), layer.bias(), Precision::Float32)));
  // set_weight.
  layer.set_weight(random_tensor({48, 40}, gen));
  layer.forward_rows(x.data(), 6, y.data(), 48);
  EXPECT_TRUE(same_bits(y, per_call(x, layer.weight(), layer.bias(), Precision::Float32)));
}

// A test switching the float32 micro-kernels, or AMX off, gets a packing for
// the kernels in use (a packing's layout is its ISA's).
TEST(PackedWeight, KernelSwitchRepacks) {
  Generator gen(6);
  LazyLinear layer(64, false);
  layer.initialize(50, gen);
  const Tensor x = random_tensor({9, 50}, gen), none;
  Tensor y({9, 64});
  layer.forward_rows(x.data(), 9, y.data(), 64);
  layer.forward_rows(x.data(), 9, y.data(), 64, Precision::BFloat16);
  const cpu::GemmIsa isa = cpu::gemm_isa();
  for (const cpu::GemmIsa other : {cpu::GemmIsa::Scalar, cpu::GemmIsa::Avx2}) {
    if (other == isa || !cpu::set_gemm_isa(other)) continue;
    layer.forward_rows(x.data(), 9, y.data(), 64);
    EXPECT_TRUE(same_bits(y, per_call(x, layer.weight(), none, Precision::Float32))) << cpu::gemm_isa_name(other);
  }
  cpu::set_gemm_isa(isa);
  cpu::set_amx_enabled(false);
  layer.forward_rows(x.data(), 9, y.data(), 64, Precision::BFloat16);
  EXPECT_TRUE(same_bits(y, per_call(x, layer.weight(), none, Precision::BFloat16)));
  cpu::set_amx_enabled(true);
  layer.forward_rows(x.data(), 9, y.data(), 64, Precision::BFloat16);
  EXPECT_TRUE(same_bits(y, per_call(x, layer.weight(), none, Precision::BFloat16)));
}

// The module's output after a write equals that of a module built fresh from
// its state dict (which packs from scratch), bit for bit.
Tensor fresh_output(const MultiHeadAttention& m, const Tensor& X) {
  MultiHeadAttention fresh(m.num_hiddens(), m.num_heads(), 0.0f, true, 1);  // unpruned modules only
  fresh.set_precision(m.precision());
  fresh.load_state_dict(m.state_dict());
  fresh.eval();
  return fresh.forward(X, X, X);
}

TEST(PackedWeight, ModuleSeesEveryWrite) {
  for (const Precision p : {Precision::Float32, Precision::BFloat16}) {
    Generator gen(8);
    MultiHeadAttention m(32, 4, 0.0f, true, 2);
    m.set_precision(p);
    const Tensor X = random_tensor({3, 70, 24}, gen);
    const int64_t before = cpu::packed_weight_count();
    (void)m.forward(X, X, X);  // training mode: kept for backward
    EXPECT_EQ(cpu::packed_weight_count() - before, 4) << "one packing per layer";
    const Tensor out = m.forward(X, X, X);
    EXPECT_EQ(cpu::packed_weight_count() - before, 4) << "the second call packs nothing";

    // An optimiser step (it marks what it writes).
    (void)m.backward(random_tensor(out.shape(), gen));
    optim::SGD sgd(m.parameters(), {0.1});
    sgd.step();
    m.eval();
    Tensor after = m.forward(X, X, X);
    EXPECT_FALSE(same_bits(after, out));
    EXPECT_TRUE(same_bits(after, fresh_output(m, X))) << to_string(p) << ": after an SGD step";
    optim::Adam adam(m.parameters(), {});
    (void)m.forward(X, X, X);
    m.train();
    (void)m.forward(X, X, X);
    (void)m.backward(random_tensor(out.shape(), gen));
    adam.step();
    m.eval();
    EXPECT_TRUE(same_bits(m.forward(X, X, X), fresh_output(m, X))) << to_string(p) << ": after an Adam step";

    // load_state_dict.
    StateDict state = m.state_dict();
    for (auto& [name, t] : state) t = random_tensor(t.shape(), gen);
    m.load_state_dict(state);
    after = m.forward(X, X, X);
    EXPECT_TRUE(same_bits(after, fresh_output(m, X))) << to_string(p) << ": after load_state_dict";

    // Through a pointer from parameters(), then parameters_written().
    ParamList params = m.parameters();
    (void)m.forward(X, X, X);
    for (ParamRef& r : params) r.value->data()[0] = 0.25f;
    m.parameters_written();
    EXPECT_TRUE(same_bits(m.forward(X, X, X), fresh_output(m, X))) << to_string(p) << ": after parameters_written";

    // Through the non-const layer accessor.
    (void)m.forward(X, X, X);
    m.W_o().weight().data()[5] = -1.0f;
    EXPECT_TRUE(same_bits(m.forward(X, X, X), fresh_output(m, X))) << to_string(p) << ": after W_o().weight()";

    // Pruning replaces the layers' weights: the same as a twin pruned
    // before any call (so before any packing).
    MultiHeadAttention twin(32, 4, 0.0f, true, 1);
    twin.set_precision(p);
    twin.load_state_dict(m.state_dict());
    twin.eval();
    twin.prune_heads({1, 3});
    m.prune_heads({1, 3});
    EXPECT_TRUE(same_bits(m.forward(X, X, X), twin.forward(X, X, X))) << to_string(p) << ": after prune_heads";
  }
}

TEST(PackedWeight, DropInSeesOptimiserSteps) {
  Generator gen(9);
  const int64_t E = 24;
  StateDict state{{"in_proj_weight", random_tensor({3 * E, E}, gen)},
                  {"in_proj_bias", random_tensor({3 * E}, gen)},
                  {"out_proj.weight", random_tensor({E, E}, gen)},
                  {"out_proj.bias", random_tensor({E}, gen)}};
  TorchMhaOptions options = test::batch_first_options();
  options.batch_first = true;
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(state, 4, options);
  const Tensor X = random_tensor({2, 30, E}, gen);
  const TorchMhaResult first = m.forward(X, X, X);
  (void)m.backward(random_tensor(first.output.shape(), gen));
  optim::SGD sgd(m.parameters(), {0.2});
  sgd.step();
  const Tensor after = m.forward(X, X, X).output;
  TorchMultiheadAttention fresh = TorchMultiheadAttention::from_state_dict(m.state_dict(), 4, options);
  EXPECT_FALSE(same_bits(after, first.output));
  EXPECT_TRUE(same_bits(after, fresh.forward(X, X, X).output));
}

}  // namespace
}  // namespace mha
