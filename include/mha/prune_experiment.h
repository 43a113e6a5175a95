// mha/prune_experiment.h: the seed's second exercise as an experiment.
//
// "Suppose that we have a trained model based on multi-head attention and we
// want to prune less important attention heads to increase the prediction
// speed. How can we design experiments to measure the importance of an
// attention head?" One answer: rank the heads by an importance measure
// (mha/importance.h), remove them one at a time, least important first, and
// after each removal measure held-out accuracy and forward latency. A
// measure is good if its order keeps accuracy higher than random orders do
// (and than its own reverse) while heads go.
//
//   mha::Checkpoint ck = mha::read_checkpoint("model.safetensors");
//   auto model = mha::load_model(ck);
//   auto scores = mha::gradient_importance(*model, importance_batches);
//   auto order = mha::order_by_score(*model, scores.normalised);
//   mha::PruneCurve c = mha::prune_curve(ck, "gradient", order, eval_batches, timing);
//   // c.accuracy[n]: held-out accuracy with n heads removed
//
// Heads are removed across all layers in one global order; a head that is
// the last one left in its layer is skipped (a layer keeps at least one), so
// every curve has total_heads - num_layers removal steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mha/checkpoint.h"
#include "mha/importance.h"
#include "mha/model.h"
#include "mha/task.h"

namespace mha {

struct HeadRef {
  int64_t layer = 0;
  int64_t head = 0;  // as the layer was built
  friend bool operator==(const HeadRef&, const HeadRef&) = default;
};

// The model's current heads ordered by score, lowest first (ties: layer,
// then head). scores[l][i] belongs to model.layer(l).kept_heads()[i].
std::vector<HeadRef> order_by_score(const AttentionModel& model, const HeadScores& scores);
// The same scores negated: highest first.
HeadScores negated(const HeadScores& scores);
// The model's current heads in a random order drawn from Generator(seed).
std::vector<HeadRef> random_order(const AttentionModel& model, uint64_t seed);

// How forward latency is measured after each removal: the median wall time
// of `repeats` evaluation-mode forwards of `batch` (after one warm-up).
struct LatencyProbe {
  TokenBatch batch;
  int repeats = 20;
};

struct PruneCurve {
  std::string name;
  std::vector<HeadRef> removed;    // in removal order (the order less skipped heads)
  std::vector<double> accuracy;    // [steps + 1]: index n = n heads removed
  std::vector<double> loss;        // [steps + 1]
  std::vector<double> latency_ms;  // [steps + 1]; empty without a probe
  std::vector<int64_t> heads_kept; // [steps + 1]: total heads left
};

// Loads the checkpoint's model (mha::load_model), then removes heads in
// `order` one at a time (physically, prune_heads), measuring `eval` loss and
// accuracy and, if `probe` is given, latency before the first removal and
// after each. `order` must name every current head once.
PruneCurve prune_curve(const Checkpoint& checkpoint, const std::string& name, const std::vector<HeadRef>& order,
                       const std::vector<TokenBatch>& eval, const LatencyProbe* probe = nullptr);

// Mean accuracy after removing 1 .. n heads, n = total_heads / 2 (capped at
// the curve's steps): the area under the accuracy curve over the first half
// of the heads, per removal step.
double first_half_area(const PruneCurve& curve, int64_t total_heads);

}  // namespace mha
