// mha/valid_lens.h: the d2l chapter's valid_lens, as a value type.
//
// The d2l chapter accepts valid_lens as None, a (B,) tensor (one length per batch
// row, shared by all of that row's queries) or a (B, Q) tensor (one length per
// query). Query q of row b may attend to key k only if float(k) < length, so a
// fractional length 2.5 keeps keys 0, 1 and 2, a length >= K masks nothing and
// a length of 0 masks every key (which, with the d2l chapter's -1e6 fill, gives
// uniform weights over all K keys). Lengths are stored as float32, which is
// what PyTorch compares them in.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/tensor.h"

namespace mha {

// Which keys each query may attend to: none (all), one length per batch row,
// or one length per query. A value type; cheap to copy for small batches.
class ValidLens {
 public:
  // The three forms the d2l chapter accepts.
  enum class Kind {
    None,      // no masking: valid_lens=None
    PerBatch,  // lens:[B], shared by every query of a row
    PerQuery,  // lens:[B,Q], one length per query
  };

  // No masking.
  ValidLens() = default;
  // No masking (the d2l chapter's valid_lens=None).
  static ValidLens none() { return {}; }
  // lens:[B]: every query of row b sees keys k < lens[b].
  static ValidLens per_batch(std::vector<float> lens);
  // lens:[B,Q] row-major: query q of row b sees keys k < lens[b*Q + q].
  // Throws mha::Error when lens.size() != batch * queries or a count is
  // negative.
  static ValidLens per_query(int64_t batch, int64_t queries, std::vector<float> lens);
  // A (B,) or (B, Q) tensor; any other rank throws mha::Error naming the
  // shape seen.
  static ValidLens from_tensor(const Tensor& lens);

  // Which of the three forms this is.
  Kind kind() const { return kind_; }
  // True when nothing is masked.
  bool is_none() const { return kind_ == Kind::None; }
  // (B,) or (B, Q); empty for Kind::None.
  const Shape& shape() const { return shape_; }
  // The lengths, row-major; empty for Kind::None.
  const std::vector<float>& values() const { return lens_; }
  // The lengths, row-major; nullptr when there are none.
  const float* data() const { return lens_.empty() ? nullptr : lens_.data(); }

  // The length seen by query q of batch row b (+infinity when there is none).
  // Indices are not checked: call check() first.
  float at(int64_t b, int64_t q) const;

  // Throws mha::Error naming `op` unless the shape fits a call with `batch`
  // rows and `queries` queries, and every length is a number >= 0 (NaN and
  // negative lengths are errors; +infinity masks nothing).
  void check(const char* op, int64_t batch, int64_t queries) const;

 private:
  Kind kind_ = Kind::None;
  Shape shape_;
  std::vector<float> lens_;
};

}  // namespace mha
