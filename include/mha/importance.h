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

struct GradientImportance {
  HeadScores raw;         // mean over sequences of |dL/dg_h|
  HeadScores normalised;  // raw / L2 norm of the layer's raw scores (0 if all are 0)
  int64_t sequences = 0;  // sequences averaged over (those with a scored position)
};
// One forward and backward per sequence (in training mode with dropout
// off), so each sequence's gradient is its own before the absolute value.
GradientImportance gradient_importance(AttentionModel& model, const std::vector<TokenBatch>& batches);

// Loss (mean cross-entropy over scored positions) and accuracy over batches,
// in evaluation mode.
struct Evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t scored = 0;
};
Evaluation evaluate(AttentionModel& model, const std::vector<TokenBatch>& batches);

struct AblationImportance {
  Evaluation all_heads;        // every head on
  HeadScores loss_increase;    // loss with head h off - loss with all on
  HeadScores accuracy_drop;    // accuracy with all on - accuracy with head h off
};
AblationImportance ablation_importance(AttentionModel& model, const std::vector<TokenBatch>& batches);

struct AttentionStatistics {
  HeadScores confidence;  // mean largest weight per valid query, in (0, 1]
  HeadScores entropy;     // mean entropy per valid query, in [0, ln K]
  int64_t queries = 0;    // valid queries averaged over, per head
};
AttentionStatistics attention_statistics(AttentionModel& model, const std::vector<TokenBatch>& batches);

}  // namespace mha
