// bench/bench_gemm_bf16.cpp: GFLOP/s of GemmBatch in bfloat16 on AMX tiles
// (cpu/gemm/gemm_amx.h), in bfloat16 on the portable path, and in float32,
// on the modules' product shapes, at 1 and 2 threads. Every call includes
// its packing (and, in bfloat16, its rounding), as the modules pay it.
// Paths are timed in turn within each sample, so that a loaded machine
// slows them alike; the best sample of each is printed.
//
//   cmake --build build --target mha_bench_gemm_bf16 && build/mha_bench_gemm_bf16 [samples]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "cpu/gemm/gemm.h"
#include "cpu/gemm/gemm_amx.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/random.h"
#include "mha/threads.h"

namespace {

using namespace mha;

struct Case {
  const char* name;
  bool trans_a, trans_b;
  int64_t M, N, K;
};

// This thread's CPU time: on a machine shared with other work, time spent
// preempted does not count (the pieces below, one thread).
double thread_now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::atoi(argv[1]) : 5;
  const Case cases[] = {
      {"projection A W^T", false, true, 4096, 768, 768},
      {"weight grad A^T G", true, false, 768, 768, 4096},
      {"projection D 512", false, true, 4096, 512, 512},
      {"projection D 256", false, true, 16384, 256, 256},
      {"scores Q K^T", false, true, 512, 512, 64},
      {"weighted sum P V", false, false, 512, 64, 512},
      {"d2l toy 10x100x100", false, true, 10, 100, 100},
      {"decode step 1 row", false, true, 1, 768, 768},
      {"decode 8 rows QKV", false, true, 8, 2304, 768},
  };
  std::printf("GemmBatch GFLOP/s (best of %d samples), AMX usable: %s, float32 ISA: %s\n", samples,
              cpu::amx_usable() ? "yes" : "no", cpu::gemm_isa_name(cpu::gemm_isa()));
  std::printf("%-20s %-16s %3s %9s %9s %9s %7s\n", "case", "M x N x K", "thr", "amx", "bf16 port", "float32",
              "amx/f32");
  Generator gen(1);
  for (const Case& c : cases) {
    const int64_t a_size = c.M * c.K, b_size = c.K * c.N;
    std::vector<float> A(static_cast<size_t>(a_size)), B(static_cast<size_t>(b_size)),
        C(static_cast<size_t>(c.M * c.N));
    for (float& x : A) x = gen.uniform(-1.0f, 1.0f);
    for (float& x : B) x = gen.uniform(-1.0f, 1.0f);
    const int64_t lda = c.trans_a ? c.M : c.K, ldb = c.trans_b ? c.K : c.N;
    const double flops = 2.0 * static_cast<double>(c.M) * static_cast<double>(c.N) * static_cast<double>(c.K);
    auto product = [&](Precision p) {
      cpu::GemmBatch batch(p);
      batch.add(c.trans_a, c.trans_b, c.M, c.N, c.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), c.N);
      batch.run();
    };
    // Calls per sample: about 20 ms of the float32 path.
    const double t0 = now();
    product(Precision::Float32);
    const int reps = std::max(1, static_cast<int>(0.02 / std::max(now() - t0, 1e-7)));
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      double best[3] = {0, 0, 0};  // amx, portable bf16, float32
      for (int s = 0; s < samples; ++s)
        for (int path = 0; path < 3; ++path) {
          if (path == 0 && !cpu::amx_usable()) continue;
          cpu::set_amx_enabled(path == 0);
          const Precision p = path == 2 ? Precision::Float32 : Precision::BFloat16;
          product(p);  // warm
          const double start = now();
          for (int r = 0; r < reps; ++r) product(p);
          best[path] = std::max(best[path], flops * reps / (now() - start) / 1e9);
        }
      cpu::set_amx_enabled(true);
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lldx%lld", static_cast<long long>(c.M), static_cast<long long>(c.N),
                    static_cast<long long>(c.K));
      std::printf("%-20s %-16s %3d %9.1f %9.1f %9.1f %7.2f\n", c.name, shape, threads, best[0], best[1], best[2],
                  best[0] / best[2]);
      std::fflush(stdout);
    }
  }
  // Where the time of one call goes, one thread: packing op(B) alone, and
  // the product with op(B) already packed (op(A) rounded per row block).
  if (!cpu::amx_usable()) return 0;
  set_num_threads(1);
  std::printf("\nAMX pieces, one thread, best thread CPU time:\n%-20s %-16s %12s %14s\n", "case", "M x N x K", "pack B us",
              "packed GFLOP/s");
  for (const Case& c : cases) {
    std::vector<float> A(static_cast<size_t>(c.M * c.K)), B(static_cast<size_t>(c.K * c.N)),
        C(static_cast<size_t>(c.M * c.N));
    for (float& x : A) x = gen.uniform(-1.0f, 1.0f);
    for (float& x : B) x = gen.uniform(-1.0f, 1.0f);
    const int64_t lda = c.trans_a ? c.M : c.K, ldb = c.trans_b ? c.K : c.N;
    cpu::PackedBf16B packed(c.K, c.N);
    double pack = 1e30, run = 1e30;
    const cpu::GemmBlock g{c.trans_a, c.trans_b, c.M, c.N, c.K, 1.0f, A.data(), lda, nullptr, 0, 0.0f, nullptr,
                           C.data(), c.N};
    for (int s = 0; s < samples * 20; ++s) {
      double t = thread_now();
      packed.pack(c.trans_b, B.data(), ldb, 0, packed.panels());
      pack = std::min(pack, thread_now() - t);
      t = thread_now();
      cpu::gemm_amx_packed(g, packed);
      run = std::min(run, thread_now() - t);
    }
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lldx%lldx%lld", static_cast<long long>(c.M), static_cast<long long>(c.N),
                  static_cast<long long>(c.K));
    std::printf("%-20s %-16s %12.1f %14.1f\n", c.name, shape, pack * 1e6,
                2.0 * static_cast<double>(c.M) * static_cast<double>(c.N) * static_cast<double>(c.K) / run / 1e9);
  }
  return 0;
}
