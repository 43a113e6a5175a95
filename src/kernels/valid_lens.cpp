// mha::ValidLens (mha/valid_lens.h): the d2l chapter's valid lengths, checked per call.
#include "mha/valid_lens.h"

#include <cmath>
#include <limits>
#include <utility>

#include "mha/error.h"

namespace mha {

ValidLens ValidLens::per_batch(std::vector<float> lens) {
  ValidLens v;
  v.kind_ = Kind::PerBatch;
  v.shape_ = {static_cast<int64_t>(lens.size())};
  v.lens_ = std::move(lens);
  return v;
}

ValidLens ValidLens::per_query(int64_t batch, int64_t queries, std::vector<float> lens) {
  int64_t count = 0;  // batch * queries, which a hostile caller could overflow
  if (batch < 0 || queries < 0 || __builtin_mul_overflow(batch, queries, &count) ||
      static_cast<int64_t>(lens.size()) != count)
    fail("ValidLens.per_query", "lens: ", lens.size(), " values given for shape ",
         shape_str({batch, queries}));
  ValidLens v;
  v.kind_ = Kind::PerQuery;
  v.shape_ = {batch, queries};
  v.lens_ = std::move(lens);
  return v;
}

ValidLens ValidLens::from_tensor(const Tensor& lens) {
  if (lens.dim() == 1) return per_batch(lens.values());
  if (lens.dim() == 2) return per_query(lens.size(0), lens.size(1), lens.values());
  fail("ValidLens", "valid_lens: shape ", shape_str(lens.shape()),
       " is neither (B,) nor (B, Q)");
}

float ValidLens::at(int64_t b, int64_t q) const {
  switch (kind_) {
    case Kind::None: return std::numeric_limits<float>::infinity();
    case Kind::PerBatch: return lens_[static_cast<size_t>(b)];
    case Kind::PerQuery: return lens_[static_cast<size_t>(b * shape_[1] + q)];
  }
  return 0.0f;
}

void ValidLens::check(const char* op, int64_t batch, int64_t queries) const {
  if (kind_ == Kind::None) return;
  if (kind_ == Kind::PerBatch && shape_[0] != batch)
    fail(op, "valid_lens: shape ", shape_str(shape_), " does not match the batch; wanted ",
         shape_str({batch}), " or ", shape_str({batch, queries}));
  if (kind_ == Kind::PerQuery && (shape_[0] != batch || shape_[1] != queries))
    fail(op, "valid_lens: shape ", shape_str(shape_), " does not match; wanted ",
         shape_str({batch}), " or ", shape_str({batch, queries}));
  for (size_t i = 0; i < lens_.size(); ++i) {
    const float x = lens_[i];
    if (std::isnan(x)) fail(op, "valid_lens: entry ", i, " is NaN; lengths must be numbers >= 0");
    if (x < 0) fail(op, "valid_lens: entry ", i, " is ", x, "; lengths must be >= 0");
  }
}

}  // namespace mha
