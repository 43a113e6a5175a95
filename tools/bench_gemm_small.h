// tools/bench_gemm_small.h: `mha bench --small-gemm` (tools/bench_gemm_small.cpp),
// products of few rows through a PackedB against gemm_unpacked: the
// measurement behind the switch between them (cpu/gemm/gemm.h).
#pragma once

namespace mha::tools {

// Prints, per weight shape and row count, both paths' times on one thread
// and their ratio.
void run_small_gemm_bench(double budget);

}  // namespace mha::tools
