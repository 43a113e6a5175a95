// The pruning experiment: see mha/prune_experiment.h.
#include "mha/prune_experiment.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "mha/error.h"
#include "mha/prune.h"
#include "mha/random.h"

namespace mha {

namespace {

std::vector<HeadRef> current_heads(const AttentionModel& model) {
  std::vector<HeadRef> heads;
  for (int64_t l = 0; l < model.num_layers(); ++l)
    for (int64_t h : model.layer(l).kept_heads()) heads.push_back({l, h});
  return heads;
}

}  // namespace

std::vector<HeadRef> order_by_score(const AttentionModel& model, const HeadScores& scores) {
  static const char* op = "order_by_score";
  if (static_cast<int64_t>(scores.size()) != model.num_layers())
    fail(op, "scores: ", scores.size(), " layers of scores for a model of ", model.num_layers(), " layer(s)");
  struct Scored {
    double score;
    HeadRef head;
  };
  std::vector<Scored> all;
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    const std::vector<int64_t>& kept = model.layer(l).kept_heads();
    if (scores[static_cast<size_t>(l)].size() != kept.size())
      fail(op, "scores: layer ", l, " has ", scores[static_cast<size_t>(l)].size(), " scores for its ", kept.size(),
           " heads");
    for (size_t i = 0; i < kept.size(); ++i) all.push_back({scores[static_cast<size_t>(l)][i], {l, kept[i]}});
  }
  std::stable_sort(all.begin(), all.end(), [](const Scored& a, const Scored& b) { return a.score < b.score; });
  std::vector<HeadRef> order;
  for (const Scored& s : all) order.push_back(s.head);
  return order;
}

HeadScores negated(const HeadScores& scores) {
  HeadScores out = scores;
  for (auto& layer : out)
    for (double& x : layer) x = -x;
  return out;
}

std::vector<HeadRef> random_order(const AttentionModel& model, uint64_t seed) {
  std::vector<HeadRef> heads = current_heads(model);
  Generator gen(seed);
  // Fisher-Yates with the generator's unbiased below().
  for (size_t i = heads.size(); i > 1; --i) std::swap(heads[i - 1], heads[gen.below(i)]);
  return heads;
}

namespace {

std::unique_ptr<AttentionModel> load_with_kernel(const Checkpoint& checkpoint, std::optional<AttentionKernel> kernel) {
  std::unique_ptr<AttentionModel> model = load_model(checkpoint);
  if (kernel)
    for (int64_t l = 0; l < model->num_layers(); ++l) model->layer(l).set_kernel(*kernel);
  return model;
}

// Every entry of `order` a head of the model, none twice; all heads if `all`.
void check_order(const AttentionModel& model, const std::vector<HeadRef>& order, bool all, const char* op) {
  const std::vector<HeadRef> heads = current_heads(model);
  if (all && order.size() != heads.size())
    fail(op, "order: ", order.size(), " heads for a model with ", heads.size(), " heads");
  for (size_t i = 0; i < order.size(); ++i) {
    if (std::find(heads.begin(), heads.end(), order[i]) == heads.end())
      fail(op, "order: entry ", i, " is (layer ", order[i].layer, ", head ", order[i].head,
           "), not a head of the model");
    if (std::find(order.begin(), order.begin() + static_cast<long>(i), order[i]) != order.begin() + static_cast<long>(i))
      fail(op, "order: entry ", i, " repeats (layer ", order[i].layer, ", head ", order[i].head, ")");
  }
}

}  // namespace

PruneCurve prune_curve(const Checkpoint& checkpoint, const std::string& name, const std::vector<HeadRef>& order,
                       const std::vector<TokenBatch>& eval, std::optional<AttentionKernel> kernel) {
  std::unique_ptr<AttentionModel> model = load_with_kernel(checkpoint, kernel);
  check_order(*model, order, /*all=*/true, "prune_curve");
  PruneCurve curve;
  curve.name = name;
  int64_t left = static_cast<int64_t>(order.size());
  auto measure = [&] {
    const Evaluation e = evaluate(*model, eval);
    curve.accuracy.push_back(e.accuracy);
    curve.loss.push_back(e.loss);
    curve.heads_kept.push_back(left);
  };
  measure();
  for (const HeadRef& h : order) {
    if (model->layer(h.layer).num_heads() == 1) continue;  // a layer keeps one head
    model->layer(h.layer).prune_heads({h.head});
    curve.removed.push_back(h);
    --left;
    measure();
  }
  return curve;
}

std::vector<double> latency_sweep(const Checkpoint& checkpoint, const std::vector<HeadRef>& removed,
                                  const TokenBatch& batch, int rounds, std::optional<AttentionKernel> kernel) {
  static const char* op = "latency_sweep";
  if (rounds < 1) fail(op, "rounds: ", rounds, " is not positive");
  // models[n]: the first n heads of `removed` gone.
  std::vector<std::unique_ptr<AttentionModel>> models;
  for (size_t n = 0; n <= removed.size(); ++n) {
    models.push_back(load_with_kernel(checkpoint, kernel));
    if (n == 0) check_order(*models.front(), removed, /*all=*/false, op);
    for (size_t i = 0; i < n; ++i)
      models.back()->layer(removed[i].layer).prune_heads({removed[i].head});  // refuses a layer's last head
  }
  const ValidLens lens = batch.valid_lens();
  std::vector<std::vector<double>> ms(models.size());
  for (int round = -1; round < rounds; ++round)  // round -1 warms up buffers and caches
    for (size_t m = 0; m < models.size(); ++m) {
      models[m]->eval();
      const auto t0 = std::chrono::steady_clock::now();
      models[m]->forward(batch.tokens, batch.batch, batch.length, lens);
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (round >= 0) ms[m].push_back(t);
    }
  std::vector<double> out;
  for (std::vector<double>& v : ms) {
    std::sort(v.begin(), v.end());
    out.push_back(v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
  }
  return out;
}

double first_half_area(const PruneCurve& curve, int64_t total_heads) {
  const int64_t steps = static_cast<int64_t>(curve.accuracy.size()) - 1;
  const int64_t n = std::min(total_heads / 2, steps);
  if (n < 1) fail("first_half_area", "curve '", curve.name, "': no removal step to average over");
  double sum = 0.0;
  for (int64_t i = 1; i <= n; ++i) sum += curve.accuracy[static_cast<size_t>(i)];
  return sum / static_cast<double>(n);
}

}  // namespace mha
