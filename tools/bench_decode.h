// tools/bench_decode.h: `mha bench --decode` (tools/bench_decode.cpp), the
// decode kernel against the time to read its cache once at the memory
// bandwidth measured in the same run.
#pragma once

#include <vector>

namespace mha::tools {

// Prints, per thread count and case, the decode step's time, the cache's
// GB/s, the stream-copy bandwidth and the ratio to the cache-read time.
void run_decode_bench(const std::vector<int>& threads, bool quick, double budget);

// Prints, per thread count and prefill case (Qn new queries over K0 cached
// keys), the decode kernel's and the fused kernel's time: the measurement
// behind kernels::kDecodeFusedMinQueries.
void run_prefill_bench(const std::vector<int>& threads, double budget);

}  // namespace mha::tools
