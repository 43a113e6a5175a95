#include "mha/threads.h"

#include <omp.h>

#include <atomic>

#include "mha/error.h"

namespace mha {

namespace {
std::atomic<int> g_threads{0};  // 0: OpenMP's default
}  // namespace

void set_num_threads(int n) {
  if (n < 1) fail("set_num_threads", "n: ", n, " is not a positive thread count");
  g_threads = n;
}

int num_threads() {
  const int n = g_threads;
  return n > 0 ? n : omp_get_max_threads();
}

}  // namespace mha
