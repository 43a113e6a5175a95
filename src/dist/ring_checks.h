// src/dist/ring_checks.h: what a RingAttention forward checks on every rank
// before it allocates (the arguments, that the ranks agree, the memory it
// plans), in the ring's words; every rank fails together (dist/agree.h).
#pragma once

#include <cstdint>
#include <vector>

#include "mha/dist/communicator.h"
#include "mha/masks.h"
#include "mha/multihead.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha::dist {

// The module the call runs on.
struct RingModule {
  const StateDict* params;  // this ring's heads' weights
  int64_t module_heads, heads, head_dim, num_hiddens;
  bool training, keep_weights;
};

// One forward's arguments (RingAttention::forward's, by address).
struct RingArgs {
  const Tensor *queries, *keys, *values;
  const ValidLens* valid_lens;
  const CallMasks* masks;
  const std::vector<float>* given_sinks;
  const std::vector<int64_t>* doc_offsets;
};

// Every rank's query and key block sizes, and the keys' total.
struct RingLayout {
  std::vector<int64_t> q_sizes, k_sizes;
  int64_t K = 0;
};

// Throws mha::Error (on every rank) for a bad call; sets *planned_bytes.
// Collective.
RingLayout check_ring_forward(const Communicator& c, const char* op, const RingModule& m, const RingArgs& a,
                              uint64_t* planned_bytes);

}  // namespace mha::dist
