// mha/dist.h: attention over several processes (MPI), the optional mha::dist
// component (CMake target mha::dist, built when MPI is found; see
// MHA_BUILD_DIST).
//
//   mha/dist/environment.h    MPI's lifetime (Environment)
//   mha/dist/communicator.h   ranks, all-reduce, send and receive (Communicator)
//   mha/dist/head_parallel.h  the chapter's module split by heads (HeadParallelAttention)
//   mha/dist/ring_attention.h the chapter's module split along the sequence (RingAttention)
//   mha/dist/grid_attention.h both at once, over a heads x sequence grid of ranks (GridAttention)
#pragma once

#include "mha/dist/communicator.h"
#include "mha/dist/environment.h"
#include "mha/dist/grid_attention.h"
#include "mha/dist/head_parallel.h"
#include "mha/dist/ring_attention.h"
