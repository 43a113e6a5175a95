#include "mha/task.h"

#include <algorithm>

#include "core/memory.h"
#include "mha/error.h"

namespace mha {

OffsetPairTask::OffsetPairTask(const OffsetPairTaskConfig& c) : config_(c) {
  static const char* op = "OffsetPairTask";
  // 256 symbols already make 65536 classes; more is surely a mistake.
  if (c.vocab < 2 || c.vocab > 256) fail(op, "vocab: ", c.vocab, " is not in [2, 256]");
  if (c.near < 1) fail(op, "near: ", c.near, " is not >= 1");
  if (c.far <= c.near) fail(op, "far: ", c.far, " is not greater than near ", c.near);
  if (c.min_len <= c.far)
    fail(op, "min_len: ", c.min_len, " is not greater than far ", c.far,
         " (a sequence that short has no target)");
  if (c.max_len < c.min_len) fail(op, "max_len: ", c.max_len, " is below min_len ", c.min_len);
}

TokenBatch OffsetPairTask::sample(int64_t batch_size, Generator& gen) const {
  if (batch_size <= 0) fail("OffsetPairTask.sample", "batch_size: ", batch_size, " is not positive");
  const OffsetPairTaskConfig& c = config_;
  // Lengths, tokens and targets: planned before they are allocated.
  core::MemoryPlan("OffsetPairTask.sample")
      .add("batch (batch_size x max_len tokens and targets, and lengths)", {batch_size, c.max_len + 1}, 8)
      .check();
  TokenBatch out;
  out.batch = batch_size;
  out.lengths.resize(static_cast<size_t>(batch_size));
  int64_t longest = 0;
  for (float& len : out.lengths) {
    const int64_t n = c.min_len + static_cast<int64_t>(gen.below(static_cast<uint64_t>(c.max_len - c.min_len + 1)));
    len = static_cast<float>(n);
    longest = std::max(longest, n);
  }
  const int64_t T = out.length = longest;
  out.tokens.assign(static_cast<size_t>(batch_size * T), pad_token());
  out.targets.assign(static_cast<size_t>(batch_size * T), kIgnore);
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t n = static_cast<int64_t>(out.lengths[b]);
    int32_t* tok = out.tokens.data() + b * T;
    for (int64_t t = 0; t < n; ++t) tok[t] = static_cast<int32_t>(gen.below(static_cast<uint64_t>(c.vocab)));
    for (int64_t t = c.far; t < n; ++t) out.targets[b * T + t] = target_of(tok[t - c.near], tok[t - c.far]);
  }
  return out;
}

}  // namespace mha
