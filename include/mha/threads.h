// mha/threads.h: how many threads mha computes with.
//
// mha computes on OpenMP threads: attention in chunks of (batch, head, query
// tile), matrix products in row blocks, each block one single-threaded
// OpenBLAS call (OpenBLAS's own pool is held at one thread meanwhile, so two
// pools never compete for the cores). Tiles and blocks depend on the shapes
// only, so results are bitwise the same at any thread count.
//
//   mha::set_num_threads(1);   // e.g. to run several modules side by side
#pragma once

namespace mha {

// n >= 1; throws mha::Error otherwise.
void set_num_threads(int n);
// The current setting; by default OpenMP's (OMP_NUM_THREADS, else the cores).
int num_threads();

}  // namespace mha
