// src/cpu/fused/fused_job.h: what the dispatcher (attention_fused.cpp) hands
// the kernel of one instruction set, and the table each such kernel exports.
//
// Plain data only: this header is included before the `#pragma GCC target`
// regions of the ISA files, so nothing in it is compiled for a wider target.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention_backward.h"
#include "kernels/attention_params.h"

namespace mha::kernels::fused {

// One forward call. Chunk c is (b, head, query tile) = c / (H*q_tiles), ...
struct ForwardJob {
  const AttentionForward* p = nullptr;
  const int32_t* n_valid = nullptr;  // [B,Q]: #{k < K : float(k) < length(b, q)}
  float* row_max2 = nullptr;         // [B,h,Q] or null
  float* row_sum = nullptr;          // [B,h,Q] or null
  float c2 = 0.0f;                   // log2(e) / scale_divisor
  int64_t q_tiles = 0;               // ceil(Q / query tile)
  const int64_t* kv_rows = nullptr;  // [B]: max over q of n_valid, the key rows read (K where read_all)
  int64_t pack_rows = 0;             // max over b of kv_rows
  const uint8_t* read_all = nullptr; // [B] or null: read every key of these rows
};

// One weights request. Chunk c is (pair, query tile); pair = (row i, head j)
// of the request, writing out[(i*n_heads + j), Q, K].
struct WeightsJob {
  TensorView q, k;                   // [B,h,Q,d], [B,h,K,d]
  const int32_t* n_valid = nullptr;  // [B,Q]
  const float* row_max2 = nullptr;   // [B,h,Q]
  const float* row_sum = nullptr;    // [B,h,Q]
  float c2 = 0.0f;
  const int64_t* batch_rows = nullptr;
  const int64_t* heads = nullptr;
  int64_t n_rows = 0, n_heads = 0;
  float* out = nullptr;              // [n_rows, n_heads, Q, K]
  int64_t q_tiles = 0;
  const int64_t* kv_rows = nullptr;  // [B], as in ForwardJob
  int64_t pack_rows = 0;
};

// One backward call. Chunk c is (b, head) = (c / H, c % H).
struct BackwardJob {
  const AttentionBackward* p = nullptr;
  const int32_t* n_valid = nullptr;   // [B,Q]
  const float* row_max2 = nullptr;    // [B,h,Q] from the fused forward
  const float* row_sum = nullptr;     // [B,h,Q]
  float c2 = 0.0f;                    // log2(e) / scale_divisor
  const int64_t* kv_rows = nullptr;   // [B]: key rows with any live key
  int64_t pack_rows = 0;              // max over b of kv_rows
};

// The entry points of one instruction set's kernel (fused_<isa>.cpp).
struct IsaKernels {
  const char* name;
  int64_t query_tile;  // queries per chunk
  // Per-thread scratch for head widths d, dv and `rows` packed key rows; its
  // first 64 bytes must be zero before a thread's first chunk.
  size_t (*scratch_floats)(int64_t d, int64_t dv, int64_t rows);
  void (*forward_chunk)(const ForwardJob& job, int64_t chunk, float* scratch);
  void (*weights_chunk)(const WeightsJob& job, int64_t chunk, float* scratch);
  size_t (*backward_scratch_floats)(int64_t Q, int64_t d, int64_t dv, int64_t rows);
  void (*backward_chunk)(const BackwardJob& job, int64_t chunk, float* scratch);
};

extern const IsaKernels kScalarKernels;
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;

}  // namespace mha::kernels::fused
