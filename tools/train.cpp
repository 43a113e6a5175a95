// `mha train`: train an AttentionModel on the offset-pair task (mha/task.h).
//
// Prints a progress line (step, loss, batch accuracy, held-out accuracy,
// steps/s): rewritten in place with \r on a terminal, one line per
// evaluation otherwise. Writes the checkpoint (--out), the curves as CSV
// (--curves: step, loss, train_accuracy, held_out_accuracy, seconds; losses
// with 17 digits, so two runs can be compared exactly) and a plot (--plot).
// The same seed and thread count give the same loss curve, bit for bit.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "mha/atomic_file.h"
#include "mha/mha.h"
#include "mha/plot.h"
#include "outputs.h"

namespace mha::tools {

namespace {

const char* kOp = "train";
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

struct TrainOptions {
  TrainConfig config;
  std::string optimizer = "adam";
  std::string positions = "learned";
  int threads = 2;
  double target = 0.99;
  bool stop_at_target = false;
  std::string out = "model.safetensors";
  std::string curves = "curves.csv";
  std::string plot = "curves.png";
  std::string resume;
  bool steps_given = false;
  std::vector<std::string> config_options_given;  // options a resumed run takes from its checkpoint
};

// Options that set the training config; a resumed run takes them from its
// checkpoint, so giving one with --resume is refused rather than ignored.
const char* const kConfigOptions[] = {
    "--seed", "--batch", "--layers", "--heads", "--hiddens", "--dropout", "--bias", "--positions",
    "--optimizer", "--lr", "--momentum", "--weight-decay", "--clip", "--vocab", "--near", "--far",
    "--min-len", "--max-len", "--eval-every", "--eval-size"};

// The CSV is built in memory and written through write_file_atomic, so a
// failed or interrupted write leaves the previous curves file as it was.
std::string curves_csv(const std::vector<TrainPoint>& history) {
  std::string text = "step,loss,train_accuracy,held_out_accuracy,seconds\n";
  char line[160];
  for (const TrainPoint& p : history) {
    std::snprintf(line, sizeof line, "%lld,%.17g,%.17g,", static_cast<long long>(p.step), p.loss, p.accuracy);
    text += line;
    if (p.held_out_accuracy >= 0) {
      std::snprintf(line, sizeof line, "%.17g", p.held_out_accuracy);
      text += line;
    }
    std::snprintf(line, sizeof line, ",%.3f\n", p.seconds);
    text += line;
  }
  return text;
}

void write_curves_csv(const std::string& path, const std::vector<TrainPoint>& history) {
  const std::string text = curves_csv(history);
  io::write_file_atomic(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// The PNG of the curves: the training loss per step (log scale) and the
// batch and held-out accuracy against the step, side by side.
void write_curves_png(const std::string& path, const std::vector<TrainPoint>& history) {
  plot::Series loss, batch_acc, held_out;
  loss.name = "batch loss";
  batch_acc.name = "batch accuracy";
  held_out.name = "held-out accuracy";
  held_out.markers = true;
  for (const TrainPoint& p : history) {
    const double step = static_cast<double>(p.step);
    if (p.loss > 0) {
      loss.x.push_back(step);
      loss.y.push_back(p.loss);
    }
    batch_acc.x.push_back(step);
    batch_acc.y.push_back(p.accuracy);
    if (p.held_out_accuracy >= 0) {
      held_out.x.push_back(step);
      held_out.y.push_back(p.held_out_accuracy);
    }
  }
  plot::LinePanel loss_panel{.title = "Training loss", .xlabel = "step", .ylabel = "cross-entropy", .series = {}};
  loss_panel.log_y = true;
  loss_panel.series.push_back(std::move(loss));
  plot::LinePanel acc_panel{.title = "Accuracy", .xlabel = "step", .ylabel = "accuracy", .series = {}};
  acc_panel.ymin = 0.0;
  acc_panel.ymax = 1.0;
  acc_panel.series.push_back(std::move(batch_acc));
  acc_panel.series.push_back(std::move(held_out));
  plot::write_png(path, plot::render_line_chart({loss_panel, acc_panel},
                                                {.title = "mha train: offset-pair task"}).image);
}

// Training that diverged (a loss or parameter that is NaN or infinite, e.g.
// from --lr 1e30) stops with an error; the outputs are not written, so a
// checkpoint already at --out is kept as it was.
[[noreturn]] void diverged(int64_t step, const std::string& what, const std::string& out) {
  fail(kOp, "step ", step, ": ", what, "; training diverged (lower --lr, or --clip the gradients), so nothing is "
       "written and '", out, "' is kept as it was");
}

bool finite_parameters(const AttentionModel& model) {
  for (const auto& [name, t] : model.state_dict())
    for (const float x : t.values())
      if (!std::isfinite(x)) return false;
  return true;
}

void run_train(TrainOptions& opt) {
  TrainConfig& cfg = opt.config;
  // One owner of parallelism: mha's own thread count (mha::set_num_threads),
  // which the attention kernels and the projections' and gradients' products
  // (mha's packed GEMM, cpu/parallel_gemm) run on; OpenBLAS computes none of
  // them. A fixed count gives the same loss curve from run to run; the header
  // line reports mha::num_threads(), the count in effect.
  mha::set_num_threads(opt.threads);
  if (!(opt.target > 0 && opt.target <= 1)) fail(kOp, "--target: ", opt.target, " is not in (0, 1]");
  // --steps 0 writes an untrained model (a starting point, a test fixture):
  // never over an existing file, and without a plot, which would have no
  // point to draw.
  if (opt.resume.empty() && cfg.steps == 0) {
    if (!opt.plot.empty()) fail(kOp, "--steps: 0 steps leave no curve to draw; give --plot '' with --steps 0");
    if (access(opt.out.c_str(), F_OK) == 0)
      fail(kOp, "--steps: 0 would replace '", opt.out, "' by an untrained model; remove it first or choose another --out");
  }
  // Every output is checked before any work, so that a bad path fails now
  // and leaves no file, instead of after minutes of training.
  check_outputs(kOp, {{"--out", opt.out}, {"--curves", opt.curves}, {"--plot", opt.plot}},
                {".safetensors", ".csv", ".png"});

  std::unique_ptr<Trainer> trainer;
  if (!opt.resume.empty()) {
    if (!opt.config_options_given.empty())
      fail(kOp, opt.config_options_given.front(), ": a resumed run takes its config from the checkpoint '",
           opt.resume, "'; only --steps, --threads and the output options may be given");
    trainer = Trainer::load(opt.resume);
    if (opt.steps_given) trainer->set_total_steps(cfg.steps);
  } else {
    if (opt.optimizer == "sgd") cfg.optimizer.kind = OptimizerKind::SGD;
    else if (opt.optimizer == "adam") cfg.optimizer.kind = OptimizerKind::Adam;
    else if (opt.optimizer == "adamw") cfg.optimizer.kind = OptimizerKind::AdamW;
    cfg.model.positions = opt.positions == "sinusoidal" ? PositionKind::Sinusoidal : PositionKind::Learned;
    trainer = std::make_unique<Trainer>(cfg);
  }
  const TrainConfig& c = trainer->config();
  const ModelConfig& m = c.model;
  std::printf("mha train: offset-pair task (vocab %lld, near %lld, far %lld, lengths %lld..%lld), "
              "%lld layer(s) x %lld heads, D %lld, %s positions, %s lr %g, batch %lld, seed %llu, "
              "%d thread(s)\n",
              (long long)c.task.vocab, (long long)c.task.near, (long long)c.task.far,
              (long long)c.task.min_len, (long long)c.task.max_len, (long long)m.num_layers,
              (long long)m.num_heads, (long long)m.num_hiddens,
              m.positions == PositionKind::Learned ? "learned" : "sinusoidal",
              trainer->optimizer().name(), c.optimizer.lr, (long long)c.batch_size,
              (unsigned long long)c.seed, num_threads());
  if (trainer->step_count() > 0)
    std::printf("resumed from %s at step %lld\n", opt.resume.c_str(), (long long)trainer->step_count());

  const bool tty = isatty(fileno(stdout));
  double held_out = -1.0, last_print = 0.0, window_start = 0.0;
  int64_t window_steps = 0, reached_step = -1;
  double reached_seconds = 0.0;
  while (trainer->step_count() < c.steps) {
    TrainPoint p;
    try {
      p = trainer->step();
    } catch (const Error& e) {
      // Parameters grown past float32's range make a forward overflow: the
      // same divergence, reported as such.
      if (std::string(e.what()).find("overflows float32") == std::string::npos) throw;
      diverged(trainer->step_count() + 1, "a projection or score overflows float32", opt.out);
    }
    if (!std::isfinite(p.loss)) {
      if (tty) std::printf("\n");
      std::fflush(stdout);
      diverged(p.step, "the loss is " + std::to_string(p.loss), opt.out);
    }
    ++window_steps;
    if (p.held_out_accuracy >= 0) held_out = p.held_out_accuracy;
    if (p.held_out_accuracy >= opt.target && reached_step < 0) {
      reached_step = p.step;
      reached_seconds = p.seconds;
    }
    const bool evaluated = p.held_out_accuracy >= 0;
    const bool last = p.step == c.steps || (opt.stop_at_target && reached_step >= 0);
    if ((tty && p.seconds - last_print >= 0.1) || evaluated || last) {
      const double rate = window_steps / std::max(p.seconds - window_start, 1e-9);
      char held[16] = "    -";
      if (held_out >= 0) std::snprintf(held, sizeof held, "%5.1f%%", 100 * held_out);
      char line[200];
      std::snprintf(line, sizeof line, "step %6lld/%lld  loss %.4f  acc %5.1f%%  held-out %s  %6.1f steps/s",
                    (long long)p.step, (long long)c.steps, p.loss, 100 * p.accuracy, held, rate);
      if (tty) std::printf("\r%s\x1b[K", line);
      if (!tty && evaluated) std::printf("%s\n", line);
      std::fflush(stdout);
      last_print = p.seconds;
      window_start = p.seconds;
      window_steps = 0;
    }
    if (opt.stop_at_target && reached_step >= 0) break;
  }
  if (tty) std::printf("\n");

  const auto& history = trainer->history();
  const double total = history.empty() ? 0.0 : history.back().seconds;
  if (reached_step >= 0)
    std::printf("held-out accuracy reached %.1f%% at step %lld after %.1f s\n", 100 * opt.target,
                (long long)reached_step, reached_seconds);
  else
    std::printf("held-out accuracy did not reach %.1f%% (last %.2f%%)\n", 100 * opt.target,
                100 * std::max(held_out, 0.0));
  std::printf("trained %zu steps in %.1f s (%.1f steps/s); final held-out accuracy %.2f%%\n",
              history.size(), total, history.size() / std::max(total, 1e-9),
              100 * trainer->evaluate());
  if (!finite_parameters(trainer->model())) diverged(trainer->step_count(), "a parameter is not finite", opt.out);
  trainer->save(opt.out);
  std::printf("wrote %s (step %lld)\n", opt.out.c_str(), (long long)trainer->step_count());
  if (!opt.curves.empty()) {
    write_curves_csv(opt.curves, history);
    std::printf("wrote %s\n", opt.curves.c_str());
  }
  if (!opt.plot.empty()) {
    write_curves_png(opt.plot, history);
    std::printf("wrote %s\n", opt.plot.c_str());
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto opt = std::make_shared<TrainOptions>();
  TrainConfig& c = opt->config;
  CLI::App* cmd = app.add_subcommand(
      "train", "Train attention on the offset-pair task: target[t] = (token[t-near], token[t-far])");
  cmd->add_option("--seed", c.seed, "Seed of the initialisation, batches and dropout")
      ->transform(unsigned_integer())->capture_default_str();
  cmd->add_option("--steps", c.steps, "Training steps (total, when resuming)")
      ->transform(integer_in(0, kMax64))->capture_default_str();
  cmd->add_option("--batch", c.batch_size, "Sequences per batch")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--layers", c.model.num_layers, "Attention layers (residual when more than one)")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--heads", c.model.num_heads, "Heads per layer")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--hiddens", c.model.num_hiddens, "Model width D (a multiple of --heads)")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--dropout", c.model.dropout, "Dropout on the attention weights")->capture_default_str();
  cmd->add_flag("--bias", c.model.bias, "Biases in the attention projections");
  cmd->add_option("--positions", opt->positions, "Position encoding")
      ->check(CLI::IsMember({"learned", "sinusoidal"}))->capture_default_str();
  cmd->add_option("--optimizer", opt->optimizer, "Optimiser")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))->capture_default_str();
  cmd->add_option("--lr", c.optimizer.lr, "Learning rate")->capture_default_str();
  cmd->add_option("--momentum", c.optimizer.momentum, "SGD momentum")->capture_default_str();
  cmd->add_option("--weight-decay", c.optimizer.weight_decay, "Weight decay")->capture_default_str();
  cmd->add_option("--clip", c.clip_norm, "Clip the global gradient norm to this (0: off)")->capture_default_str();
  cmd->add_option("--vocab", c.task.vocab, "Task symbols (classes: vocab^2)")
      ->transform(integer_in(2, 256))->capture_default_str();
  cmd->add_option("--near", c.task.near, "Task's short offset")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--far", c.task.far, "Task's long offset")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--min-len", c.task.min_len, "Shortest sequence")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--max-len", c.task.max_len, "Longest sequence")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--eval-every", c.eval_every, "Held-out accuracy every N steps")
      ->transform(integer_in(1, kMax64))->capture_default_str();
  cmd->add_option("--eval-size", c.eval_size, "Held-out sequences")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--threads", opt->threads, "Threads mha computes with (results are reproducible per thread count)")
      ->transform(thread_count())->capture_default_str();
  cmd->add_option("--target", opt->target, "Held-out accuracy whose first step and time are reported")->capture_default_str();
  cmd->add_flag("--stop-at-target", opt->stop_at_target, "Stop once the held-out accuracy reaches --target");
  cmd->add_option("--out", opt->out, "Checkpoint to write (safetensors)")->capture_default_str();
  cmd->add_option("--curves", opt->curves, "CSV of the loss and accuracy curves ('' for none)")->capture_default_str();
  cmd->add_option("--plot", opt->plot, "PNG plot of the curves ('' for none)")->capture_default_str();
  cmd->add_option("--resume", opt->resume, "Continue from this checkpoint (its config wins)")->check(CLI::ExistingFile);
  cmd->callback([opt, cmd] {
    opt->steps_given = cmd->count("--steps") > 0;
    // SGD alone has a momentum: with Adam or AdamW it would be ignored.
    if (cmd->count("--momentum") > 0 && opt->optimizer != "sgd" && opt->resume.empty())
      throw CLI::ValidationError("--momentum", "applies to --optimizer sgd only, not " + opt->optimizer);
    for (const char* name : kConfigOptions)
      if (cmd->count(name) > 0) opt->config_options_given.push_back(name);
    run_train(*opt);
  });
}

}  // namespace mha::tools
