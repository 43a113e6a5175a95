// tools/bench_decode.h: `mha bench --decode` (tools/bench_decode.cpp), the
// decode kernel against the time to read its cache once at the memory
// bandwidth measured in the same run.
#pragma once

#include <vector>

namespace mha::tools {

// Prints, per thread count and case, the decode step's time, the cache's
// GB/s, the stream-copy bandwidth and the ratio to the cache-read time.
void run_decode_bench(const std::vector<int>& threads, bool quick, double budget);

}  // namespace mha::tools
