// Head importance measures: see mha/importance.h.
#include "mha/importance.h"

#include <algorithm>
#include <cmath>

#include "mha/error.h"
#include "mha/loss.h"

namespace mha {

namespace {

// Restores the model's mode, and every layer's dropout and gates, on exit.
class ModelStateGuard {
 public:
  explicit ModelStateGuard(AttentionModel& model) : model_(model), training_(model.training()) {
    for (int64_t l = 0; l < model.num_layers(); ++l) {
      dropout_.push_back(model.layer(l).dropout());
      gates_.push_back(model.layer(l).head_gates());
    }
  }
  ~ModelStateGuard() {
    model_.train(training_);
    for (int64_t l = 0; l < model_.num_layers(); ++l) {
      model_.layer(l).set_dropout(dropout_[static_cast<size_t>(l)]);
      model_.layer(l).set_head_gates(gates_[static_cast<size_t>(l)]);
    }
  }
  ModelStateGuard(const ModelStateGuard&) = delete;
  ModelStateGuard& operator=(const ModelStateGuard&) = delete;

 private:
  AttentionModel& model_;
  bool training_;
  std::vector<float> dropout_;
  std::vector<std::vector<float>> gates_;
};

void check_batches(const std::vector<TokenBatch>& batches, const char* op) {
  if (batches.empty()) fail(op, "batches: none given; wanted at least one batch");
  for (size_t i = 0; i < batches.size(); ++i) {
    const TokenBatch& b = batches[i];
    if (b.batch <= 0 || b.length <= 0 || static_cast<int64_t>(b.tokens.size()) != b.batch * b.length ||
        static_cast<int64_t>(b.targets.size()) != b.batch * b.length ||
        static_cast<int64_t>(b.lengths.size()) != b.batch)
      fail(op, "batches: entry ", i, " has ", b.tokens.size(), " tokens, ", b.targets.size(), " targets and ",
           b.lengths.size(), " lengths for shape ", shape_str({b.batch, b.length}),
           "; wanted B*T, B*T and B");
  }
}

// Row r of a batch as a batch of one, cut to its length.
TokenBatch row_of(const TokenBatch& b, int64_t r) {
  const int64_t n = std::clamp(static_cast<int64_t>(std::ceil(b.lengths[static_cast<size_t>(r)])), int64_t{1}, b.length);
  TokenBatch one;
  one.batch = 1;
  one.length = n;
  one.tokens.assign(b.tokens.begin() + r * b.length, b.tokens.begin() + r * b.length + n);
  one.targets.assign(b.targets.begin() + r * b.length, b.targets.begin() + r * b.length + n);
  one.lengths = {b.lengths[static_cast<size_t>(r)]};
  return one;
}

HeadScores zeros_like_layers(const AttentionModel& model) {
  HeadScores s;
  for (int64_t l = 0; l < model.num_layers(); ++l) s.emplace_back(static_cast<size_t>(model.layer(l).num_heads()), 0.0);
  return s;
}

void zero_all_grads(AttentionModel& model) {
  model.zero_grad();
  for (int64_t l = 0; l < model.num_layers(); ++l) model.layer(l).zero_grad();  // the gates' too
}

}  // namespace

GradientImportance gradient_importance(AttentionModel& model, const std::vector<TokenBatch>& batches) {
  static const char* op = "gradient_importance";
  check_batches(batches, op);
  ModelStateGuard guard(model);
  model.train();
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    model.layer(l).set_dropout(0.0f);
    // Michel et al. take the gradient at the model as it is: every gate 1.
    model.layer(l).set_head_gates(std::vector<float>(static_cast<size_t>(model.layer(l).num_heads()), 1.0f));
  }
  GradientImportance out;
  out.raw = zeros_like_layers(model);
  for (const TokenBatch& b : batches)
    for (int64_t r = 0; r < b.batch; ++r) {
      const TokenBatch one = row_of(b, r);
      zero_all_grads(model);
      const Tensor logits = model.forward(one.tokens, 1, one.length, one.valid_lens());
      const CrossEntropy ce = cross_entropy(logits, one.targets);
      if (ce.scored == 0) continue;  // no loss, no gradient: not an example
      model.backward(ce.grad.reshape(logits.shape()));
      for (int64_t l = 0; l < model.num_layers(); ++l) {
        const Tensor& g = model.layer(l).head_gate_grad();
        for (int64_t h = 0; h < g.numel(); ++h) out.raw[l][h] += std::abs(static_cast<double>(g.data()[h]));
      }
      ++out.sequences;
    }
  zero_all_grads(model);
  if (out.sequences == 0) fail(op, "batches: no sequence has a scored position");
  out.normalised = out.raw;
  for (size_t l = 0; l < out.raw.size(); ++l) {
    double norm = 0.0;
    for (double& x : out.raw[l]) {
      x /= static_cast<double>(out.sequences);
      norm += x * x;
    }
    norm = std::sqrt(norm);
    for (size_t h = 0; h < out.raw[l].size(); ++h) out.normalised[l][h] = norm > 0 ? out.raw[l][h] / norm : 0.0;
  }
  return out;
}

Evaluation evaluate(AttentionModel& model, const std::vector<TokenBatch>& batches) {
  check_batches(batches, "evaluate");
  const bool was_training = model.training();
  model.eval();
  double loss_sum = 0.0;
  int64_t correct = 0;
  Evaluation e;
  for (const TokenBatch& b : batches) {
    const Tensor logits = model.forward(b.tokens, b.batch, b.length, b.valid_lens());
    const CrossEntropy ce = cross_entropy(logits, b.targets, /*want_grad=*/false);
    loss_sum += ce.loss * static_cast<double>(ce.scored);
    correct += ce.correct;
    e.scored += ce.scored;
  }
  model.train(was_training);
  if (e.scored > 0) {
    e.loss = loss_sum / static_cast<double>(e.scored);
    e.accuracy = static_cast<double>(correct) / static_cast<double>(e.scored);
  }
  return e;
}

AblationImportance ablation_importance(AttentionModel& model, const std::vector<TokenBatch>& batches) {
  check_batches(batches, "ablation_importance");
  ModelStateGuard guard(model);
  AblationImportance out;
  out.all_heads = evaluate(model, batches);
  out.loss_increase = zeros_like_layers(model);
  out.accuracy_drop = zeros_like_layers(model);
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    MultiHeadAttention& layer = model.layer(l);
    const std::vector<float> gates = layer.head_gates();
    for (int64_t h = 0; h < layer.num_heads(); ++h) {
      std::vector<float> off = gates;
      off[static_cast<size_t>(h)] = 0.0f;
      layer.set_head_gates(off);
      const Evaluation e = evaluate(model, batches);
      out.loss_increase[l][h] = e.loss - out.all_heads.loss;
      out.accuracy_drop[l][h] = out.all_heads.accuracy - e.accuracy;
    }
    layer.set_head_gates(gates);
  }
  return out;
}

AttentionStatistics attention_statistics(AttentionModel& model, const std::vector<TokenBatch>& batches) {
  check_batches(batches, "attention_statistics");
  ModelStateGuard guard(model);
  model.eval();
  AttentionStatistics out;
  out.confidence = zeros_like_layers(model);
  out.entropy = zeros_like_layers(model);
  for (const TokenBatch& b : batches) {
    model.forward(b.tokens, b.batch, b.length, b.valid_lens());
    for (int64_t l = 0; l < model.num_layers(); ++l) {
      const Tensor& w = model.layer(l).attention_weights();  // [B,H,T,T]
      const int64_t H = w.size(1), Q = w.size(2), K = w.size(3);
      for (int64_t r = 0; r < b.batch; ++r) {
        // Queries past the sequence's length are padding: not counted.
        const int64_t valid_q = std::min(Q, static_cast<int64_t>(std::ceil(b.lengths[static_cast<size_t>(r)])));
        for (int64_t h = 0; h < H; ++h)
          for (int64_t q = 0; q < valid_q; ++q) {
            const float* row = w.data() + ((r * H + h) * Q + q) * K;
            double top = 0.0, entropy = 0.0;
            for (int64_t k = 0; k < K; ++k) {
              const double p = row[k];
              top = std::max(top, p);
              if (p > 0) entropy -= p * std::log(p);
            }
            out.confidence[l][h] += top;
            out.entropy[l][h] += entropy;
          }
      }
    }
    for (int64_t r = 0; r < b.batch; ++r)
      out.queries += std::min(b.length, static_cast<int64_t>(std::ceil(b.lengths[static_cast<size_t>(r)])));
  }
  for (size_t l = 0; l < out.confidence.size(); ++l)
    for (size_t h = 0; h < out.confidence[l].size(); ++h) {
      out.confidence[l][h] /= static_cast<double>(std::max<int64_t>(out.queries, 1));
      out.entropy[l][h] /= static_cast<double>(std::max<int64_t>(out.queries, 1));
    }
  return out;
}

}  // namespace mha
