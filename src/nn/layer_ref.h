// src/nn/layer_ref.h: one linear layer's parameters as a call reads them.
//
// The engine (nn/attention_engine.h) multiplies by weights it does not own:
// a module's LazyLinear, or tensors a caller passes with the call (mha.torch
// passes the torch Parameters of each call, so that a replaced, tied or
// rewritten parameter is what the next call reads, with nothing to sync).
//
//   W:[out, in] row-major, b:[out] or null;  y = x W^T + b
//
// The products multiply by W packed once per version (cpu/gemm/packed_weight.h):
// a LazyLinear keeps its own packing; weights passed with a call are packed
// into a WeightPacks cache under the version the caller gives (a number that
// changes whenever the values may have, e.g. mha::ParamVersion), or per call
// when the caller gives no cache.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "mha/linear.h"
#include "mha/precision.h"

namespace mha::cpu {
struct PackedWeight;
}

namespace mha::nn {

// Packings of weights passed with calls, by slot (one per weight a caller
// passes, e.g. 0..3 for W_q, W_k, W_v, W_o) and precision, each valid for the
// version it was made from. Calls may use one cache from many threads.
class WeightPacks {
 public:
  // W:[N,K] packed for `precision`: the cached packing when slot's is of
  // `version` and still current, else a new one (which replaces it).
  // Version 0 means "this call's weights alone": packed, never kept.
  std::shared_ptr<const cpu::PackedWeight> get(int slot, uint64_t version, const float* W, int64_t N, int64_t K,
                                               Precision precision);
  // Forgets every packing (the next call packs again).
  void clear();

 private:
  struct Entry {
    int slot = 0;
    Precision precision = Precision::Float32;
    std::shared_ptr<const cpu::PackedWeight> packed;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

// A layer's parameters for one call (see the file comment).
class LayerRef {
 public:
  LayerRef() = default;
  // A module's layer (must outlive the call); its packing is its own.
  LayerRef(const LazyLinear* layer);  // NOLINT: implicit, as the modules name their layers
  // Weights passed with a call: W:[out, in], bias:[out] or null, packed into
  // `packs` under (slot, version), or per call when packs is null.
  LayerRef(const float* weight, const float* bias, int64_t out, int64_t in, WeightPacks* packs = nullptr,
           int slot = 0, uint64_t version = 0);

  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  bool initialized() const { return weight_ != nullptr; }
  bool has_bias() const { return bias_ != nullptr; }
  const float* weight() const { return weight_; }  // [out, in]
  const float* bias() const { return bias_; }      // [out] or null
  int64_t weight_numel() const { return out_ * in_; }

  // The weight packed for `precision` (see the file comment).
  std::shared_ptr<const cpu::PackedWeight> packed_weight(Precision precision) const;
  // x:[rows, in] (row stride in) -> y:[rows, out] (row stride ldy): x W^T + b.
  // few_rows_as_dots: a decode step's product (ProjectionShape's field).
  void forward_rows(const float* x, int64_t rows, float* y, int64_t ldy, Precision precision,
                    bool few_rows_as_dots = false) const;

 private:
  const float* weight_ = nullptr;
  const float* bias_ = nullptr;
  int64_t out_ = 0, in_ = 0;
  const LazyLinear* layer_ = nullptr;
  WeightPacks* packs_ = nullptr;
  int slot_ = 0;
  uint64_t version_ = 0;
};

}  // namespace mha::nn
