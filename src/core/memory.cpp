#include "core/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>

#include "mha/error.h"

namespace mha {

namespace {

// 0 means "the default"; read on every check, so relaxed ordering suffices.
std::atomic<uint64_t> g_limit{0};

}  // namespace

uint64_t default_memory_limit() {
  static const uint64_t value = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t bytes = pages <= 0 || page <= 0 ? uint64_t{1} << 40
                                             : static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    // An address-space limit (ulimit -v) below it: what the process can map
    // at most. Past it an allocation fails, or, for a new thread's
    // thread-local data, glibc aborts the process: refused before instead.
    struct rlimit as {};
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && as.rlim_cur < bytes)
      bytes = static_cast<uint64_t>(as.rlim_cur);
    return bytes;
  }();
  return value;
}

uint64_t memory_limit() {
  const uint64_t v = g_limit.load(std::memory_order_relaxed);
  return v ? v : default_memory_limit();
}

void set_memory_limit(uint64_t bytes) { g_limit.store(bytes, std::memory_order_relaxed); }

namespace core {

MemoryPlan& MemoryPlan::add(const char* what, const Shape& shape, uint64_t item_bytes) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(op_, what, " ", shape_str(shape), ": a dimension is negative");
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) ||
        n > static_cast<uint64_t>(INT64_MAX))
      fail(op_, what, " ", shape_str(shape), ": the element count overflows 64 bits");
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(n, item_bytes, &bytes) || bytes > static_cast<uint64_t>(INT64_MAX))
    fail(op_, what, " ", shape_str(shape), ": the size in bytes overflows 64 bits");
  if (__builtin_add_overflow(total_, bytes, &total_) || total_ > static_cast<uint64_t>(INT64_MAX))
    fail(op_, "the tensors of this call overflow 64 bits in total (", what, " ", shape_str(shape), ")");
  if (bytes > largest_) {
    largest_ = bytes;
    largest_what_ = what;
    largest_shape_ = shape;
  }
  return *this;
}

void MemoryPlan::check() const {
  const uint64_t limit = memory_limit();
  if (total_ > limit)
    fail(op_, "needs ", total_, " bytes, above the memory limit of ", limit,
         " bytes (the largest part: ", largest_what_, " ", shape_str(largest_shape_), ", ", largest_, " bytes); ",
         "raise the limit with set_memory_limit (CLI: --memory-limit)");
}

void check_bytes(const char* op, const std::string& what, uint64_t bytes) {
  const uint64_t limit = memory_limit();
  if (bytes > limit)
    fail(op, what, " needs ", bytes, " bytes, above the memory limit of ", limit,
         " bytes; raise the limit with set_memory_limit (CLI: --memory-limit)");
}

}  // namespace core
}  // namespace mha
