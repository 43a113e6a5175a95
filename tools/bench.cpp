// `mha bench`: mha's forward on its benchmark shapes against the machine's own
// sgemm, at 1 and 2 threads, from C++ (no Python in the timings). The PyTorch
// peers are only reachable from Python: bench/bench.py runs them beside mha
// in one process and prints the ratios.
//
// ms: median wall time of a forward call after a warm-up call; GFLOP/s by the
// usual count, projections 2B(Q Dq D + K Dk D + K Dv D + Q D D) plus
// attention 4 B h Q K (D/h) (the unpadded count for padded cases; 3x for a
// training step: forward and backward of sum(output), dropout 0); % sgemm:
// over the best 4096x4096 sgemm at the same thread count (OpenBLAS's or
// mha's own product, whichever is faster here), measured just before and
// after each case (the larger rate), so that load from other processes
// drifts out of the ratio. mha itself never calls OpenBLAS on this path, so
// OPENBLAS_CORETYPE only changes the OpenBLAS roofline. peak MB: in a fresh process per case (this program re-run with a
// hidden option), at 1 thread, the peak resident set (VmHWM, reset through
// /proc/self/clear_refs) minus the resident set before the inputs are made:
// inputs, weights, outputs and all working memory of one call.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_decode.h"
#include "bench_gemm_small.h"
#include "bench_masks.h"
#include "bench_progress.h"
#include "commands.h"
// Internal (the bench part, CMakeLists.txt mha_tool_bench): the GEMM is timed
// by instruction set, which the public API does not expose.
#include "cpu/gemm/fma_peak.h"
#include "cpu/gemm/gemm.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/mha.h"
#include "outputs.h"

extern "C" char* openblas_get_corename(void);

namespace mha::tools {

namespace {

struct Case {
  const char* name;
  int64_t B, Q, K, Dq, Dk, Dv, D, h;
  enum Kind { Toy, Self, Padded, Cross, Train } kind;
};

const Case kCases[] = {
    {"toy B2 Q4 K6 D100 h5", 2, 4, 6, 100, 100, 100, 100, 5, Case::Toy},
    {"B8 L512 D768 h12", 8, 512, 512, 768, 768, 768, 768, 12, Case::Self},
    {"B8 L512 D768 h12 pad40%", 8, 512, 512, 768, 768, 768, 768, 12, Case::Padded},
    {"B1 L4096 D512 h8", 1, 4096, 4096, 512, 512, 512, 512, 8, Case::Self},
    {"B1 L16384 D256 h4", 1, 16384, 16384, 256, 256, 256, 256, 4, Case::Self},
    {"cross B4 Q128 K1024", 4, 128, 1024, 512, 256, 384, 512, 8, Case::Cross},
    {"train B8 L512 D768 h12", 8, 512, 512, 768, 768, 768, 768, 12, Case::Train},
};

// A training step (forward + backward) counts 3x the forward: the backward
// runs two products for each of the forward's.
double flops(const Case& c) {
  const double forward =
      2.0 * c.B * (c.Q * c.Dq * c.D + c.K * c.Dk * c.D + c.K * c.Dv * c.D + c.Q * c.D * c.D) +
      4.0 * c.B * c.h * c.Q * c.K * (c.D / c.h);
  return c.kind == Case::Train ? 3 * forward : forward;
}

// Valid lengths averaging 40% of K, spread from 15% to 60%.
std::vector<float> pad_lengths(int64_t B, int64_t K) {
  const double fr[] = {0.15, 0.25, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6};
  std::vector<float> l;
  for (int64_t b = 0; b < B; ++b) l.push_back(std::max(1.0f, std::round(static_cast<float>(K * fr[b % 8]))));
  return l;
}

struct Inputs {
  Tensor X, Y, Z;
  ValidLens lens;
  bool self = false, kv_same = false, train = false;
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  Generator g(0);
  auto rnd = [&](Shape s) {
    Tensor t(std::move(s));
    for (float& x : t.values()) x = static_cast<float>(g.normal());
    return t;
  };
  switch (c.kind) {
    case Case::Toy:  // the d2l chapter's check: ones, keys = values, valid_lens [3, 2]
      in.X = Tensor({c.B, c.Q, c.Dq}, 1.0f);
      in.Y = Tensor({c.B, c.K, c.Dk}, 1.0f);
      in.kv_same = true;
      in.lens = ValidLens::per_batch({3, 2});
      break;
    case Case::Self:
    case Case::Padded:
    case Case::Train:
      in.X = rnd({c.B, c.Q, c.Dq});
      in.self = true;
      if (c.kind == Case::Padded) in.lens = ValidLens::per_batch(pad_lengths(c.B, c.K));
      in.train = c.kind == Case::Train;
      break;
    case Case::Cross:
      in.X = rnd({c.B, c.Q, c.Dq});
      in.Y = rnd({c.B, c.K, c.Dk});
      in.Z = rnd({c.B, c.K, c.Dv});
      break;
  }
  return in;
}

Tensor run_once(MultiHeadAttention& m, const Inputs& in) {
  if (in.train) {  // forward and backward of sum(output), as PyTorch's out.sum().backward()
    Tensor out = m(in.X, in.X, in.X, in.lens);
    Tensor ones(out.shape(), 1.0f);
    m.backward(ones);
    return out;
  }
  if (in.self) return m(in.X, in.X, in.X, in.lens);
  if (in.kv_same) return m(in.X, in.Y, in.Y, in.lens);
  return m(in.X, in.Y, in.Z, in.lens);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of f() over >= 3 calls and about `budget` seconds, after one warm-up.
double time_call(const std::function<void()>& f, double budget) {
  f();
  std::vector<double> t;
  const double end = now() + budget;
  while (t.size() < 3 || (now() < end && t.size() < 50)) {
    const double t0 = now();
    f();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// GFLOP/s of a 4096^3 product: OpenBLAS's (its own threads), or mha's (on
// mha's threads, as the module runs it).
double sgemm_rate(int threads, double budget, bool ours = false) {
  const int n = 4096;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  const int saved = num_threads();
  set_num_threads(threads);
  openblas_set_num_threads(threads);
  const double t = time_call(
      [&] {
        if (ours)
          cpu::parallel_sgemm(n, n, n, a.data(), n, b.data(), n, false, nullptr, c.data(), n);
        else
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                      0.0f, c.data(), n);
      },
      budget);
  set_num_threads(saved);
  openblas_set_num_threads(1);
  return 2.0 * n * n * n / t / 1e9;
}



long status_kb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field) + 1);
  return -1;
}

// The hidden child: one forward call of case `index`; prints peak MB.
void memory_child(int index) {
  set_num_threads(1);
  // Resets the peak resident set to the current one.
  { std::ofstream("/proc/self/clear_refs") << "5"; }  // atomic-writes: ok (a kernel interface)
  const long base = status_kb("VmRSS");
  const Case& c = kCases[index];
  Inputs in = make_inputs(c);
  MultiHeadAttention m(c.D, c.h, 0.0f);
  m.train(in.train);
  Tensor out = run_once(m, in);
  std::printf("%.1f\n", (status_kb("VmHWM") - base) / 1024.0);
}

double measure_memory(int index) {
  const std::string cmd = "/proc/" + std::to_string(getpid()) + "/exe bench --memory-child " +
                          std::to_string(index);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  double mb = -1;
  if (std::fscanf(p, "%lf", &mb) != 1) mb = -1;
  return pclose(p) == 0 ? mb : -1;
}

struct BenchOptions {
  std::vector<int> threads{1, 2};
  bool quick = false, no_memory = false, masks = false, decode = false, prefill = false, small_gemm = false;
  int memory_child = -1;
};

void run_bench(const BenchOptions& opt) {
  if (opt.memory_child >= 0) return memory_child(opt.memory_child);
  if (opt.masks) return run_mask_bench(opt.threads, opt.quick ? 0.5 : 2.0);
  if (opt.small_gemm) return run_small_gemm_bench(opt.quick ? 0.2 : 1.0);
  if (opt.prefill) return run_prefill_bench(opt.threads, opt.quick ? 0.1 : 0.5);
  if (opt.decode) return run_decode_bench(opt.threads, opt.quick, opt.quick ? 0.3 : 1.0);
  const std::string core = openblas_get_corename();
  std::printf("mha %s, its product on %s; OpenBLAS core %s%s\n", kVersion,
              cpu::gemm_isa_name(cpu::gemm_isa()), core.c_str(),
              std::getenv("OPENBLAS_CORETYPE") ? " (set by OPENBLAS_CORETYPE)" : "");
  if (core == "Prescott" && !std::getenv("OPENBLAS_CORETYPE"))
    std::printf("note: OpenBLAS runs its generic kernels on this CPU (mha does not use it); to see "
                "OpenBLAS at its best, run with OPENBLAS_CORETYPE=SkylakeX (AVX-512) or Haswell (AVX2)\n");
  const double budget = opt.quick ? 0.5 : 2.0;
  const int n_cases = static_cast<int>(std::size(kCases));
  const int total = static_cast<int>(opt.threads.size()) * (n_cases + 1) + (opt.no_memory ? 0 : n_cases);
  int done = 0;
  auto progress = [&](const std::string& what) {
    bench_progress("[" + std::to_string(done) + "/" + std::to_string(total) + "] " + what);
  };

  std::vector<double> memory(n_cases, -1);
  if (!opt.no_memory)
    for (int i = 0; i < n_cases; ++i, ++done) {
      progress(std::string("peak memory: ") + kCases[i].name);
      memory[i] = measure_memory(i);
    }
  // The roofline is measured just before and after each case (the larger
  // rate counts): on a machine shared with other work the sgemm rate drifts,
  // and a ratio is only meaningful between runs under the same conditions.
  std::map<int, double> sgemm;                  // median over the cases
  std::map<int, std::pair<double, double>> products;  // OpenBLAS, mha: once per thread count
  std::map<std::pair<int, int>, double> roof;   // around each case
  std::map<std::pair<int, int>, double> ms;
  std::map<int, double> fma_peak;  // the register-only FMA loop, per thread count
  const int saved = num_threads();
  for (int t : opt.threads) {
    std::vector<double> rates;
    // The peak is a ceiling: the best of three 0.3 s runs (on a shared
    // machine one short run lost to other processes read below the GEMM's
    // own rate, --quick's 0.1 s at load 3.4: 101 against 123 GFLOP/s).
    fma_peak[t] = 0.0;
    for (int run = 0; run < 3; ++run) fma_peak[t] = std::max(fma_peak[t], cpu::measure_fma_peak(t, 0.3).gflops);
    products[t] = {sgemm_rate(t, 0.3), sgemm_rate(t, 0.3, true)};
    for (int i = 0; i < n_cases; ++i, ++done) {
      progress("threads=" + std::to_string(t) + " " + kCases[i].name);
      // The roofline: the faster of the two products (OpenBLAS's measured
      // once per thread count: with its generic kernels one call takes
      // seconds).
      const double before = std::max(products[t].first, sgemm_rate(t, 0.1, true));
      set_num_threads(t);
      const Case& c = kCases[i];
      Inputs in = make_inputs(c);
      MultiHeadAttention m(c.D, c.h, 0.0f);
      m.train(in.train);
      ms[{t, i}] = time_call([&] { run_once(m, in); }, budget);
      roof[{t, i}] = std::max(before, sgemm_rate(t, 0.1, true));
      rates.push_back(roof[{t, i}]);
    }
    std::sort(rates.begin(), rates.end());
    sgemm[t] = rates[rates.size() / 2];
    ++done;
  }
  set_num_threads(saved);
  bench_progress_done();

  for (int t : opt.threads)
    std::printf("FMA peak (register-only %s loop), %d thread%s: %.1f GFLOP/s\n",
                cpu::gemm_isa_name(cpu::gemm_isa()), t, t == 1 ? "" : "s", fma_peak[t]);
  std::printf("AMX-BF16 peak: not measured by this build\n");
  std::printf("\n%-26s %3s %10s %8s %8s %9s %9s %7s\n", "case", "thr", "ms", "GFLOP/s", "% sgemm", "peak MB",
              "sgemm GF/s", "% FMA");
  for (int t : opt.threads) {
    std::printf("%-26s %3d %10.2f %8.1f %7.1f%%  (median of the rates measured around the cases)\n",
                "sgemm 4096x4096 (best)", t, 2.0 * 4096 * 4096 * 4096 / sgemm[t] / 1e6, sgemm[t], 100.0);
    const auto [blas, ours] = products[t];
    std::printf("%-26s %3d %10.2f %8.1f %7.1f%%\n", "  OpenBLAS sgemm", t, 2.0 * 4096 * 4096 * 4096 / blas / 1e6,
                blas, 100 * blas / sgemm[t]);
    std::printf("%-26s %3d %10.2f %8.1f %7.1f%%\n", "  mha's own product", t, 2.0 * 4096 * 4096 * 4096 / ours / 1e6,
                ours, 100 * ours / sgemm[t]);
  }
  for (int i = 0; i < n_cases; ++i)
    for (int t : opt.threads) {
      const double s = ms[{t, i}], rate = flops(kCases[i]) / s / 1e9;
      char mem[32] = "n/a";
      if (memory[i] >= 0) std::snprintf(mem, sizeof mem, "%.1f", memory[i]);
      std::printf("%-26s %3d %10.3f %8.1f %7.1f%% %9s %9.1f %6.1f%%\n", kCases[i].name, t, s * 1e3, rate,
                  100 * rate / roof[{t, i}], mem, roof[{t, i}], 100 * rate / fma_peak[t]);
    }

}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time mha's forward on its benchmark shapes against the machine's sgemm (PyTorch peers: bench/bench.py)");
  CLI::Option* threads = cmd->add_option("--threads", opt->threads, "Thread counts to run at")
                            ->transform(thread_count())->capture_default_str();
  cmd->add_flag("--quick", opt->quick, "Short timing budget per case");
  CLI::Option* no_memory = cmd->add_flag("--no-memory", opt->no_memory, "Skip the peak-memory child processes");
  // The four parts below run alone: each excludes the others (only one
  // would run), and --no-memory, which only the main part measures.
  std::vector<CLI::Option*> parts = {
      cmd->add_flag("--masks", opt->masks,
                    "Only the mask rows: causal and key padding masks against none, fused kernel and modules;"
                    " a causal sliding window against full causal, and softcap, ALiBi and sinks against none, kernel alone"),
      cmd->add_flag("--decode", opt->decode,
                    "Only the decode kernel: few queries over a KV cache, against the time to read the cache once"),
      cmd->add_flag("--prefill", opt->prefill,
                    "Only prefills (many new queries over a KV cache): the decode kernel against the fused kernel"),
      cmd->add_flag("--small-gemm", opt->small_gemm,
                    "Only products of few rows: mha's GEMM with and without a packed copy of the weight (one "
                    "thread; takes no --threads)")};
  for (CLI::Option* part : parts) {
    part->excludes(no_memory);
    for (CLI::Option* other : parts)
      if (other != part) part->excludes(other);
  }
  parts.back()->excludes(threads);
  cmd->add_option("--memory-child", opt->memory_child)
      ->transform(integer_in(0, static_cast<int64_t>(std::size(kCases)) - 1))
      ->group("");  // hidden
  cmd->callback([opt] { run_bench(*opt); });
}

}  // namespace mha::tools
