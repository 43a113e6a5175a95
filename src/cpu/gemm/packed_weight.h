// src/cpu/gemm/packed_weight.h: a layer's weight packed once for the products
// that read it, and reused by every call until the weight changes.
//
// A projection y = x W^T + b multiplies by op(B) = W^T. The products pack
// op(B) into their micro-kernel's panel layout (float32, cpu/gemm/gemm.h) or
// round it into AMX tiles (bfloat16, cpu/gemm/gemm_amx.h) before they run;
// done per call, that is a copy of every weight per call (for a 768 x 768
// weight ~0.2 ms in bfloat16, ~1-3% of a B8 L512 forward, and most of a
// few-row call in bfloat16). Inference engines pack weights once (MLAS's
// packed B, oneDNN's weight reorder); so does mha: LazyLinear keeps the
// packing of its current weight version (mha/parameter.h ParamVersion) and
// GemmBatch::add_packed runs products against it.
//
//   std::shared_ptr<const PackedWeight> w = pack_weight(W, N, K, Precision::BFloat16);
//   GemmBatch batch(Precision::BFloat16);
//   batch.add_packed(M, x, K, *w, bias, y, N);   // y:[M,N] = x:[M,K] W^T + bias
//   batch.run();
//
// The packed product gives the same bits as the per-call packing or the
// unpacked path (cpu/gemm/parallel_gemm.h), so reuse never changes a result.
#pragma once

#include <cstdint>
#include <memory>

#include "cpu/gemm/gemm.h"
#include "cpu/gemm/gemm_amx.h"
#include "mha/precision.h"

namespace mha::cpu {

// op(B) = W^T for W:[N,K] (row-major, rows K floats apart), packed for the
// products of one precision on this machine's current kernels.
struct PackedWeight {
  Precision precision = Precision::Float32;
  int64_t N = 0, K = 0;
  // Float32: the weight in the float32 micro-kernel's panels. BFloat16
  // without AMX: the weight rounded to bfloat16, in the same panels (the
  // portable bfloat16 product is the float32 one on rounded values).
  std::unique_ptr<PackedB> panels;
  // BFloat16 with AMX: the weight rounded into tiles.
  std::unique_ptr<PackedBf16B> tiles;
  // The version of the weight it was made from (mha::ParamVersion), set by
  // its owner.
  uint64_t version = 0;

  // True while the kernels it was packed for are the ones in use (a test
  // may switch the float32 ISA or AMX off; the packing is then remade).
  bool current() const;
  // Bytes held.
  int64_t bytes() const;
};

// Packs W:[N,K] for `precision` on mha's threads (on the calling thread
// alone inside a parallel region). N, K > 0.
std::shared_ptr<PackedWeight> pack_weight(const float* W, int64_t N, int64_t K, Precision precision);

// How many packings pack_weight has made in this process (for the tests
// that hold a layer to packing once per weight version).
int64_t packed_weight_count();

}  // namespace mha::cpu
