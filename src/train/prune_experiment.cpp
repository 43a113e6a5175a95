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

double median_forward_ms(AttentionModel& model, const LatencyProbe& probe) {
  const TokenBatch& b = probe.batch;
  const ValidLens lens = b.valid_lens();
  model.forward(b.tokens, b.batch, b.length, lens);  // warm-up: buffers, caches
  std::vector<double> ms;
  for (int i = 0; i < probe.repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    model.forward(b.tokens, b.batch, b.length, lens);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<long>(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

std::vector<HeadRef> order_by_score(const AttentionModel& model, const HeadScores& scores) {
  static const char* op = "order_by_score";
  if (static_cast<int64_t>(scores.size()) != model.num_layers())
    fail(op, "scores: ", scores.size(), " layers of scores for a model of ", model.num_layers(), " layers");
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

PruneCurve prune_curve(const Checkpoint& checkpoint, const std::string& name, const std::vector<HeadRef>& order,
                       const std::vector<TokenBatch>& eval, const LatencyProbe* probe) {
  static const char* op = "prune_curve";
  std::unique_ptr<AttentionModel> model = load_model(checkpoint);
  const std::vector<HeadRef> heads = current_heads(*model);
  if (order.size() != heads.size())
    fail(op, "order: ", order.size(), " heads for a model with ", heads.size(), " heads");
  for (size_t i = 0; i < order.size(); ++i) {
    if (std::find(heads.begin(), heads.end(), order[i]) == heads.end())
      fail(op, "order: entry ", i, " is (layer ", order[i].layer, ", head ", order[i].head,
           "), not a head of the model");
    if (std::find(order.begin(), order.begin() + static_cast<long>(i), order[i]) != order.begin() + static_cast<long>(i))
      fail(op, "order: entry ", i, " repeats (layer ", order[i].layer, ", head ", order[i].head, ")");
  }
  if (probe && probe->repeats < 1) fail(op, "probe.repeats: ", probe->repeats, " is not positive");

  PruneCurve curve;
  curve.name = name;
  int64_t left = static_cast<int64_t>(heads.size());
  auto measure = [&] {
    const Evaluation e = evaluate(*model, eval);
    curve.accuracy.push_back(e.accuracy);
    curve.loss.push_back(e.loss);
    curve.heads_kept.push_back(left);
    if (probe) curve.latency_ms.push_back(median_forward_ms(*model, *probe));
  };
  model->eval();
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

double first_half_area(const PruneCurve& curve, int64_t total_heads) {
  const int64_t steps = static_cast<int64_t>(curve.accuracy.size()) - 1;
  const int64_t n = std::min(total_heads / 2, steps);
  if (n < 1) fail("first_half_area", "curve '", curve.name, "': no removal step to average over");
  double sum = 0.0;
  for (int64_t i = 1; i <= n; ++i) sum += curve.accuracy[static_cast<size_t>(i)];
  return sum / static_cast<double>(n);
}

}  // namespace mha
