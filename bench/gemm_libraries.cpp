// bench/gemm_libraries.cpp: mha's own GEMM against the GEMMs of the
// libraries Debian 12 ships (OpenBLAS, BLIS, oneDNN) on the products a
// module runs, in one process, so that a loaded machine still gives true
// ratios. It is the measurement behind src/cpu/gemm (see gemm.h: why mha
// has a GEMM of its own).
//
// Build and run (bench/gemm_libraries.sh does both): it links only libmha
// and finds each library at run time with dlopen, so that their exported
// cblas_* symbols never clash and a missing library is skipped with a line.
//   apt-get install libblis-dev libdnnl-dev   # OpenBLAS is mha's own dependency
//
// Each case: C:[M,N] = A:[M,K] op(B), op(B) = W^T for the projections (W:[N,K],
// PyTorch's and mha's weight layout) or a plain B:[K,N] for the gradients'
// products; median of the per-round times over rounds that run every library
// once each, in turn.
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm/few_rows.h"
#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/threads.h"

namespace {

struct Case {
  const char* what;
  int64_t M, N, K;
  bool trans_b;  // B given as W:[N,K]
};

// One library's C = A op(B), row-major, beta = 0.
using Gemm = std::function<void(const Case&, const float* A, const float* B, float* C)>;

struct Library {
  std::string name;
  Gemm run;
};

void* open_first(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) return h;
  return nullptr;
}

template <typename F>
F* symbol(void* lib, const char* name) {
  return lib ? reinterpret_cast<F*>(dlsym(lib, name)) : nullptr;
}

std::vector<Library> libraries(int threads) {
  std::vector<Library> out;
  out.push_back({"mha", [](const Case& c, const float* A, const float* B, float* C) {
                   mha::cpu::parallel_sgemm(c.M, c.N, c.K, A, c.K, B, c.trans_b ? c.K : c.N, c.trans_b, nullptr,
                                            C, c.N);
                 }});
  // What a module runs for a weight's product (x W^T): the weight packed
  // once per version (cpu/gemm/packed_weight.h), outside the timing; other
  // products pack per call, as above.
  out.push_back({"mha (weight packed)", [](const Case& c, const float* A, const float* B, float* C) {
                   static const float* packed_from = nullptr;
                   static std::shared_ptr<mha::cpu::PackedWeight> w;
                   if (!c.trans_b || c.M <= mha::cpu::kDotProductMaxRows) {
                     mha::cpu::parallel_sgemm(c.M, c.N, c.K, A, c.K, B, c.trans_b ? c.K : c.N, c.trans_b, nullptr,
                                              C, c.N);
                     return;
                   }
                   if (packed_from != B || !w || w->N != c.N || w->K != c.K) {
                     w = mha::cpu::pack_weight(B, c.N, c.K, mha::Precision::Float32);
                     packed_from = B;
                   }
                   mha::cpu::GemmBatch batch;
                   batch.add_packed(c.M, A, c.K, *w, nullptr, C, c.N);
                   batch.run();
                 }});
  // OpenBLAS as a user has it: whatever kernels it picks for this CPU
  // without OPENBLAS_CORETYPE (the variable is left as the caller set it).
  void* openblas = open_first({"libopenblas.so.0"});
  using CblasSgemm = void(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                          int);
  if (auto* sgemm = symbol<CblasSgemm>(openblas, "cblas_sgemm")) {
    if (auto* set = symbol<void(int)>(openblas, "openblas_set_num_threads")) set(threads);
    const char* core = std::getenv("OPENBLAS_CORETYPE");
    out.push_back({std::string("OpenBLAS") + (core ? std::string(" (") + core + ")" : " (default)"),
                   [sgemm](const Case& c, const float* A, const float* B, float* C) {
                     // CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112.
                     sgemm(101, 111, c.trans_b ? 112 : 111, int(c.M), int(c.N), int(c.K), 1.0f, A, int(c.K), B,
                           int(c.trans_b ? c.K : c.N), 0.0f, C, int(c.N));
                   }});
  } else {
    std::printf("OpenBLAS: not found (libopenblas.so.0)\n");
  }
  // BLIS's typed API: strides say row- or column-major, so op(B) = W^T is W
  // read with row stride 1 and column stride K.
  void* blis = open_first({"libblis.so.4", "libblis.so"});
  using BliSgemm = void(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                        const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
  if (auto* sgemm = symbol<BliSgemm>(blis, "bli_sgemm")) {
    if (auto* set = symbol<void(int64_t)>(blis, "bli_thread_set_num_threads")) set(threads);
    out.push_back({"BLIS", [sgemm](const Case& c, const float* A, const float* B, float* C) {
                     static const float one = 1.0f, zero = 0.0f;
                     const int64_t rsb = c.trans_b ? 1 : c.N, csb = c.trans_b ? c.K : 1;
                     sgemm(0, 0, c.M, c.N, c.K, &one, A, c.K, 1, B, rsb, csb, &zero, C, c.N, 1);  // 0: no transpose
                   }});
  } else {
    std::printf("BLIS: not found (libblis.so.4; apt-get install libblis-dev)\n");
  }
  // oneDNN's dnnl_sgemm: row-major, BLAS-like; threads from OpenMP.
  void* dnnl = open_first({"libdnnl.so.2", "libdnnl.so"});
  using DnnlSgemm = int(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                        float, float*, int64_t);
  if (auto* sgemm = symbol<DnnlSgemm>(dnnl, "dnnl_sgemm")) {
    out.push_back({"oneDNN", [sgemm](const Case& c, const float* A, const float* B, float* C) {
                     sgemm('N', c.trans_b ? 'T' : 'N', c.M, c.N, c.K, 1.0f, A, c.K, B, c.trans_b ? c.K : c.N, 0.0f,
                           C, c.N);
                   }});
  } else {
    std::printf("oneDNN: not found (libdnnl.so.2; apt-get install libdnnl-dev)\n");
  }
  return out;
}

double seconds_of(const std::function<void()>& f, double budget) {
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  do {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget || t.size() < 3);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  mha::set_num_threads(threads);
  omp_set_num_threads(threads);
  const Case cases[] = {
      {"projection, B8 L512 D768 (x W^T)", 4096, 768, 768, true},
      {"W_q gradient, B8 L512 D768 (dY^T X as a plain product)", 768, 768, 4096, false},
      {"projection, B1 L4096 D512", 4096, 512, 512, true},
      {"projection, B1 L16384 D256", 16384, 256, 256, true},
      {"stacked q,k,v, B8 L512 D768", 4096, 2304, 768, true},
      {"few rows: the d2l chapter's toy (8 x 100 x 100)", 8, 100, 100, true},
      {"few rows: a decode step (1 x 4096 x 4096)", 1, 4096, 4096, true},
  };
  const std::vector<Library> libs = libraries(threads);
  std::printf("%d threads, %d rounds; GFLOP/s (median of rounds) and the time relative to mha's\n", threads, rounds);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Case& c : cases) {
    std::vector<float> A(size_t(c.M * c.K)), B(size_t(c.K * c.N)), C(size_t(c.M * c.N)), want(size_t(c.M * c.N));
    for (float& x : A) x = u(rng);
    for (float& x : B) x = u(rng);
    libs[0].run(c, A.data(), B.data(), want.data());
    const double flops = 2.0 * double(c.M) * double(c.N) * double(c.K);
    const double budget = std::min(0.3, std::max(0.02, flops / 100e9 * 3));
    std::vector<std::vector<double>> times(libs.size());
    for (int r = 0; r < rounds; ++r)
      for (size_t l = 0; l < libs.size(); ++l)
        times[l].push_back(seconds_of([&] { libs[l].run(c, A.data(), B.data(), C.data()); }, budget));
    std::printf("\n%s: M %lld N %lld K %lld\n", c.what, (long long)c.M, (long long)c.N, (long long)c.K);
    double mha_s = 0;
    for (size_t l = 0; l < libs.size(); ++l) {
      // Same product? (largest difference against mha's, relative to its largest magnitude)
      libs[l].run(c, A.data(), B.data(), C.data());
      double diff = 0, scale = 0;
      for (size_t i = 0; i < C.size(); ++i) {
        diff = std::max(diff, double(std::abs(C[i] - want[i])));
        scale = std::max(scale, double(std::abs(want[i])));
      }
      std::sort(times[l].begin(), times[l].end());
      const double s = times[l][times[l].size() / 2];
      if (l == 0) mha_s = s;
      std::printf("  %-22s %8.1f GFLOP/s  %8.3f ms  time/mha %5.2f  (max diff %.1e)\n", libs[l].name.c_str(),
                  flops / s / 1e9, s * 1e3, s / mha_s, diff / scale);
    }
  }
  return 0;
}
