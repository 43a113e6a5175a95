#include "mha/loss.h"

#include <cmath>

#include "mha/error.h"

namespace mha {

CrossEntropy cross_entropy(const Tensor& logits, const std::vector<int32_t>& targets, bool want_grad) {
  static const char* op = "cross_entropy";
  if (logits.dim() < 1 || logits.size(-1) <= 0)
    fail(op, "logits: shape ", shape_str(logits.shape()), " has no class axis");
  const int64_t C = logits.size(-1), N = logits.numel() / C;
  if (static_cast<int64_t>(targets.size()) != N)
    fail(op, "targets: ", targets.size(), " entries for ", N, " rows of logits ", shape_str(logits.shape()));
  for (size_t i = 0; i < targets.size(); ++i)
    if (targets[i] != kIgnore && (targets[i] < 0 || targets[i] >= C))
      fail(op, "targets: entry ", i, " is ", targets[i], ", not a class in [0, ", C, ") or ", kIgnore);
  CrossEntropy r;
  for (int32_t t : targets) r.scored += t != kIgnore;
  if (want_grad) r.grad = Tensor({N, C});
  double total = 0.0;
  const float* x = logits.data();
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (t == kIgnore) continue;
    const float* row = x + n * C;
    // log-sum-exp with the row's maximum taken out.
    float mx = row[0];
    int64_t arg = 0;
    for (int64_t c = 1; c < C; ++c)
      if (row[c] > mx) mx = row[c], arg = c;
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(static_cast<double>(row[c]) - mx);
    const double lse = mx + std::log(sum);
    total += lse - row[t];
    r.correct += arg == t;
    if (want_grad) {
      // d mean / d logit = (softmax - onehot) / scored.
      float* g = r.grad.data() + n * C;
      const double inv = 1.0 / static_cast<double>(r.scored);
      for (int64_t c = 0; c < C; ++c)
        g[c] = static_cast<float>((std::exp(static_cast<double>(row[c]) - lse) - (c == t)) * inv);
    }
  }
  r.loss = r.scored ? total / static_cast<double>(r.scored) : 0.0;
  return r;
}

}  // namespace mha
