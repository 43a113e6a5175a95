// src/core/parallel.h: a loop on mha's threads that costs nothing extra when
// it runs on one.
//
// libgomp ends every parallel region with a futex wake, a system call, even
// a region that `if (false)` keeps on the calling thread: ~0.5 us each,
// measured over a loop of such one-thread regions (more on a loaded
// machine). The d2l chapter's toy call entered nine of them. parallel_for
// enters a region only for two threads or more.
#pragma once

#include <cstdint>

namespace mha::core {

// body(i) for i in [0, n): schedule(dynamic, 1) on `threads` OpenMP threads,
// or a plain loop on the calling thread when threads <= 1 or n <= 1.
template <class Body>
void parallel_for(int64_t n, int threads, const Body& body) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace mha::core
