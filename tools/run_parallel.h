// tools/run_parallel.h: `mha run --parallel heads|sequence|grid`, the same
// evaluation over the ranks of an MPI run (mha::dist).
//
//   mpirun -np 4 mha run --parallel grid --weights w.safetensors --inputs i.safetensors --out o.safetensors
//
// Every rank reads the weights and inputs files; rank 0 writes the output
// file, the same tensors and metadata as `mha run` (within 1e-5 relative).
// Built only with mha::dist (MHA_BUILD_DIST); without it --parallel is an
// error that says so.
#pragma once

#include <cstdint>
#include <string>

#include "mha/masks.h"
#include "mha/precision.h"

namespace mha::tools {

// How `mha run` splits its work over the ranks.
enum class Parallel {
  None,      // one process (no MPI)
  Heads,     // HeadParallelAttention: heads over the ranks, every rank the whole sequence
  Sequence,  // RingAttention: queries and keys in blocks over the ranks
  Grid,      // GridAttention: head groups x sequence blocks
};

struct ParallelRun {
  std::string weights, inputs, out;
  int64_t heads = 0;        // --heads (0: the weights file's record)
  Parallel mode = Parallel::None;
  int head_groups = 0;      // --head-groups for Grid (0: chosen from the ranks)
  Precision precision = Precision::Float32;  // --precision, on every rank
  CallMasks masks;          // --causal, --window (over global positions)
};

// Runs the evaluation over MPI's ranks (P = 1 without mpirun) and writes the
// output on rank 0. Throws mha::Error naming "run" (on every rank).
void run_parallel(const ParallelRun& run);

}  // namespace mha::tools
