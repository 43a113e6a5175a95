// `mha prune`: which heads matter (the d2l chapter's second exercise).
//
//   mha prune --checkpoint model.safetensors      (from `mha train`)
//   mha prune                                     (trains a model first)
//
// 1. Scores every head of the model with the measures of mha/importance.h
//    over an importance set (task sequences drawn from --importance-seed,
//    distinct from the held-out set).
// 2. For each measure, removes the heads one at a time in its order (least
//    important first), in the reverse order, and in --random-orders random
//    orders, measuring the checkpoint's held-out accuracy after each
//    removal; and times the forward pass after each removal of the first
//    order (latency depends on the heads kept per layer, not on which;
//    mha/prune_experiment.h).
// 3. Prints the scores and the curves, writes them as CSV (--csv) and a PNG
//    (--plot: accuracy against heads removed, one line per order; latency
//    against heads removed, as the accuracy; measures that agree are drawn
//    side by side, not on top of each other), and names the measure whose
//    order kept accuracy highest over the first half of the heads.
// Without --checkpoint it first trains --layers x --heads on the task (the
// experiment needs more heads than the task needs: 2 per layer do the work).
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "commands.h"
// Internal: core::MemoryPlan (plan_experiment below); the public mha/memory.h
// has the limit but not the planner. CMakeLists.txt lets this file see src/.
#include "core/memory.h"
#include "mha/atomic_file.h"
#include "mha/mha.h"
#include "mha/plot.h"
#include "outputs.h"
#include "prune_plot.h"

namespace mha::tools {

namespace {

const char* kOp = "prune";
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

struct PruneOptions {
  std::string checkpoint;
  // Training when no checkpoint is given.
  TrainConfig train;
  std::string train_out;
  // The experiment.
  int64_t importance_size = 256;
  uint64_t importance_seed = 1;
  int64_t random_orders = 5;
  uint64_t random_seed = 1;
  int64_t latency_batch = 64;
  int latency_repeats = 20;
  int threads = 1;
  std::string kernel = "fused";  // the library's default (README.md)
  std::string plot = "prune.png";
  std::string csv = "prune.csv";
  std::string pruned_out;
  int64_t keep = 0;
  bool keep_given = false;
};

struct Measure {
  std::string name;
  HeadScores scores;  // higher = more important
};

std::unique_ptr<Checkpoint> train_model(PruneOptions& opt) {
  TrainConfig& cfg = opt.train;
  std::printf("no --checkpoint: training %lld layer(s) x %lld heads, D %lld, %lld steps on the offset-pair task "
              "(near %lld, far %lld)\n",
              (long long)cfg.model.num_layers, (long long)cfg.model.num_heads, (long long)cfg.model.num_hiddens,
              (long long)cfg.steps, (long long)cfg.task.near, (long long)cfg.task.far);
  std::fflush(stdout);
  Trainer trainer(cfg);
  while (trainer.step_count() < cfg.steps) {
    trainer.step();
    if (trainer.step_count() % 50 == 0 || trainer.step_count() == cfg.steps)
      std::printf("  step %lld/%lld\n", (long long)trainer.step_count(), (long long)cfg.steps);
  }
  std::printf("trained in %.1f s; held-out accuracy %.2f%%\n", trainer.history().back().seconds,
              100 * trainer.evaluate());
  if (!opt.train_out.empty()) {
    trainer.save(opt.train_out);
    std::printf("wrote %s\n", opt.train_out.c_str());
  }
  auto ck = std::make_unique<Checkpoint>();
  ck->config = trainer.config();
  ck->step = trainer.step_count();
  ck->model = trainer.model().state_dict();
  ck->metadata = checkpoint_metadata(ck->config, ck->step);
  return ck;
}

int64_t total_heads(const AttentionModel& model) {
  int64_t n = 0;
  for (int64_t l = 0; l < model.num_layers(); ++l) n += model.layer(l).num_heads();
  return n;
}

void print_scores(const AttentionModel& model, const GradientImportance& g, const AblationImportance& a,
                  const AttentionStatistics& s) {
  std::printf("\nHead importance (gradient: Michel et al. 2019, normalised per layer; ablation: head alone gated "
              "off; confidence/entropy: Voita et al. 2019)\n");
  std::printf("layer head  gradient  |dL/dg| raw  ablation dloss  ablation dacc  confidence  entropy\n");
  for (int64_t l = 0; l < model.num_layers(); ++l)
    for (size_t i = 0; i < model.layer(l).kept_heads().size(); ++i)
      std::printf("%5lld %4lld  %8.4f  %11.4g  %14.5f  %12.2f%%  %10.4f  %7.4f\n", (long long)l,
                  (long long)model.layer(l).kept_heads()[i], g.normalised[l][i], g.raw[l][i], a.loss_increase[l][i],
                  100 * a.accuracy_drop[l][i], s.confidence[l][i], s.entropy[l][i]);
}

void write_csv(const std::string& path, const std::vector<PruneCurve>& curves, const std::vector<double>& latency) {
  // latency_ms: of the step's heads-kept count (timed along the first order).
  std::string text = "order,heads_removed,heads_kept,removed_layer,removed_head,accuracy,loss,latency_ms\n";
  char line[256];
  for (const PruneCurve& c : curves)
    for (size_t i = 0; i < c.accuracy.size(); ++i) {
      std::string removed = ",";
      if (i > 0) removed = std::to_string(c.removed[i - 1].layer) + "," + std::to_string(c.removed[i - 1].head);
      std::snprintf(line, sizeof line, "%s,%zu,%lld,%s,%.17g,%.17g,%.6f\n", c.name.c_str(), i,
                    (long long)c.heads_kept[i], removed.c_str(), c.accuracy[i], c.loss[i], latency[i]);
      text += line;
    }
  io::write_file_atomic(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

void write_plot(const std::string& path, const std::vector<PruneCurve>& measured, const std::vector<PruneCurve>& reversed,
                const std::vector<PruneCurve>& random, const std::vector<double>& latency,
                const std::vector<int64_t>& kept, const std::string& title) {
  plot::LineChartOptions options;
  options.title = title;
  plot::write_png(path, plot::render_line_chart(prune_plot_panels(measured, reversed, random, latency, kept), options).image);
}

AttentionKernel kernel_of(const std::string& name) {
  if (name == "reference") return AttentionKernel::Reference;
  if (name == "fused") return AttentionKernel::Fused;
  return AttentionKernel::Blas;
}

// The sets and batches the experiment draws, sized by --importance-size and
// --latency-batch, planned against the memory limit before anything is
// trained or allocated.
void plan_experiment(const PruneOptions& opt, const TrainConfig& cfg) {
  const int64_t T = cfg.task.max_len, D = cfg.model.num_hiddens, H = cfg.model.num_heads, L = cfg.model.num_layers;
  const int64_t B = opt.latency_batch;
  core::MemoryPlan plan(kOp);
  plan.add("importance set (--importance-size x max_len tokens and targets)", {opt.importance_size, T}, 12);
  plan.add("latency probe's activations (--latency-batch x max_len x num_hiddens per layer)", {L, 8, B, T, D});
  plan.add("latency probe's attention weights (--latency-batch x heads x max_len^2 per layer)", {L, 2, B, H, T, T});
  plan.check();
}

void run_prune(PruneOptions& opt) {
  mha::set_num_threads(opt.threads);  // mha's count, which the products use too (see mha train)
  const AttentionKernel kernel = kernel_of(opt.kernel);
  // Every output checked before any work: a failing command leaves no file.
  check_outputs(kOp, {{"--csv", opt.csv}, {"--plot", opt.plot}, {"--pruned-out", opt.pruned_out},
                      {"--train-out", opt.train_out}},
                {".csv", ".png", ".safetensors", ".safetensors"}, {{"--checkpoint", opt.checkpoint}});

  std::unique_ptr<Checkpoint> ck;
  if (!opt.checkpoint.empty()) ck = std::make_unique<Checkpoint>(read_checkpoint(opt.checkpoint));
  plan_experiment(opt, ck ? ck->config : opt.train);
  if (!ck) ck = train_model(opt);
  const TrainConfig& cfg = ck->config;
  const OffsetPairTask task(cfg.task);
  std::unique_ptr<AttentionModel> model = load_model(*ck);
  for (int64_t l = 0; l < model->num_layers(); ++l) model->layer(l).set_kernel(kernel);
  const int64_t heads = total_heads(*model);
  if (heads <= model->num_layers())
    fail(kOp, "the model has ", heads, " head(s) in ", model->num_layers(),
         " layer(s): nothing to prune (every layer keeps one head); train with more, e.g. mha train --heads 8");
  // --keep is checked now, not after the experiment it would have waited for.
  const int64_t keep = opt.keep_given ? opt.keep : (heads + 1) / 2;
  if (!opt.pruned_out.empty() && (keep < model->num_layers() || keep > heads))
    fail(kOp, "--keep: ", keep, " heads is not in [", model->num_layers(), ", ", heads, "]");
  if (opt.importance_seed == cfg.held_out_seed)
    fail(kOp, "--importance-seed: ", opt.importance_seed, " is the held-out set's seed; the importance set must differ");

  const std::vector<TokenBatch> held_out = held_out_set(task, cfg.eval_size, cfg.held_out_seed);
  const std::vector<TokenBatch> importance_set = held_out_set(task, opt.importance_size, opt.importance_seed);
  Generator probe_gen(opt.importance_seed + 1);
  const TokenBatch probe = task.sample(opt.latency_batch, probe_gen);

  std::printf("mha prune: %s (%lld layer(s) x %lld heads, D %lld, step %lld), %lld heads in all; held-out set "
              "%lld sequences (seed %llu), importance set %lld (seed %llu); %s kernel, %d thread(s)\n",
              opt.checkpoint.empty() ? "trained model" : opt.checkpoint.c_str(), (long long)cfg.model.num_layers,
              (long long)cfg.model.num_heads, (long long)cfg.model.num_hiddens, (long long)ck->step, (long long)heads,
              (long long)cfg.eval_size, (unsigned long long)cfg.held_out_seed, (long long)opt.importance_size,
              (unsigned long long)opt.importance_seed, opt.kernel.c_str(), num_threads());

  std::printf("scoring heads: gradient\n");
  const GradientImportance grad = gradient_importance(*model, importance_set);
  std::printf("scoring heads: ablation\n");
  const AblationImportance abl = ablation_importance(*model, importance_set);
  std::printf("scoring heads: confidence and entropy\n");
  const AttentionStatistics stats = attention_statistics(*model, importance_set);
  print_scores(*model, grad, abl, stats);
  const std::vector<Measure> measures = {
      {"gradient", grad.normalised},
      {"ablation", abl.loss_increase},
      {"confidence", stats.confidence},
      {"entropy", negated(stats.entropy)},  // diffuse heads first
  };

  std::vector<PruneCurve> measured, reversed, random;
  const size_t orders = 2 * measures.size() + static_cast<size_t>(opt.random_orders);
  size_t done = 0;
  auto progress = [&](const std::string& name) {
    std::printf("pruning order %zu/%zu: %s\n", ++done, orders, name.c_str());
  };
  for (const Measure& m : measures) {
    progress(m.name + " and its reverse");
    ++done;
    measured.push_back(prune_curve(*ck, m.name, order_by_score(*model, m.scores), held_out, kernel));
    reversed.push_back(
        prune_curve(*ck, "reverse " + m.name, order_by_score(*model, negated(m.scores)), held_out, kernel));
  }
  for (int64_t r = 0; r < opt.random_orders; ++r) {
    progress("random " + std::to_string(r));
    random.push_back(prune_curve(*ck, "random " + std::to_string(r), random_order(*model, opt.random_seed + r),
                                 held_out, kernel));
  }
  std::vector<PruneCurve> all = measured;
  all.insert(all.end(), reversed.begin(), reversed.end());
  all.insert(all.end(), random.begin(), random.end());
  // Latency depends on how many heads each layer keeps, hardly on which:
  // timed along the first measure's order.
  std::printf("timing the forward pass at each number of heads kept\n");
  const std::vector<double> latency = latency_sweep(*ck, measured.front().removed, probe, opt.latency_repeats, kernel);
  const std::vector<int64_t>& kept = all.front().heads_kept;

  // The table: accuracy per order, random as mean (min..max), latency.
  std::printf("\nHeld-out accuracy (%%) after removing n heads, per order (least important first; 'rev' = most "
              "important first)\n");
  std::printf("removed kept");
  for (const PruneCurve& c : measured) std::printf(" %10s", c.name.c_str());
  for (const Measure& m : measures) std::printf(" %10s", ("rev " + m.name.substr(0, 6)).c_str());
  if (!random.empty()) std::printf("  random mean (min..max)");
  std::printf("  latency ms\n");
  for (size_t i = 0; i < kept.size(); ++i) {
    std::printf("%7zu %4lld", i, (long long)kept[i]);
    for (const PruneCurve& c : measured) std::printf(" %10.1f", 100 * c.accuracy[i]);
    for (const PruneCurve& c : reversed) std::printf(" %10.1f", 100 * c.accuracy[i]);
    if (!random.empty()) {
      double sum = 0, lo = 1, hi = 0;
      for (const PruneCurve& c : random) {
        sum += c.accuracy[i];
        lo = std::min(lo, c.accuracy[i]);
        hi = std::max(hi, c.accuracy[i]);
      }
      std::printf("  %6.1f (%5.1f..%5.1f)", 100 * sum / random.size(), 100 * lo, 100 * hi);
    }
    std::printf("  %10.3f\n", latency[i]);
  }

  // Which measure predicted best: the area under its accuracy curve over
  // the first half of the heads.
  const int64_t half = std::min<int64_t>(heads / 2, static_cast<int64_t>(kept.size()) - 1);
  std::printf("\nMean held-out accuracy after removing 1..%lld heads (the first half):\n", (long long)half);
  double best = -1;
  std::string best_name;
  for (size_t i = 0; i < measured.size(); ++i) {
    const double a = first_half_area(measured[i], heads), r = first_half_area(reversed[i], heads);
    std::printf("  %-10s %6.2f%%   (reverse order %6.2f%%)\n", measured[i].name.c_str(), 100 * a, 100 * r);
    if (a > best) best = a, best_name = measured[i].name;
  }
  double random_mean = 0;
  if (!random.empty()) {
    double lo = 1, hi = 0;
    for (const PruneCurve& c : random) {
      const double a = first_half_area(c, heads);
      random_mean += a / static_cast<double>(random.size());
      lo = std::min(lo, a);
      hi = std::max(hi, a);
    }
    std::printf("  %-10s %6.2f%%   (%lld orders, %.2f%% .. %.2f%%)\n", "random", 100 * random_mean,
                (long long)random.size(), 100 * lo, 100 * hi);
    std::printf("best predictor: %s, %.2f%% vs random orders' %.2f%% (%+.2f points)\n", best_name.c_str(), 100 * best,
                100 * random_mean, 100 * (best - random_mean));
  } else {
    std::printf("best predictor: %s, %.2f%%\n", best_name.c_str(), 100 * best);
  }
  // Latency at half the heads against all heads.
  size_t at_half = 0;
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i] >= (heads + 1) / 2) at_half = i;
  std::printf("forward latency (batch %lld x %lld, median of %d): %lld heads %.3f ms, %lld heads %.3f ms "
              "(%.2fx), %lld heads %.3f ms (%.2fx)\n",
              (long long)probe.batch, (long long)probe.length, opt.latency_repeats, (long long)kept.front(),
              latency.front(), (long long)kept[at_half], latency[at_half], latency[at_half] / latency.front(),
              (long long)kept.back(), latency.back(), latency.back() / latency.front());

  if (!opt.csv.empty()) {
    write_csv(opt.csv, all, latency);
    std::printf("wrote %s\n", opt.csv.c_str());
  }
  if (!opt.plot.empty()) {
    write_plot(opt.plot, measured, reversed, random, latency, kept,
               "mha prune: " + std::to_string(cfg.model.num_layers) + " layer(s) x " +
                   std::to_string(cfg.model.num_heads) + " heads, offset-pair task");
    std::printf("wrote %s\n", opt.plot.c_str());
  }
  if (!opt.pruned_out.empty()) {
    // The model pruned by the best measure's order down to --keep heads.
    const PruneCurve& c = *std::find_if(measured.begin(), measured.end(),
                                        [&](const PruneCurve& m) { return m.name == best_name; });
    std::vector<std::pair<int64_t, int64_t>> removed;
    for (int64_t i = 0; i < heads - keep; ++i) removed.push_back({c.removed[i].layer, c.removed[i].head});
    std::unique_ptr<AttentionModel> pruned = load_model(*ck);
    prune_model_heads(*pruned, removed);
    save_model_checkpoint(opt.pruned_out, cfg, ck->step, *pruned);
    std::printf("wrote %s: %lld of %lld heads kept by the %s order, held-out accuracy %.2f%%\n",
                opt.pruned_out.c_str(), (long long)keep, (long long)heads, best_name.c_str(),
                100 * evaluate(*pruned, held_out).accuracy);
  }
}

}  // namespace

void add_prune_command(CLI::App& app) {
  auto opt = std::make_shared<PruneOptions>();
  TrainConfig& t = opt->train;
  // The experiment's own default model: 8 heads where the task needs 2.
  t.model.num_heads = 8;
  t.model.num_layers = 1;
  t.steps = 400;
  CLI::App* cmd = app.add_subcommand("prune", "Measure head importance and prune heads (accuracy and latency)");
  cmd->add_option("--checkpoint", opt->checkpoint, "Trained model (from mha train); none: train one first")
      ->check(CLI::ExistingFile);
  cmd->add_option("--heads", t.model.num_heads, "Without --checkpoint: heads per layer")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--layers", t.model.num_layers, "Without --checkpoint: layers")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--hiddens", t.model.num_hiddens, "Without --checkpoint: model width D")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--steps", t.steps, "Without --checkpoint: training steps")
      ->transform(integer_in(1, kMax64))->capture_default_str();
  cmd->add_option("--seed", t.seed, "Without --checkpoint: training seed")
      ->check(unsigned_integer())->capture_default_str();
  cmd->add_option("--train-out", opt->train_out, "Without --checkpoint: also save the trained checkpoint here");
  cmd->add_option("--importance-size", opt->importance_size, "Sequences the importance measures average over")
      
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--importance-seed", opt->importance_seed, "Seed of the importance set (not the held-out seed)")
      ->check(unsigned_integer())
      ->capture_default_str();
  cmd->add_option("--random-orders", opt->random_orders, "Random pruning orders (baseline)")
      ->transform(integer_in(0, kMaxInt))->capture_default_str();
  cmd->add_option("--random-seed", opt->random_seed, "Seed of the first random order")
      ->check(unsigned_integer())->capture_default_str();
  cmd->add_option("--latency-batch", opt->latency_batch, "Sequences in the latency probe's batch")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--latency-repeats", opt->latency_repeats, "Timed forwards per step (median; round-robin over steps)")
      
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--threads", opt->threads, "Threads mha computes with")->transform(thread_count())->capture_default_str();
  cmd->add_option("--kernel", opt->kernel, "Attention kernel")
      ->check(CLI::IsMember({"reference", "blas", "fused"}))->capture_default_str();
  cmd->add_option("--plot", opt->plot, "PNG of the curves ('' for none)")->capture_default_str();
  cmd->add_option("--csv", opt->csv, "CSV of the curves ('' for none)")->capture_default_str();
  CLI::Option* pruned_out =
      cmd->add_option("--pruned-out", opt->pruned_out, "Also write the model pruned by the best measure (checkpoint)");
  cmd->add_option("--keep", opt->keep, "Heads --pruned-out keeps (default: half)")
      ->transform(integer_in(1, kMaxInt))->needs(pruned_out);
  cmd->callback([opt, cmd] {
    opt->keep_given = cmd->count("--keep") > 0;
    // The seed of no random order would be ignored.
    if (cmd->count("--random-seed") > 0 && opt->random_orders == 0)
      throw CLI::ValidationError("--random-seed", "applies only with --random-orders above 0, not 0");
    if (!opt->checkpoint.empty())
      for (const char* name : {"--heads", "--layers", "--hiddens", "--steps", "--seed", "--train-out"})
        if (cmd->count(name) > 0)
          fail(kOp, name, ": only for training without --checkpoint; the checkpoint '", opt->checkpoint,
               "' has its own model");
    run_prune(*opt);
  });
}

}  // namespace mha::tools
