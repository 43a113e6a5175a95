// mha/threads.h: how many threads mha computes with.
//
// mha computes on OpenMP threads: attention in chunks of (batch, head, query
// tile), matrix products in row blocks, each block one single-threaded
// OpenBLAS call. Tiles and blocks depend on the shapes only, so results are
// bitwise the same at any thread count.
//
// For that, mha sets OpenBLAS's own thread count to 1 at its first product
// and leaves it there (OpenBLAS's count is process-wide, and switching it
// back and forth around each call costs ~10 ms once other threads have used
// it). Other OpenBLAS users in the same process (numpy, PyTorch) then run
// their products single-threaded unless they set it again
// (openblas_set_num_threads); mha sets it back to 1 on its next product.
//
//   mha::set_num_threads(1);   // e.g. to run several modules side by side
#pragma once

#include <cstdint>

namespace mha {

// 1 <= n <= max_num_threads(); throws mha::Error otherwise (more threads than
// that only oversubscribe the cores, and tens of thousands exhaust memory).
void set_num_threads(int64_t n);
// The current setting; by default OpenMP's (OMP_NUM_THREADS, else the cores),
// capped at max_num_threads().
int num_threads();
// The most threads mha computes with: 4x the hardware threads the OpenMP
// runtime sees (omp_get_num_procs), at least 4.
int max_num_threads();

}  // namespace mha
