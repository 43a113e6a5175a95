// mha/task.h: a synthetic task whose heads must attend at two ranges.
//
// A sequence of random symbols 0..vocab-1; the target at position t is the
// pair (token[t - near], token[t - far]) as one class:
//   target[t] = token[t - near] * vocab + token[t - far]     for t >= far,
// and no target (kIgnore) for t < far. With near small and far large, a
// model must look both a short and a long way back, so its heads specialise:
// some attend at offset `near`, others at offset `far`. A linear read-out can
// name the pair from the two heads' outputs, so one attention layer suffices.
//
// Sequences have lengths drawn uniformly from [min_len, max_len]; a batch is
// padded to its longest sequence with the padding token `vocab` and
// described by valid_lens (B,) = the lengths, so padded keys are masked and
// padded positions have no target.
//
//   mha::OffsetPairTask task({.vocab = 8, .near = 1, .far = 10});
//   mha::Generator gen(0);
//   mha::TokenBatch batch = task.sample(32, gen);   // tokens [32, T], T <= max_len
#pragma once

#include <cstdint>
#include <vector>

#include "mha/random.h"
#include "mha/valid_lens.h"

namespace mha {

// The target of a position that is not scored (PyTorch's ignore_index default).
inline constexpr int32_t kIgnore = -100;

// A batch of token sequences with per-position targets.
struct TokenBatch {
  int64_t batch = 0;             // B
  int64_t length = 0;            // T, the longest sequence in the batch
  std::vector<int32_t> tokens;   // [B,T] row-major, padding past each length
  std::vector<int32_t> targets;  // [B,T], kIgnore where nothing is scored
  std::vector<float> lengths;    // [B]
  // The lengths as valid_lens (B,), for the model's forward.
  ValidLens valid_lens() const { return ValidLens::per_batch(lengths); }
};

// The task's alphabet, its two offsets and the range of sequence lengths.
struct OffsetPairTaskConfig {
  int64_t vocab = 8;     // symbols 0..vocab-1; token `vocab` pads
  int64_t near = 1;      // the short range, >= 1
  int64_t far = 10;      // the long range, > near
  int64_t min_len = 12;  // > far, so every sequence has a target
  int64_t max_len = 32;  // >= min_len
};

// The offset-pair task: draws batches of sequences with their targets.
class OffsetPairTask {
 public:
  // Throws mha::Error unless 2 <= vocab <= 256, 1 <= near < far < min_len <= max_len.
  explicit OffsetPairTask(const OffsetPairTaskConfig& config);

  // The config it was built with.
  const OffsetPairTaskConfig& config() const { return config_; }
  int64_t input_vocab() const { return config_.vocab + 1; }  // symbols and padding
  // Classes of the targets: one per (near, far) pair of symbols, vocab^2.
  int64_t num_classes() const { return config_.vocab * config_.vocab; }
  // The token that pads a sequence past its length: vocab.
  int32_t pad_token() const { return static_cast<int32_t>(config_.vocab); }
  // The class of the pair (token[t - near], token[t - far]).
  int32_t target_of(int32_t near_token, int32_t far_token) const {
    return near_token * static_cast<int32_t>(config_.vocab) + far_token;
  }

  // `batch_size` sequences drawn from `gen` (lengths first, then tokens):
  // tokens and targets [batch_size, T], T the longest drawn length. Throws
  // mha::Error unless batch_size > 0.
  TokenBatch sample(int64_t batch_size, Generator& gen) const;

 private:
  OffsetPairTaskConfig config_;
};

}  // namespace mha
