// tools/bench_progress.h: the benches' progress line on stderr.
//
// On a terminal the line is rewritten in place ("\r", erase to the end of the
// line); anywhere else (a file, a pipe, `mha bench > log 2>&1`) nothing is
// written, so that a redirected run holds plain lines only.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace mha::tools {

inline bool stderr_is_terminal() { return isatty(fileno(stderr)) == 1; }

// Shows `what` as the current progress line (terminal only).
inline void bench_progress(const std::string& what) {
  if (!stderr_is_terminal()) return;
  std::fprintf(stderr, "\r\033[K%s", what.c_str());
  std::fflush(stderr);
}

// Erases the progress line (terminal only).
inline void bench_progress_done() {
  if (!stderr_is_terminal()) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace mha::tools
