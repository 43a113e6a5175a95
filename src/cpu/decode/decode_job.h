// src/cpu/decode/decode_job.h: what the decode dispatcher (decode.cpp) hands
// each instruction set's chunk kernel (decode_impl.h), and the table of
// entry points one instruction set exports.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/params.h"

namespace mha::kernels::decode {

// One task: keys [chunk * chunk_keys, min(K, (chunk + 1) * chunk_keys)) of
// cache head g of batch row b, for the group()*Qn query rows reading it
// (row r = (query head within the group) * Qn + query index).
struct Task {
  int64_t b, g, chunk;
};

struct DecodeJob {
  const DecodeParams* p = nullptr;
  int64_t chunk_keys = 0;
  float c2 = 0.0f;  // log2(e) / scale_divisor: scores in base 2
  // Per task, rows() x partial_stride() floats: for each row the running
  // max (base 2), the sum of 2^(score - max), then the dv weighted values.
  float* partials = nullptr;

  int64_t rows() const { return p->group() * p->Qn; }
  int64_t partial_stride() const { return p->dv + 2; }
};

struct DecodeIsaKernels {
  const char* name;
  size_t (*scratch_floats)(const DecodeParams& p);
  void (*chunk)(const DecodeJob& job, const Task& task, float* partial, float* scratch);
};

extern const DecodeIsaKernels kAvx512Decode;
extern const DecodeIsaKernels kAvx2Decode;
extern const DecodeIsaKernels kScalarDecode;

}  // namespace mha::kernels::decode
