// cpu/gemm/fma_peak.h: the machine's measured float32 FMA peak, the ceiling
// the benchmarks hold mha's products and attention to.
//
// A register-only loop of fused multiply-adds on the instruction set the
// GEMM uses (gemm_isa()): 12 independent accumulators per thread (enough to
// cover the FMA latency on two ports: 4 cycles x 2 per cycle = 8 chains, with
// room), no loads or stores inside the loop, so it measures the FMA units
// alone. Each thread runs it for `seconds`; the result is the FLOPs of all
// threads (2 per lane per FMA) over the wall time. Timed benchmarks only:
// its value depends on the clock, the load and the other hyperthread.
#pragma once

#include "cpu/gemm/gemm.h"

namespace mha::cpu {

struct FmaPeak {
  GemmIsa isa;     // the instruction set measured (the GEMM's)
  int threads;     // threads that ran the loop at once
  double gflops;   // all threads together
};

// threads >= 1 (at most max_num_threads()); seconds > 0 (at most 10).
// mha::Error otherwise.
FmaPeak measure_fma_peak(int threads, double seconds);

}  // namespace mha::cpu
