// Head gates and pruning: a pruned module (and model) computes what the
// unpruned one computes with the pruned heads' gates at 0; gate gradients;
// pruned layouts through files; refused input; the pruning experiment on a
// trained model.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "mha/mha.h"
#include "test_util.h"

namespace mha {
namespace {

using test::all_close;
using test::random_tensor;
using test::throws_with;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mha_prune_" + std::to_string(::getpid()) + "_" + name)).string();
}

// The float rounding of the smaller products differs from the gated ones
// (sums over fewer terms), so outputs agree to rounding, not bit for bit:
// 1e-6 of the output's scale, plus 1e-6 absolute.
::testing::AssertionResult close_to_rounding(const Tensor& got, const Tensor& want) {
  double scale = 0.0;
  for (float x : want.values()) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  return all_close(got, want, 0.0, 1e-6 * scale + 1e-6);
}

struct ModuleCase {
  int64_t heads, head_dim, B, Q, K, dq, dk, dv;
  bool bias;
  int lens;  // 0 none, 1 per batch, 2 per query
  std::vector<int64_t> prune;
};

ValidLens lens_for(const ModuleCase& c, Generator& gen) {
  if (c.lens == 0) return {};
  std::vector<float> v(static_cast<size_t>(c.lens == 1 ? c.B : c.B * c.Q));
  // 0 (a fully masked row), fractions and lengths past K, as well as ordinary ones.
  for (float& x : v) x = 0.5f * static_cast<float>(gen.below(static_cast<uint64_t>(2 * c.K + 3)));
  return c.lens == 1 ? ValidLens::per_batch(v) : ValidLens::per_query(c.B, c.Q, v);
}

const ModuleCase kModuleCases[] = {
    {4, 8, 2, 5, 7, 6, 9, 3, false, 1, {1}},
    {5, 3, 3, 1, 13, 11, 11, 11, true, 2, {0, 4}},
    {8, 1, 1, 16, 16, 5, 7, 2, true, 0, {7, 2, 5, 0, 3}},
    {3, 7, 2, 31, 1, 4, 4, 4, false, 2, {1, 2}},
    {6, 5, 4, 9, 37, 20, 3, 8, true, 1, {5}},
};

TEST(HeadPruning, PrunedModuleEqualsGatedModule) {
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Blas, AttentionKernel::Fused}) {
    for (const ModuleCase& c : kModuleCases) {
      SCOPED_TRACE("heads " + std::to_string(c.heads) + " d " + std::to_string(c.head_dim) + " kernel " +
                   std::to_string(static_cast<int>(kernel)));
      Generator gen(c.heads * 100 + c.Q);
      const Tensor X = random_tensor({c.B, c.Q, c.dq}, gen), Kx = random_tensor({c.B, c.K, c.dk}, gen),
                   V = random_tensor({c.B, c.K, c.dv}, gen);
      const ValidLens lens = lens_for(c, gen);
      MultiHeadAttention gated(c.heads * c.head_dim, c.heads, 0.0f, c.bias, 7);
      gated.set_kernel(kernel);
      gated.eval();
      const Tensor full = gated(X, Kx, V, lens);
      std::vector<float> gates(static_cast<size_t>(c.heads), 1.0f);
      for (int64_t h : c.prune) gates[static_cast<size_t>(h)] = 0.0f;
      gated.set_head_gates(gates);
      const Tensor want = gated(X, Kx, V, lens);
      EXPECT_FALSE(all_close(want, full, 0.0, 1e-4)) << "gating heads off changed nothing";

      MultiHeadAttention pruned(c.heads * c.head_dim, c.heads, 0.0f, c.bias, 7);
      pruned.set_kernel(kernel);
      pruned.eval();
      pruned.initialize(c.dq, c.dk, c.dv);  // the same draws as the first call above
      pruned.prune_heads(c.prune);
      const int64_t kept = c.heads - static_cast<int64_t>(c.prune.size());
      EXPECT_EQ(pruned.num_heads(), kept);
      EXPECT_EQ(pruned.original_num_heads(), c.heads);
      EXPECT_EQ(pruned.head_dim(), c.head_dim);
      EXPECT_EQ(pruned.inner_dim(), kept * c.head_dim);
      EXPECT_EQ(pruned.num_hiddens(), c.heads * c.head_dim);
      EXPECT_EQ(pruned.state_dict().at("W_q.weight").shape(), (Shape{kept * c.head_dim, c.dq}));
      EXPECT_EQ(pruned.state_dict().at("W_o.weight").shape(), (Shape{c.heads * c.head_dim, kept * c.head_dim}));
      const Tensor got = pruned(X, Kx, V, lens);
      EXPECT_TRUE(close_to_rounding(got, want));
      // The kept heads' weights are the gated module's, head for head.
      const Tensor& wg = gated.attention_weights();
      const Tensor& wp = pruned.attention_weights();
      ASSERT_EQ(wp.size(1), kept);
      for (int64_t i = 0; i < kept; ++i) {
        const int64_t h = pruned.kept_heads()[static_cast<size_t>(i)];
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t q = 0; q < c.Q; ++q)
            for (int64_t k = 0; k < c.K; ++k)
              ASSERT_NEAR(wp.at({b, i, q, k}), wg.at({b, h, q, k}), 1e-6);
      }
    }
  }
}

TEST(HeadPruning, PruningInStepsEqualsPruningAtOnceAndLazyModulesPruneToo) {
  Generator gen(3);
  const Tensor X = random_tensor({2, 6, 10}, gen);
  const ValidLens lens = ValidLens::per_batch({4, 6});
  MultiHeadAttention once(24, 6, 0.0f, true, 5), steps(24, 6, 0.0f, true, 5), lazy(24, 6, 0.0f, true, 5);
  for (auto* m : {&once, &steps, &lazy}) m->eval();
  once.initialize(10, 10, 10);
  steps.initialize(10, 10, 10);
  once.prune_heads({4, 1, 2});
  steps.prune_heads({2});
  steps.prune_heads({4});
  steps.prune_heads({1});
  EXPECT_EQ(once.kept_heads(), (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(steps.kept_heads(), once.kept_heads());
  EXPECT_EQ(once(X, X, X, lens), steps(X, X, X, lens));
  // A lazy module pruned before its first call builds narrower layers.
  lazy.prune_heads({1});
  const Tensor out = lazy(X, X, X, lens);
  EXPECT_EQ(out.shape(), (Shape{2, 6, 24}));
  EXPECT_EQ(lazy.W_q().weight().shape(), (Shape{20, 10}));
  EXPECT_EQ(lazy.W_o().weight().shape(), (Shape{24, 20}));
}

TEST(HeadPruning, GateGradientIsTheHeadOutputTimesItsUpstreamGradient) {
  // L = sum(out * G): dL/dg_h by central differences of the gate, in float
  // with h = 1e-2 (the output is linear in each gate, so the difference is
  // exact up to rounding).
  Generator gen(9);
  const int64_t B = 2, Q = 5, K = 7, D = 12, H = 4;
  const Tensor X = random_tensor({B, Q, 6}, gen), Y = random_tensor({B, K, 5}, gen), G = random_tensor({B, Q, D}, gen);
  MultiHeadAttention m(D, H, 0.0f, true, 1);
  const std::vector<float> gates = {1.0f, 0.5f, 0.0f, -2.0f};
  m.set_head_gates(gates);
  m.zero_grad();
  m(X, Y, Y, ValidLens::per_batch({3, 7}));
  m.backward(G);
  auto loss = [&](const std::vector<float>& g) {
    MultiHeadAttention copy = m;
    copy.eval();
    copy.set_head_gates(g);
    const Tensor out = copy(X, Y, Y, ValidLens::per_batch({3, 7}));
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i) s += static_cast<double>(out.data()[i]) * G.data()[i];
    return s;
  };
  for (int64_t h = 0; h < H; ++h) {
    std::vector<float> up = gates, down = gates;
    up[h] += 0.01f;
    down[h] -= 0.01f;
    const double fd = (loss(up) - loss(down)) / 0.02;
    EXPECT_NEAR(m.head_gate_grad().data()[h], fd, 1e-4 * (1 + std::fabs(fd))) << "head " << h;
  }
  // Accumulates like the parameters' gradients; zero_grad clears it.
  const float first = m.head_gate_grad().data()[0];
  m(X, Y, Y, ValidLens::per_batch({3, 7}));
  m.backward(G);
  EXPECT_NEAR(m.head_gate_grad().data()[0], 2 * first, 1e-5 * std::fabs(first));
  m.zero_grad();
  EXPECT_EQ(m.head_gate_grad().data()[0], 0.0f);
  // Gates are not parameters.
  EXPECT_FALSE(m.state_dict().count("head_gates"));
  EXPECT_EQ(m.grads().size(), m.state_dict().size());
}

TEST(HeadPruning, BackwardOfAPrunedModuleEqualsTheGatedModulesOnKeptHeads) {
  Generator gen(4);
  const Tensor X = random_tensor({3, 4, 8}, gen), G = random_tensor({3, 4, 15}, gen);
  const ValidLens lens = ValidLens::per_batch({2, 4, 3});
  MultiHeadAttention gated(15, 5, 0.0f, true, 2), pruned(15, 5, 0.0f, true, 2);
  gated.set_head_gates({1, 0, 1, 1, 0});
  pruned.initialize(8, 8, 8);
  gated.initialize(8, 8, 8);
  pruned.prune_heads({1, 4});
  gated(X, X, X, lens);
  pruned(X, X, X, lens);
  const auto gg = gated.backward(G);
  const auto gp = pruned.backward(G);
  EXPECT_TRUE(close_to_rounding(gp.queries, gg.queries));
  EXPECT_TRUE(close_to_rounding(gp.values, gg.values));
  // W_o's gradient: the kept heads' columns of the gated one.
  const Tensor& wo_g = gated.grads().at("W_o.weight");
  const Tensor& wo_p = pruned.grads().at("W_o.weight");
  ASSERT_EQ(wo_p.shape(), (Shape{15, 9}));
  const int64_t kept[] = {0, 2, 3};
  for (int64_t r = 0; r < 15; ++r)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t c = 0; c < 3; ++c)
        EXPECT_NEAR(wo_p.at({r, i * 3 + c}), wo_g.at({r, kept[i] * 3 + c}), 1e-6);
  // A pruned head's gate gradient is what reviving it would change; the
  // kept heads' gradients agree.
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_NEAR(pruned.head_gate_grad().data()[i], gated.head_gate_grad().data()[kept[i]],
                1e-5 * (1 + std::fabs(gated.head_gate_grad().data()[kept[i]])));
}

TEST(HeadPruning, GatesAndPruningWhileCallsRunGiveOneStateOrTheOther) {
  // set_head_gates and prune_heads wait for running calls (the exclusive
  // lock, as load_state_dict): every call sees one whole state. Run under
  // TSan by scripts/test-sanitizers.sh tsan.
  Generator gen(12);
  const Tensor X = random_tensor({2, 9, 8}, gen);
  const ValidLens lens = ValidLens::per_batch({9, 4});
  MultiHeadAttention m(16, 4, 0.0f, true, 3);
  m.eval();
  const Tensor ones = m(X, X, X, lens);
  m.set_head_gates({1, 0, 1, 0});
  const Tensor gated = m(X, X, X, lens);
  MultiHeadAttention copy = m;
  copy.prune_heads({1, 3});
  copy.set_head_gates({1, 1});
  const Tensor pruned = copy(X, X, X, lens);
  std::atomic<bool> is_pruned{false};
  std::atomic<int> unexpected{0};
  std::thread changer([&] {
    for (int i = 0; i < 200; ++i) m.set_head_gates(i % 2 ? std::vector<float>{1, 0, 1, 0} : std::vector<float>{1, 1, 1, 1});
    m.prune_heads({1, 3});
    m.set_head_gates({1, 1});
    is_pruned = true;
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 60; ++rep) {
        const bool after = is_pruned;
        const Tensor out = m(X, X, X, lens);
        if (!(out == ones) && !(out == gated) && !(out == pruned)) ++unexpected;
        if (after && !(out == pruned)) ++unexpected;
      }
    });
  for (std::thread& t : callers) t.join();
  changer.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(m(X, X, X, lens), pruned);
}

TEST(HeadPruning, BadRequestsAreRefusedAndChangeNothing) {
  MultiHeadAttention m(12, 4, 0.0f, false, 0);
  m.initialize(3, 3, 3);
  EXPECT_TRUE(throws_with([&] { m.prune_heads({4}); }, "heads: entry 0 is 4; heads are numbered 0 .. 3"));
  EXPECT_TRUE(throws_with([&] { m.prune_heads({1, 1}); }, "head 1 is listed twice"));
  EXPECT_TRUE(throws_with([&] { m.prune_heads({0, 1, 2, 3}); }, "at least one must remain"));
  EXPECT_EQ(m.num_heads(), 4);
  m.prune_heads({2});
  EXPECT_TRUE(throws_with([&] { m.prune_heads({2}); }, "head 2, which was already pruned"));
  EXPECT_TRUE(throws_with([&] { m.set_head_gates({1, 1, 1, 1}); }, "gates: shape (4,) is not (3,)"));
  EXPECT_TRUE(throws_with([&] { m.set_head_gates({1, NAN, 1}); }, "entry 1 is nan"));
  EXPECT_TRUE(throws_with([&] { m.set_dropout(1.5f); }, "p: 1.5 is not a probability"));
  // A full-width state dict no longer fits.
  MultiHeadAttention full(12, 4, 0.0f, false, 0);
  full.initialize(3, 3, 3);
  EXPECT_TRUE(throws_with([&] { m.load_state_dict(full.state_dict()); },
                          "W_q.weight: shape (12, 3) is not (9, in) (this module has pruned heads)"));
}

TEST(HeadPruning, PrunedModuleFileRoundTrips) {
  Generator gen(6);
  MultiHeadAttention m(20, 5, 0.0f, true, 3);
  m.initialize(7, 6, 5);
  m.prune_heads({0, 3});
  m.eval();
  const Tensor X = random_tensor({2, 3, 7}, gen), Kx = random_tensor({2, 4, 6}, gen), V = random_tensor({2, 4, 5}, gen);
  const Tensor want = m(X, Kx, V, ValidLens::per_batch({2, 4}));
  const std::string path = temp_path("module.safetensors");
  save_attention(path, m);
  EXPECT_EQ(read_safetensors(path).metadata.at("heads_kept"), "1,2,4");
  MultiHeadAttention back = load_attention(path);
  EXPECT_EQ(back.kept_heads(), m.kept_heads());
  EXPECT_EQ(back.original_num_heads(), 5);
  EXPECT_EQ(back(X, Kx, V, ValidLens::per_batch({2, 4})), want);
  EXPECT_TRUE(throws_with([&] { load_attention(path, 4); }, "num_heads: 4 given, but"));
  // A layout naming a head the module does not have is refused.
  Metadata bad = head_layout_metadata(m);
  bad["heads_kept"] = "1,2,9";
  save_safetensors(path, m.state_dict(), bad);
  EXPECT_TRUE(throws_with([&] { load_attention(path); }, "names head 9; the module has heads 0 .. 4"));
  bad["heads_kept"] = "1,x";
  save_safetensors(path, m.state_dict(), bad);
  EXPECT_TRUE(throws_with([&] { load_attention(path); }, "is not a comma-separated list"));
  std::filesystem::remove(path);
}

// A model gated and the same model pruned give the same logits.
TEST(HeadPruning, PrunedModelEqualsGatedModelAndRoundTripsThroughCheckpoints) {
  TrainConfig cfg;
  cfg.model = {.num_hiddens = 24, .num_heads = 6, .num_layers = 2, .bias = true};
  cfg.task = {.vocab = 5, .near = 1, .far = 4, .min_len = 6, .max_len = 9};
  cfg.steps = 3;
  Trainer trainer(cfg);
  for (int i = 0; i < 3; ++i) trainer.step();
  AttentionModel& model = trainer.model();
  model.eval();
  Generator gen(2);
  const TokenBatch b = trainer.task().sample(5, gen);
  model.layer(0).set_head_gates({1, 0, 1, 1, 0, 1});
  model.layer(1).set_head_gates({0, 1, 1, 1, 1, 1});
  const Tensor want = model.forward(b.tokens, b.batch, b.length, b.valid_lens());

  const std::string path = temp_path("model.safetensors");
  save_model_checkpoint(path, trainer.config(), trainer.step_count(), model);  // unpruned, gates not saved
  std::unique_ptr<AttentionModel> pruned = load_model(read_checkpoint(path));
  prune_model_heads(*pruned, {{0, 1}, {0, 4}, {1, 0}});
  EXPECT_TRUE(close_to_rounding(pruned->forward(b.tokens, b.batch, b.length, b.valid_lens()), want));

  save_model_checkpoint(path, trainer.config(), trainer.step_count(), *pruned);
  const Checkpoint ck = read_checkpoint(path);
  EXPECT_EQ(ck.metadata.at("layers.0.heads_kept"), "0,2,3,5");
  EXPECT_EQ(ck.metadata.at("layers.1.heads_kept"), "1,2,3,4,5");
  std::unique_ptr<AttentionModel> back = load_model(ck);
  EXPECT_EQ(back->layer(0).kept_heads(), pruned->layer(0).kept_heads());
  EXPECT_EQ(back->forward(b.tokens, b.batch, b.length, b.valid_lens()),
            pruned->forward(b.tokens, b.batch, b.length, b.valid_lens()));
  // Removing a layer's last heads is refused, naming the layer, and changes nothing.
  EXPECT_TRUE(throws_with([&] { prune_model_heads(*back, {{0, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}}); },
                          "layer 1: [MultiHeadAttention.prune_heads] heads: removing all 5"));
  EXPECT_EQ(back->layer(0).num_heads(), 4);
  std::filesystem::remove(path);
}

TEST(HeadImportance, MeasuresOnAHandBuiltCase) {
  // A head whose W_o columns are 0 cannot matter: its gradient importance
  // and its ablation effects are exactly 0, and every other head's are not.
  TrainConfig cfg;
  cfg.model = {.num_hiddens = 16, .num_heads = 4, .num_layers = 1};
  cfg.task = {.vocab = 4, .near = 1, .far = 3, .min_len = 5, .max_len = 8};
  Trainer trainer(cfg);
  for (int i = 0; i < 5; ++i) trainer.step();
  AttentionModel& model = trainer.model();
  // Head 2 is made useless: its columns of W_o are 0, so the output never
  // depends on it.
  StateDict s = model.state_dict();
  Tensor& wo = s.at("layers.0.W_o.weight");
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t c = 8; c < 12; ++c) wo.at({r, c}) = 0.0f;
  model.load_state_dict(s);
  model.layer(0).set_head_gates({1, 1, 1, 0.5f});  // restored afterwards
  const std::vector<TokenBatch> batches = held_out_set(trainer.task(), 40, 1);

  const GradientImportance g = gradient_importance(model, batches);
  EXPECT_EQ(g.sequences, 40);
  EXPECT_EQ(g.raw[0][2], 0.0);
  double norm = 0;
  for (double x : g.normalised[0]) norm += x * x;
  EXPECT_NEAR(norm, 1.0, 1e-12);
  for (int h : {0, 1, 3}) EXPECT_GT(g.raw[0][h], 0.0);

  const AblationImportance a = ablation_importance(model, batches);
  EXPECT_EQ(a.loss_increase[0][2], 0.0);
  EXPECT_EQ(a.accuracy_drop[0][2], 0.0);
  EXPECT_EQ(model.layer(0).head_gates(), (std::vector<float>{1, 1, 1, 0.5f}));
  EXPECT_TRUE(model.training());  // the trainer's model was in training mode

  const AttentionStatistics st = attention_statistics(model, batches);
  int64_t valid = 0;
  for (const TokenBatch& b : batches)
    for (float len : b.lengths) valid += static_cast<int64_t>(len);
  EXPECT_EQ(st.queries, valid);
  for (int h = 0; h < 4; ++h) {
    EXPECT_GT(st.confidence[0][h], 0.0);
    EXPECT_LE(st.confidence[0][h], 1.0);
    EXPECT_GE(st.entropy[0][h], 0.0);
    EXPECT_LE(st.entropy[0][h], std::log(8.0));
  }
}

TEST(HeadImportance, AttentionStatisticsOfUniformAttentionAreKnown) {
  // With W_q = 0 every score is 0, so each valid query spreads its weight
  // evenly over the len keys of its sequence: confidence 1/len, entropy ln len.
  TrainConfig cfg;
  cfg.model = {.num_hiddens = 8, .num_heads = 2, .num_layers = 1};
  cfg.task = {.vocab = 3, .near = 1, .far = 2, .min_len = 3, .max_len = 7};
  Trainer trainer(cfg);
  AttentionModel& model = trainer.model();
  StateDict s = model.state_dict();
  std::fill(s.at("layers.0.W_q.weight").values().begin(), s.at("layers.0.W_q.weight").values().end(), 0.0f);
  model.load_state_dict(s);
  const std::vector<TokenBatch> batches = held_out_set(trainer.task(), 30, 4);
  double confidence = 0, entropy = 0;
  int64_t n = 0;
  for (const TokenBatch& b : batches)
    for (float len : b.lengths) {
      confidence += len * (1.0 / len);
      entropy += len * std::log(static_cast<double>(len));
      n += static_cast<int64_t>(len);
    }
  const AttentionStatistics st = attention_statistics(model, batches);
  for (int h = 0; h < 2; ++h) {
    EXPECT_NEAR(st.confidence[0][h], confidence / n, 1e-6);
    EXPECT_NEAR(st.entropy[0][h], entropy / n, 1e-5);
  }
}

TEST(PruneExperiment, OrdersAndCurves) {
  TrainConfig cfg;
  cfg.model = {.num_hiddens = 16, .num_heads = 4, .num_layers = 2};
  cfg.task = {.vocab = 4, .near = 1, .far = 3, .min_len = 5, .max_len = 8};
  Trainer trainer(cfg);
  trainer.step();
  AttentionModel& model = trainer.model();
  const HeadScores scores = {{0.3, 0.1, 0.4, 0.2}, {0.05, 0.5, 0.35, 0.0}};
  const std::vector<HeadRef> order = order_by_score(model, scores);
  EXPECT_EQ(order.front(), (HeadRef{1, 3}));
  EXPECT_EQ(order.back(), (HeadRef{1, 1}));
  EXPECT_EQ(order_by_score(model, negated(scores)).front(), (HeadRef{1, 1}));
  const std::vector<HeadRef> r = random_order(model, 5);
  EXPECT_EQ(r.size(), 8u);
  EXPECT_NE(r, random_order(model, 6));

  Checkpoint ck;
  ck.config = trainer.config();
  ck.model = model.state_dict();
  const std::vector<TokenBatch> eval = held_out_set(trainer.task(), 20, 2);
  const PruneCurve c = prune_curve(ck, "by score", order, eval, AttentionKernel::Reference);
  // 8 heads, 2 layers keeping one each: 6 removal steps.
  ASSERT_EQ(c.accuracy.size(), 7u);
  const std::vector<double> ms = latency_sweep(ck, c.removed, eval[0], 2);
  ASSERT_EQ(ms.size(), 7u);
  for (double t : ms) EXPECT_GT(t, 0.0);
  EXPECT_EQ(c.heads_kept.front(), 8);
  EXPECT_EQ(c.heads_kept.back(), 2);
  // (1, 1) is layer 1's last head in that order: it is skipped, never removed.
  EXPECT_EQ(std::count(c.removed.begin(), c.removed.end(), HeadRef{1, 1}), 0);
  EXPECT_DOUBLE_EQ(c.accuracy[0], evaluate(model, eval).accuracy);
  EXPECT_TRUE(throws_with([&] { prune_curve(ck, "x", {order.begin(), order.end() - 1}, eval); },
                          "order: 7 heads for a model with 8 heads"));
  EXPECT_TRUE(throws_with([&] { latency_sweep(ck, {{0, 1}, {0, 1}}, eval[0], 1); }, "order: entry 1 repeats"));
  EXPECT_TRUE(throws_with([&] { latency_sweep(ck, {{0, 0}, {0, 1}, {0, 2}, {0, 3}}, eval[0], 1); },
                          "at least one must remain"));
}

}  // namespace
}  // namespace mha
