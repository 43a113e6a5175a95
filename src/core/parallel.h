// src/core/parallel.h: every parallel loop in mha, with the one rule for
// when a loop is worth a team of threads.
//
// libgomp ends every parallel region with a futex wake, a system call, even
// a region that `if (false)` keeps on the calling thread: ~0.5 us each,
// measured over a loop of such one-thread regions (more on a loaded
// machine). The d2l chapter's toy call entered nine of them. parallel_for
// enters a region only for two threads or more.
//
// Bits never depend on the thread count: callers split their work into
// tasks whose boundaries are fixed by the shapes alone, and each task's
// output is written by the one thread that runs it.
#pragma once

#include <omp.h>

#include <cstdint>

#include "mha/threads.h"

namespace mha::core {

// Below this much work (multiply-adds, or elements touched by a loop body
// of a few operations) a loop runs on the calling thread: waking a team
// costs a few microseconds, more than such a loop takes (the d2l chapter's
// toy shape is ~5e3).
constexpr double kMinParallelWork = 2e5;

inline bool worth_a_team(double work) { return work >= kMinParallelWork; }

// The threads for `tasks` tasks holding `work` in all: mha's threads when
// the work is worth a team and there is more than one task, else one.
inline int team_for(double work, int64_t tasks) {
  return worth_a_team(work) && tasks > 1 ? num_threads() : 1;
}

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

// parallel_for with per-thread state: each thread first builds its state
// with make(thread index in [0, threads)), then runs body(i, state) for its
// share of [0, n), schedule(dynamic, 1). On one thread, no region.
template <class Make, class Body>
void parallel_for_with(int64_t n, int threads, const Make& make, const Body& body) {
  if (n <= 0) return;
  if (threads <= 1 || n <= 1) {
    auto state = make(0);
    for (int64_t i = 0; i < n; ++i) body(i, state);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    auto state = make(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) body(i, state);
  }
}

}  // namespace mha::core
