// src/dist/agree.h: a collective call fails on every rank or on none.
//
// A rank whose part of a call throws (bad arguments on that rank, memory)
// must not leave the others waiting forever in the call's next collective.
// So the local part of every collective call runs through agree(): each
// rank reports whether it failed (one all-gather of a flag), the ranks that
// failed rethrow their own error and the others throw one naming them.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include "mha/dist/communicator.h"
#include "mha/error.h"

namespace mha::dist {

// Runs local() on this rank; returns its result when it succeeded on every
// rank, else throws on every rank (see the file comment).
template <typename Local>
auto agree(const Communicator& comm, const char* op, Local&& local) -> decltype(local()) {
  using Result = decltype(local());
  std::exception_ptr error;
  Result result{};
  try {
    result = local();
  } catch (...) {
    error = std::current_exception();
  }
  const std::vector<int64_t> failed = comm.all_gather(error ? 1 : 0);
  if (error) std::rethrow_exception(error);
  std::string ranks;
  for (size_t r = 0; r < failed.size(); ++r)
    if (failed[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty())
    fail(op, "the call failed on rank ", ranks, " of ", comm.size(), " (its error is raised there); every rank stops");
  return result;
}

}  // namespace mha::dist
