// mha/prune_experiment.h: the d2l chapter's second exercise as an experiment.
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
//   mha::PruneCurve c = mha::prune_curve(ck, "gradient", order, eval_batches);
//   // c.accuracy[n]: held-out accuracy with n heads removed
//   std::vector<double> ms = mha::latency_sweep(ck, c.removed, batch, 20);
//
// Heads are removed across all layers in one global order; a head that is
// the last one left in its layer is skipped (a layer keeps at least one), so
// every curve has total_heads - num_layers removal steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mha/attention.h"
#include "mha/checkpoint.h"
#include "mha/importance.h"
#include "mha/model.h"
#include "mha/task.h"

namespace mha {

// One head of a model: its layer and its number as that layer was built.
struct HeadRef {
  int64_t layer = 0;  // 0 .. num_layers-1
  int64_t head = 0;   // as the layer was built
  // Same layer and head.
  friend bool operator==(const HeadRef&, const HeadRef&) = default;
};

// The model's current heads ordered by score, lowest first (ties: layer,
// then head). scores[l][i] belongs to model.layer(l).kept_heads()[i].
std::vector<HeadRef> order_by_score(const AttentionModel& model, const HeadScores& scores);
// The same scores negated: highest first.
HeadScores negated(const HeadScores& scores);
// The model's current heads in a random order drawn from Generator(seed).
std::vector<HeadRef> random_order(const AttentionModel& model, uint64_t seed);

// Held-out accuracy and loss as heads are removed in one order.
struct PruneCurve {
  std::string name;                 // the order's name ("gradient", "random 0", ...)
  std::vector<HeadRef> removed;     // in removal order (the order less skipped heads)
  std::vector<double> accuracy;     // [steps + 1]: index n = n heads removed
  std::vector<double> loss;         // [steps + 1]
  std::vector<int64_t> heads_kept;  // [steps + 1]: total heads left
};

// Loads the checkpoint's model (mha::load_model), then removes heads in
// `order` one at a time (physically, prune_heads), measuring loss and
// accuracy on `eval` before the first removal and after each. `order` must
// name every current head once. `kernel`: the layers' attention kernel
// (none: the module default).
PruneCurve prune_curve(const Checkpoint& checkpoint, const std::string& name, const std::vector<HeadRef>& order,
                       const std::vector<TokenBatch>& eval, std::optional<AttentionKernel> kernel = std::nullopt);

// Forward latency as heads go: the checkpoint's model after removing the
// first 0, 1, ..., removed.size() heads of `removed`, each timed by
// evaluation-mode forwards of `batch`. The models are timed round-robin,
// one forward of each per round for `rounds` rounds (after one warm-up
// round), and each model's median is returned, so that a change in machine
// load hits every step alike. -> ms:[removed.size() + 1]
std::vector<double> latency_sweep(const Checkpoint& checkpoint, const std::vector<HeadRef>& removed,
                                  const TokenBatch& batch, int rounds,
                                  std::optional<AttentionKernel> kernel = std::nullopt);

// Mean accuracy after removing 1 .. n heads, n = total_heads / 2 (capped at
// the curve's steps): the area under the accuracy curve over the first half
// of the heads, per removal step.
double first_half_area(const PruneCurve& curve, int64_t total_heads);

}  // namespace mha
