#include "mha/linear.h"

#include <atomic>
#include <cmath>

#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/error.h"

namespace mha {

uint64_t ParamVersion::next() {
  static std::atomic<uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

LazyLinear::LazyLinear(int64_t out_features, bool bias)
    : out_features_(out_features), has_bias_(bias) {
  if (out_features <= 0)
    fail("LazyLinear", "out_features: ", out_features, " is not a positive width");
}

void LazyLinear::initialize(int64_t in_features, Generator& gen, const char* op) {
  if (in_features <= 0) fail(op, "input width ", in_features, " is not positive");
  if (initialized()) {
    if (in_features != in_features_)
      fail(op, "input width ", in_features, " differs from the width ", in_features_,
           " this layer was initialised with");
    return;
  }
  // PyTorch: kaiming_uniform_(a=sqrt(5)) for the weight, which is
  // U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  Tensor w({out_features_, in_features});
  for (float& x : w.values()) x = gen.uniform(-bound, bound);
  Tensor b;
  if (has_bias_) {
    b = Tensor({out_features_});
    for (float& x : b.values()) x = gen.uniform(-bound, bound);
  }
  weight_ = std::move(w);
  bias_ = std::move(b);
  in_features_ = in_features;
  version_.bump();
}

Tensor LazyLinear::forward(const Tensor& x, Generator& gen, const char* op) {
  if (x.dim() < 1) fail(op, "input: a scalar has no feature axis");
  const int64_t in = x.size(-1);
  initialize(in, gen, op);
  Shape out_shape = x.shape();
  out_shape.back() = out_features_;
  Tensor y(out_shape);
  forward_rows(x.data(), x.numel() / in, y.data(), out_features_);
  return y;
}

void LazyLinear::forward_rows(const float* x, int64_t rows, float* y, int64_t ldy, Precision precision) const {
  // y = b + x W^T, as PyTorch's addmm: W is (out, in) row-major, so
  // op(B) = W^T. Row blocks fixed by the shape: the same result at any
  // thread count (cpu/gemm/parallel_gemm.h).
  const std::shared_ptr<const cpu::PackedWeight> w = packed_weight(precision);
  cpu::GemmBatch batch(precision);
  batch.add_packed(rows, x, in_features_, *w, has_bias_ ? bias_.data() : nullptr, y, ldy);
  batch.run();
}

std::shared_ptr<const cpu::PackedWeight> LazyLinear::packed_weight(Precision precision) const {
  detail::Latest<const cpu::PackedWeight>& slot = packed_[precision == Precision::BFloat16 ? 1 : 0];
  const uint64_t version = version_.get();
  std::shared_ptr<const cpu::PackedWeight> p = slot.load();
  if (p && p->version == version && p->current()) return p;
  // Two calls that find it stale at once both pack (the same values); the
  // later store wins and both results are right.
  std::shared_ptr<cpu::PackedWeight> fresh = cpu::pack_weight(weight_.data(), out_features_, in_features_, precision);
  fresh->version = version;
  slot.store(fresh);
  return fresh;
}

void LazyLinear::set_weight(const Tensor& w, const char* op) {
  if (w.dim() != 2 || w.size(0) != out_features_ || w.size(1) <= 0)
    fail(op, "weight: shape ", shape_str(w.shape()), " is not (", out_features_, ", in)");
  if (initialized() && w.size(1) != in_features_)
    fail(op, "weight: shape ", shape_str(w.shape()), " differs from the initialised ",
         shape_str({out_features_, in_features_}));
  weight_ = w;
  in_features_ = w.size(1);
  if (has_bias_ && bias_.empty()) bias_ = Tensor({out_features_});
  version_.bump();
}

void LazyLinear::set_bias(const Tensor& b, const char* op) {
  if (!has_bias_) fail(op, "bias: this layer was built without a bias");
  if (b.dim() != 1 || b.size(0) != out_features_)
    fail(op, "bias: shape ", shape_str(b.shape()), " is not ", shape_str({out_features_}));
  bias_ = b;
  version_.bump();
}

}  // namespace mha
