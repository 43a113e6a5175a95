// Training end to end: the task is learned, the heads specialise on its two
// ranges, the loss curve is reproducible bit for bit, and a checkpoint
// resumes a run exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "mha/mha.h"

namespace mha {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mha_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(Training, LearnsTheTaskAndHeadsSpecialiseOnBothRanges) {
  // The default setting; its held-out accuracy passes 99% after about 100
  // steps (a few seconds). 400 steps leave room for other seeds.
  TrainConfig cfg;
  cfg.steps = 400;
  Trainer trainer(cfg);
  double accuracy = 0.0;
  while (trainer.step_count() < cfg.steps && accuracy < 0.99) {
    const TrainPoint p = trainer.step();
    if (p.held_out_accuracy >= 0) accuracy = p.held_out_accuracy;
  }
  ASSERT_GE(accuracy, 0.99) << "after " << trainer.step_count() << " steps";

  // Each head's mean weight at offset t - j, over scored queries of fresh sequences.
  const OffsetPairTask& task = trainer.task();
  const OffsetPairTaskConfig& tc = task.config();
  Generator gen(123);
  const TokenBatch b = task.sample(128, gen);
  AttentionModel& model = trainer.model();
  model.eval();
  model.forward(b.tokens, b.batch, b.length, b.valid_lens());
  const Tensor& w = model.layer(0).attention_weights();  // [B,h,T,T]
  bool near_head = false, far_head = false;
  for (int64_t h = 0; h < w.size(1); ++h) {
    double at_near = 0, at_far = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < b.batch; ++i)
      for (int64_t t = tc.far; t < static_cast<int64_t>(b.lengths[i]); ++t, ++n) {
        at_near += w.at({i, h, t, t - tc.near});
        at_far += w.at({i, h, t, t - tc.far});
      }
    near_head |= at_near / n > 0.5;
    far_head |= at_far / n > 0.5;
  }
  EXPECT_TRUE(near_head) << "no head puts most of its weight at offset " << tc.near;
  EXPECT_TRUE(far_head) << "no head puts most of its weight at offset " << tc.far;
}

TEST(Training, SameSeedGivesTheSameLossCurveBitForBit) {
  TrainConfig cfg;
  cfg.steps = 30;
  cfg.eval_every = 10;
  cfg.model.dropout = 0.2f;  // the dropout streams must repeat too
  auto curve = [](const TrainConfig& c) {
    Trainer t(c);
    std::vector<double> out;
    while (t.step_count() < c.steps) {
      const TrainPoint p = t.step();
      out.push_back(p.loss);
      if (p.held_out_accuracy >= 0) out.push_back(p.held_out_accuracy);
    }
    return out;
  };
  const std::vector<double> a = curve(cfg), b = curve(cfg);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "entry " << i;  // exact
  TrainConfig other = cfg;
  other.seed = 1;
  EXPECT_NE(curve(other), a);
}

TEST(Training, ACheckpointResumesTheRunExactly) {
  for (OptimizerKind kind : {OptimizerKind::Adam, OptimizerKind::SGD}) {
    TrainConfig cfg;
    cfg.steps = 24;
    cfg.eval_every = 1000;
    cfg.model.num_layers = 2;
    cfg.model.dropout = 0.1f;
    cfg.model.positions = PositionKind::Sinusoidal;
    cfg.optimizer.kind = kind;
    cfg.optimizer.lr = kind == OptimizerKind::SGD ? 0.1 : 3e-3;
    Trainer straight(cfg);
    for (int i = 0; i < 24; ++i) straight.step();

    Trainer first(cfg);
    for (int i = 0; i < 12; ++i) first.step();
    const std::string path = temp_path("resume.safetensors");
    first.save(path);
    std::unique_ptr<Trainer> resumed = Trainer::load(path);
    std::filesystem::remove(path);
    EXPECT_EQ(resumed->step_count(), 12);
    EXPECT_EQ(resumed->optimizer().name(), std::string(kind == OptimizerKind::SGD ? "sgd" : "adam"));
    for (int i = 0; i < 12; ++i) {
      const TrainPoint p = resumed->step();
      EXPECT_EQ(p.loss, straight.history()[12 + i].loss) << "step " << p.step;
    }
    EXPECT_EQ(resumed->model().state_dict(), straight.model().state_dict());
    EXPECT_EQ(resumed->optimizer().state(), straight.optimizer().state());
  }
}

TEST(Training, CheckpointsCarryTheirConfig) {
  TrainConfig cfg;
  cfg.seed = 0xFFFFFFFFFFFFFFF1ull;
  cfg.task.vocab = 5;
  cfg.task.far = 7;
  cfg.model.num_heads = 2;
  cfg.model.num_hiddens = 6;
  cfg.model.dropout = 0.3f;
  cfg.optimizer.kind = OptimizerKind::AdamW;
  cfg.optimizer.lr = 0.1 / 3;
  cfg.optimizer.weight_decay = 1e-2;
  Trainer t(cfg);
  t.step();
  const std::string path = temp_path("config.safetensors");
  t.save(path);
  const Checkpoint ck = read_checkpoint(path);
  std::filesystem::remove(path);
  EXPECT_EQ(ck.step, 1);
  EXPECT_EQ(ck.config.seed, cfg.seed);
  EXPECT_EQ(ck.config.task.vocab, 5);
  EXPECT_EQ(ck.config.task.far, 7);
  EXPECT_EQ(ck.config.model.num_classes, 25);
  EXPECT_EQ(ck.config.model.vocab_size, 6);
  EXPECT_EQ(ck.config.model.dropout, 0.3f);
  EXPECT_EQ(ck.config.optimizer.kind, OptimizerKind::AdamW);
  EXPECT_EQ(ck.config.optimizer.lr, 0.1 / 3);  // 17 digits read back exactly
  EXPECT_EQ(ck.model, t.model().state_dict());
  EXPECT_EQ(ck.optimizer, t.optimizer().state());
  EXPECT_EQ(ck.optimizer.count("readout.weight.exp_avg"), 1u);
  // The loaded model is the trained one: same held-out accuracy, in eval mode.
  std::unique_ptr<AttentionModel> model = load_model(ck);
  EXPECT_FALSE(model->training());
  const std::vector<TokenBatch> held_out = held_out_set(t.task(), 300, 4);
  EXPECT_EQ(held_out.size(), 2u);
  EXPECT_EQ(evaluate_accuracy(*model, held_out), evaluate_accuracy(t.model(), held_out));
  EXPECT_TRUE(t.model().training());
}

TEST(Training, BadCheckpointsAreRefusedWithTheFieldNamed) {
  TrainConfig cfg;
  Trainer t(cfg);
  const std::string path = temp_path("bad.safetensors");
  auto meta = checkpoint_metadata(cfg, 0);
  meta["model.num_heads"] = "four";
  save_safetensors(path, t.model().state_dict(), meta);
  try {
    read_checkpoint(path);
    FAIL() << "a malformed field was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metadata 'model.num_heads' = 'four' is not an integer"), std::string::npos)
        << e.what();
  }
  meta.erase("model.num_heads");
  save_safetensors(path, t.model().state_dict(), meta);
  EXPECT_THROW(read_checkpoint(path), Error);
  // A checkpoint whose optimiser state is missing cannot resume.
  save_safetensors(path, t.model().state_dict(), checkpoint_metadata(cfg, 5));
  try {
    Trainer::load(path);
    FAIL() << "a checkpoint without optimiser state resumed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing buffer"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(Training, OffsetPairTaskBatches) {
  const OffsetPairTask task({.vocab = 6, .near = 2, .far = 5, .min_len = 7, .max_len = 11});
  Generator gen(9);
  const TokenBatch b = task.sample(50, gen);
  EXPECT_EQ(b.tokens.size(), static_cast<size_t>(50 * b.length));
  bool unequal = false;
  for (int64_t i = 0; i < b.batch; ++i) {
    const int64_t n = static_cast<int64_t>(b.lengths[i]);
    ASSERT_GE(n, 7);
    ASSERT_LE(n, b.length);
    unequal |= n != b.length;
    for (int64_t t = 0; t < b.length; ++t) {
      const int32_t tok = b.tokens[i * b.length + t], target = b.targets[i * b.length + t];
      if (t >= n) {
        EXPECT_EQ(tok, task.pad_token());
        EXPECT_EQ(target, kIgnore);
      } else if (t < 5) {
        EXPECT_EQ(target, kIgnore);
      } else {
        EXPECT_EQ(target, b.tokens[i * b.length + t - 2] * 6 + b.tokens[i * b.length + t - 5]);
      }
    }
  }
  EXPECT_TRUE(unequal);
}

}  // namespace
}  // namespace mha
