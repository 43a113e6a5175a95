#include "cpu/gemm/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "mha/error.h"
#include "mha/threads.h"

namespace mha::cpu {
namespace {

constexpr int kChains = 12;        // independent accumulators (see the header)
constexpr int64_t kRepeats = 1 << 14;  // FMAs per chain between clock reads

// Each loop below runs kRepeats x kChains FMAs of `lanes` floats and returns
// a value that depends on every accumulator (so that nothing is dropped).
__attribute__((target("avx512f"))) float loop_avx512(float seed) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(seed + static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t r = 0; r < kRepeats; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float out[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it (bug 105593)
  _mm512_store_ps(out, sum);
  float s = 0.0f;
  for (float x : out) s += x;
  return s;
}

__attribute__((target("avx2,fma"))) float loop_avx2(float seed) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(seed + static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t r = 0; r < kRepeats; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float out[8];
  _mm256_store_ps(out, sum);
  float s = 0.0f;
  for (float x : out) s += x;
  return s;
}

float loop_scalar(float seed) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = seed + static_cast<float>(c);
  for (int64_t r = 0; r < kRepeats; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * 0.999999f + 1e-7f;
  float s = 0.0f;
  for (float x : acc) s += x;
  return s;
}

int lanes_of(GemmIsa isa) { return isa == GemmIsa::Avx512 ? 16 : isa == GemmIsa::Avx2 ? 8 : 1; }

}  // namespace

FmaPeak measure_fma_peak(int threads, double seconds) {
  static const char* op = "measure_fma_peak";
  if (threads < 1 || threads > max_num_threads())
    fail(op, "threads: ", threads, "; wanted 1 <= threads <= ", max_num_threads());
  if (!(seconds > 0.0 && seconds <= 10.0)) fail(op, "seconds: ", seconds, "; wanted 0 < seconds <= 10");
  const GemmIsa isa = gemm_isa();
  auto loop = isa == GemmIsa::Avx512 ? loop_avx512 : isa == GemmIsa::Avx2 ? loop_avx2 : loop_scalar;
  using Clock = std::chrono::steady_clock;
  std::vector<int64_t> rounds(static_cast<size_t>(threads), 0);
  std::atomic<float> sink{0.0f};
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    float s = 0.0f;
    int64_t n = 0;
    while (Clock::now() < end) {
      s += loop(static_cast<float>(t) + s * 1e-30f);
      ++n;
    }
    rounds[static_cast<size_t>(t)] = n;
    sink.store(sink.load() + s);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  double flops = 0.0;
  for (int64_t n : rounds) flops += static_cast<double>(n) * kRepeats * kChains * lanes_of(isa) * 2.0;
  volatile float keep = sink.load();  // the loops' results are used
  (void)keep;
  return {isa, threads, flops / elapsed / 1e9};
}

}  // namespace mha::cpu
