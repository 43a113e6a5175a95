#include "mha/threads.h"

#include <omp.h>

#include <algorithm>
#include <atomic>

#include "mha/error.h"

namespace mha {

namespace {
std::atomic<int> g_threads{0};  // 0: OpenMP's default
}  // namespace

int max_num_threads() {
  static const int most = std::max(4, 4 * omp_get_num_procs());
  return most;
}

void set_num_threads(int64_t n) {
  if (n < 1 || n > max_num_threads())
    fail("set_num_threads", "n: ", n, " is not a thread count in [1, ", max_num_threads(),
         "] (at most 4x the machine's ", omp_get_num_procs(), " hardware threads)");
  g_threads = static_cast<int>(n);
}

int num_threads() {
  const int n = g_threads;
  return n > 0 ? n : std::min(omp_get_max_threads(), max_num_threads());
}

}  // namespace mha
