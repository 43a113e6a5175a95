// `mha bench --small-gemm`: C:[M,N] = A:[M,K] W^T + bias, W:[N,K] a weight
// read in place (the projections' product), on the calling thread, two ways
// timed in alternation so that a loaded machine moves both alike:
//   packed:   PackedB (a copy of all of W^T, per call) + gemm_packed
//   unpacked: gemm_unpacked (one B panel at a time in an L1 buffer)
// Both give the same bits (tests/cpp/kernels/test_gemm.cpp). us: median
// over samples of each path's time per call; ratio: median of the per-sample
// unpacked / packed ratios (< 1: unpacked faster). GemmBatch takes the
// unpacked path up to gemm_unpacked_max_rows() rows per right-hand matrix.
#include "bench_gemm_small.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cpu/gemm/gemm.h"
#include "mha/random.h"

namespace mha::tools {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void run_small_gemm_bench(double budget) {
  std::printf("products of few rows, C = A W^T + bias, one thread, %s: PackedB + gemm_packed against "
              "gemm_unpacked (switch: <= %lld rows)\n",
              cpu::gemm_isa_name(cpu::gemm_isa()), static_cast<long long>(cpu::gemm_unpacked_max_rows()));
  std::printf("%-12s %4s %12s %12s %8s\n", "N x K", "M", "packed us", "unpacked us", "ratio");
  const int64_t shapes[][2] = {{100, 100}, {300, 100}, {768, 768}, {2304, 768}, {4096, 4096}};
  const int64_t rows[] = {1, 4, 8, 16, 24, 32, 48, 64, 96};
  Generator gen(1);
  for (const auto& s : shapes) {
    const int64_t N = s[0], K = s[1];
    std::vector<float> W(static_cast<size_t>(N * K)), bias(static_cast<size_t>(N));
    for (float& x : W) x = gen.uniform(-1.0f, 1.0f);
    for (float& x : bias) x = gen.uniform(-1.0f, 1.0f);
    for (int64_t M : rows) {
      std::vector<float> A(static_cast<size_t>(M * K)), C(static_cast<size_t>(M * N));
      for (float& x : A) x = gen.uniform(-1.0f, 1.0f);
      const cpu::GemmBlock g{false, true, M, N, K, 1.0f, A.data(), K, W.data(), K, 0.0f, bias.data(), C.data(), N};
      const int64_t panels = (N + cpu::gemm_panel_width() - 1) / cpu::gemm_panel_width();
      auto packed = [&] {
        const cpu::PackedB b(true, K, N, W.data(), K);
        cpu::gemm_packed(g, b);
      };
      auto unpacked = [&] { cpu::gemm_unpacked(&g, 1, nullptr, 0, panels); };
      // Repetitions per sample: about 2 ms of the packed path.
      packed();
      double t0 = now();
      packed();
      const int reps = std::max(1, static_cast<int>(2e-3 / std::max(now() - t0, 1e-7)));
      std::vector<double> tp, tu, ratio;
      const double end = now() + budget;
      while (tp.size() < 5 || (now() < end && tp.size() < 200)) {
        t0 = now();
        for (int r = 0; r < reps; ++r) packed();
        const double p = (now() - t0) / reps;
        t0 = now();
        for (int r = 0; r < reps; ++r) unpacked();
        const double u = (now() - t0) / reps;
        tp.push_back(p), tu.push_back(u), ratio.push_back(u / p);
      }
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(N), static_cast<long long>(K));
      std::printf("%-12s %4lld %12.2f %12.2f %8.2f\n", shape, static_cast<long long>(M), 1e6 * median(tp),
                  1e6 * median(tu), median(ratio));
      std::fflush(stdout);
    }
  }
}

}  // namespace mha::tools
