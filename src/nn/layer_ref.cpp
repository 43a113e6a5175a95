// One layer's parameters as a call reads them (nn/layer_ref.h).
#include "nn/layer_ref.h"

#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"

namespace mha::nn {

std::shared_ptr<const cpu::PackedWeight> WeightPacks::get(int slot, uint64_t version, const float* W, int64_t N,
                                                          int64_t K, Precision precision) {
  if (version == 0) return cpu::pack_weight(W, N, K, precision);  // a call's own weights: not kept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& e : entries_)
      if (e.slot == slot && e.precision == precision && e.packed->version == version && e.packed->N == N &&
          e.packed->K == K && e.packed->current())
        return e.packed;
  }
  // Packed outside the lock: two calls that find it stale at once both pack
  // (the same values) and the later store wins, as LazyLinear::packed_weight.
  std::shared_ptr<cpu::PackedWeight> fresh = cpu::pack_weight(W, N, K, precision);
  fresh->version = version;
  std::lock_guard<std::mutex> lock(mutex_);
  for (Entry& e : entries_)
    if (e.slot == slot && e.precision == precision) {
      e.packed = fresh;
      return fresh;
    }
  entries_.push_back({slot, precision, fresh});
  return fresh;
}

void WeightPacks::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
}

LayerRef::LayerRef(const LazyLinear* layer)
    : weight_(layer->initialized() ? layer->weight().data() : nullptr),
      bias_(layer->has_bias() && layer->initialized() ? layer->bias().data() : nullptr),
      out_(layer->out_features()),
      in_(layer->in_features()),
      layer_(layer) {}

LayerRef::LayerRef(const float* weight, const float* bias, int64_t out, int64_t in, WeightPacks* packs, int slot,
                   uint64_t version)
    : weight_(weight), bias_(bias), out_(out), in_(in), packs_(packs), slot_(slot), version_(version) {}

std::shared_ptr<const cpu::PackedWeight> LayerRef::packed_weight(Precision precision) const {
  if (layer_) return layer_->packed_weight(precision);
  if (packs_) return packs_->get(slot_, version_, weight_, out_, in_, precision);
  return cpu::pack_weight(weight_, out_, in_, precision);
}

void LayerRef::forward_rows(const float* x, int64_t rows, float* y, int64_t ldy, Precision precision,
                            bool few_rows_as_dots) const {
  if (few_rows_as_dots && cpu::dot_products_serve(rows, precision)) {
    cpu::GemmBatch batch(precision);
    batch.add_dot_products(rows, x, in_, weight_, out_, in_, bias_, y, ldy);
    batch.run();
    return;
  }
  if (layer_) return layer_->forward_rows(x, rows, y, ldy, precision);
  const std::shared_ptr<const cpu::PackedWeight> w = packed_weight(precision);
  cpu::GemmBatch batch(precision);
  batch.add_packed(rows, x, in_, *w, bias_, y, ldy);
  batch.run();
}

}  // namespace mha::nn
