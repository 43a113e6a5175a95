// mha/importance.h: how much each attention head of a trained model
// matters, measured over a set of batches (e.g. a held-out set of the task).
//
// Three measures, per layer and head (heads in each layer's current order,
// i.e. model.layer(l).kept_heads()):
//   gradient   Michel, Levy & Neubig 2019 ("Are Sixteen Heads Really Better
//              than One?"): I_h = mean over sequences x of |dL(x)/dg_h|,
//              g_h the head's gate at 1 and L(x) the mean cross-entropy over
//              x's scored positions; then divided by the L2 norm of its
//              layer's scores, as in the paper, so layers compare.
//   ablation   the change in loss and in accuracy over the whole set when
//              head h alone is gated off (g_h = 0).
//   attention  Voita et al. 2019: confidence, the mean over valid queries
//              (positions before the sequence's length) of the query's
//              largest attention weight; and entropy, the mean over valid
//              queries of -sum_k w_k ln w_k (nats).
// High gradient, ablation and confidence mean important; high entropy means
// diffuse attention, taken as less important.
//
//   auto batches = mha::held_out_set(task, 512, /*seed=*/1);
//   mha::GradientImportance g = mha::gradient_importance(model, batches);
//   g.normalised[0][3];   // layer 0, head kept_heads()[3]
//
// Every function restores the model's mode, dropout and gates; the gradient
// measure leaves the model's accumulated gradients at zero.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/model.h"
#include "mha/task.h"

namespace mha {

// scores[l][i]: layer l, the i-th head it still has.
using HeadScores = std::vector<std::vector<double>>;

// Michel et al.'s scores of every head (see the file comment).
struct GradientImportance {
  HeadScores raw;         // mean over sequences of |dL/dg_h|
  HeadScores normalised;  // raw / L2 norm of the layer's raw scores (0 if all are 0)
  int64_t sequences = 0;  // sequences averaged over (those with a scored position)
};
// One forward and backward per sequence (in training mode with dropout
// off), so each sequence's gradient is its own before the absolute value.
GradientImportance gradient_importance(AttentionModel& model, const std::vector<TokenBatch>& batches);

// A model's loss and accuracy over a set of batches.
struct Evaluation {
  double loss = 0.0;      // mean cross-entropy over the scored positions
  double accuracy = 0.0;  // fraction of scored positions whose largest logit is the target
  int64_t scored = 0;     // positions with a target
};
// Loss and accuracy over batches, in evaluation mode (the model's mode is restored).
Evaluation evaluate(AttentionModel& model, const std::vector<TokenBatch>& batches);

// The effect of gating each head off alone.
struct AblationImportance {
  Evaluation all_heads;        // every head on
  HeadScores loss_increase;    // loss with head h off - loss with all on
  HeadScores accuracy_drop;    // accuracy with all on - accuracy with head h off
};
// One evaluation over `batches` with every head on, then one per head with
// that head's gate at 0 (the other gates as they are).
AblationImportance ablation_importance(AttentionModel& model, const std::vector<TokenBatch>& batches);

// Voita et al.'s statistics of every head's attention weights.
struct AttentionStatistics {
  HeadScores confidence;  // mean largest weight per valid query, in (0, 1]
  HeadScores entropy;     // mean entropy per valid query, in [0, ln K]
  int64_t queries = 0;    // valid queries averaged over, per head
};
// One evaluation-mode forward per batch; queries at or past their
// sequence's length are not counted.
AttentionStatistics attention_statistics(AttentionModel& model, const std::vector<TokenBatch>& batches);

}  // namespace mha
