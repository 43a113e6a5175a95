// mha/loss.h: cross-entropy over class logits, with ignored rows.
//
// As torch.nn.functional.cross_entropy(logits, targets, ignore_index=kIgnore,
// reduction='mean'): the mean over scored rows of -log softmax(logits)[target].
#pragma once

#include <cstdint>
#include <vector>

#include "mha/task.h"
#include "mha/tensor.h"

namespace mha {

// The result of cross_entropy(): the mean loss, the counts of scored and
// correctly predicted rows, and the gradient.
struct CrossEntropy {
  double loss = 0.0;    // mean over scored rows; 0 when there are none (PyTorch gives NaN)
  int64_t scored = 0;   // rows whose target is not kIgnore
  int64_t correct = 0;  // scored rows whose largest logit is the target's (first on ties)
  Tensor grad;          // [N,C] d loss / d logits (empty unless asked for); 0 on ignored rows
};

// logits:[..., C] (N rows of C), targets:[N] in [0, C) or kIgnore -> loss,
// counts and, when want_grad, the gradient of the mean loss. Throws
// mha::Error for logits without a class axis, a target count other than N,
// or a target outside [0, C) that is not kIgnore.
CrossEntropy cross_entropy(const Tensor& logits, const std::vector<int32_t>& targets,
                           bool want_grad = true);

}  // namespace mha
