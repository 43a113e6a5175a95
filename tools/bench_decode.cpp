// `mha bench --decode`: one decode step (kernels::decode_attention: Qn new
// queries over a KV cache of K keys per row) against the time the machine
// needs to read that cache once.
//
// Cases: Qn = 1, 4, 16 queries over K = 4096 and 32768 cached keys, 32
// query heads of 128 with 32 or 8 cache heads, float32 and bfloat16 cache,
// batch 1 and 8 (--quick: batch 1, Qn = 1). Cases whose cache would take
// more than 40% of the available memory are skipped, and say so.
//
// Each kernel row is followed by the same step through a module's cached
// call (the chapter's MultiHeadAttention of 4096 features in 32 heads, or
// the drop-in with num_kv_heads = 8): projections, append, kernel, W_o;
// "x read+W" divides its time by the time to read the cache and the
// module's weights once.
//
// `mha bench --prefill`: many new queries at once (Qn up to 256 over 0 or
// 4096 cached keys), the decode kernel against the fused kernel on the
// cache: the measurement behind kernels::kDecodeFusedMinQueries.
//
// ms: median wall time of a step after a warm-up step. GB/s: cache bytes
// (k and v rows below the lengths) over that time. stream GB/s: a parallel
// copy of 2 x 256 MiB buffers on the same threads, counting bytes read plus
// bytes written (STREAM's convention), measured before and after each case
// (the larger counts), so load from other processes drifts out of the
// ratio. x read: the step's time over cache bytes / stream GB/s (1.0: the
// step runs at memory speed). work KiB: the kernel's working memory besides
// the cache at the case's threads (kernels::decode_working_bytes).
#include "bench_decode.h"
#include "core/bf16.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

// Internal (the bench part, CMakeLists.txt mha_tool_bench): the decode kernel
// is timed alone, below the modules' cached calls (timed through mha/mha.h).
#include "cpu/decode/decode.h"
#include "kernels/params.h"
#include "mha/mha.h"
#include "mha/threads.h"

namespace mha::tools {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_time(const std::function<void()>& f, double budget, size_t max_runs = 30) {
  f();
  std::vector<double> t;
  const double end = now() + budget;
  while (t.size() < 3 || (now() < end && t.size() < max_runs)) {
    const double t0 = now();
    f();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Bytes per second of a parallel copy (read + written), over buffers far
// larger than the caches.
double stream_bandwidth(int threads) {
  static std::vector<char> src(size_t{256} << 20, 1), dst(size_t{256} << 20, 0);
  const int64_t n = static_cast<int64_t>(src.size()), blocks = 256, block = n / blocks;
  const double t = median_time(
      [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t i = 0; i < blocks; ++i) std::memcpy(dst.data() + i * block, src.data() + i * block, block);
      },
      0.3, 10);
  return 2.0 * static_cast<double>(n) / t;
}

double available_bytes() {
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

struct DecodeCase {
  int64_t B, Hq, Hkv, Qn, K, d;
  kernels::CacheDtype dtype;
  std::string name() const {
    char s[96];
    std::snprintf(s, sizeof s, "B%ld Qn%-2ld K%-5ld %ld/%ld heads %s", static_cast<long>(B), static_cast<long>(Qn),
                  static_cast<long>(K), static_cast<long>(Hq), static_cast<long>(Hkv),
                  dtype == kernels::CacheDtype::F32 ? "f32 " : "bf16");
    return s;
  }
  double cache_bytes() const {
    return 2.0 * B * Hkv * K * d * (dtype == kernels::CacheDtype::F32 ? 4 : 2);
  }
};

std::vector<DecodeCase> cases(bool quick) {
  std::vector<DecodeCase> out;
  for (int64_t B : {1, 8})
    for (int64_t K : {4096, 32768})
      for (int64_t Hkv : {32, 8})
        for (auto dtype : {kernels::CacheDtype::F32, kernels::CacheDtype::BF16})
          for (int64_t Qn : {1, 4, 16}) {
            if (quick && (B != 1 || Qn != 1)) continue;
            out.push_back({B, 32, Hkv, Qn, K, 128, dtype});
          }
  return out;
}

// Cache, queries and output of one case; the cache filled by a cheap hash
// (random enough for timing; values in [-1, 1)).
struct DecodeData {
  std::vector<float> q, out, k32, v32;
  std::vector<uint16_t> k16, v16;
  std::vector<int64_t> lengths;
  kernels::DecodeParams p;

  explicit DecodeData(const DecodeCase& c) {
    const int64_t n = c.B * c.Hkv * c.K * c.d;
    auto fill = [](auto& v, int64_t count, uint64_t salt, auto convert) {
      v.resize(static_cast<size_t>(count));
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) {
        uint64_t x = (static_cast<uint64_t>(i) + salt) * 0x9E3779B97F4A7C15ull;
        x ^= x >> 29;
        v[static_cast<size_t>(i)] = convert(static_cast<float>(x >> 40) * 0x1.0p-23f - 1.0f);
      }
    };
    auto same = [](float x) { return x; };
    auto bf16 = [](float x) { return core::to_bf16(x); };
    if (c.dtype == kernels::CacheDtype::F32) fill(k32, n, 1, same), fill(v32, n, 2, same);
    else fill(k16, n, 1, bf16), fill(v16, n, 2, bf16);
    fill(q, c.B * c.Hq * c.Qn * c.d, 3, same);
    out.resize(q.size());
    lengths.assign(static_cast<size_t>(c.B), c.K);
    p.B = c.B, p.Hq = c.Hq, p.Hkv = c.Hkv, p.Qn = c.Qn, p.capacity = c.K, p.d = c.d, p.dv = c.d;
    p.set_contiguous_strides();
    p.q = q.data(), p.out = out.data(), p.lengths = lengths.data(), p.dtype = c.dtype;
    p.k = c.dtype == kernels::CacheDtype::F32 ? static_cast<const void*>(k32.data()) : k16.data();
    p.v = c.dtype == kernels::CacheDtype::F32 ? static_cast<const void*>(v32.data()) : v16.data();
    p.scale_divisor = std::sqrt(static_cast<float>(c.d));
  }
};

// Fills x with the cheap hash of DecodeData (values in [-1, 1)), scaled.
void hash_fill(Tensor& x, uint64_t salt, float scale = 1.0f) {
  float* v = x.data();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = (static_cast<uint64_t>(i) + salt) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    v[i] = scale * (static_cast<float>(h >> 40) * 0x1.0p-23f - 1.0f);
  }
}

// One decode step through a module's cached call: the n new positions
// projected, appended, attended over the cache on the decode kernel, W_o;
// each row rewound to K after the step (truncate is O(1)), so every step
// sees K cached keys. The chapter's module for as many cache heads as query
// heads, the drop-in with num_kv_heads for fewer.
struct ModuleStep {
  const char* module;
  double seconds, weight_bytes;
};

ModuleStep time_module_step(const DecodeCase& c, double budget) {
  const int64_t E = c.Hq * c.d, Ekv = c.Hkv * c.d;
  const KVCacheDtype dtype = c.dtype == kernels::CacheDtype::F32 ? KVCacheDtype::Float32 : KVCacheDtype::BFloat16;
  Tensor x({c.B, c.Qn, E});
  hash_fill(x, 4);
  auto fill = [&](KVCache& cache) {  // K cached positions, 1024 at a time (bounded temporaries)
    for (int64_t at = 0; at < c.K; at += 1024) {
      const int64_t n = std::min<int64_t>(1024, c.K - at);
      Tensor k({c.B, n, Ekv}), v({c.B, n, Ekv});
      hash_fill(k, static_cast<uint64_t>(at) * 2 + 5);
      hash_fill(v, static_cast<uint64_t>(at) * 2 + 6);
      cache.append(k, v);
    }
  };
  auto step = [&](auto& m, KVCache& cache) {
    m.forward(x, x, x, cache);
    for (int64_t b = 0; b < c.B; ++b) cache.truncate(b, c.K);
  };
  if (c.Hkv == c.Hq) {
    MultiHeadAttention m(E, c.Hq);
    m.eval();
    m.initialize(E, E, E);
    KVCache cache = m.kv_cache(c.B, c.K + c.Qn, dtype);
    fill(cache);
    const double s = median_time([&] { step(m, cache); }, budget);
    return {"MultiHeadAttention", s, 4.0 * 4 * E * E};
  }
  Tensor in_proj({E + 2 * Ekv, E}), out_proj({E, E});
  hash_fill(in_proj, 7, 0.02f);
  hash_fill(out_proj, 8, 0.02f);
  TorchMhaOptions o;
  o.batch_first = true;  // the steps' inputs are (B, Qn, E)
  o.num_kv_heads = c.Hkv;
  TorchMultiheadAttention m =
      TorchMultiheadAttention::from_state_dict({{"in_proj_weight", in_proj}, {"out_proj.weight", out_proj}}, c.Hq, o);
  m.eval();
  KVCache cache = m.kv_cache(c.B, c.K + c.Qn, dtype);
  fill(cache);
  const double s = median_time([&] { step(m, cache); }, budget);
  return {"TorchMultiheadAttention", s, 4.0 * ((E + 2 * Ekv) * E + E * E)};
}

}  // namespace

void run_decode_bench(const std::vector<int>& threads, bool quick, double budget) {
  std::printf("decode step: Qn queries over K cached keys per batch row, 32 query heads of 128 over 32 or 8 "
              "cache heads\n(x read: step time over the time to read the cache once at the stream-copy "
              "bandwidth measured around the case;\n indented: the same step through the module's cached call "
              "(projections, append, kernel, W_o), x read+W: over the time to read the cache and the weights;\n"
              " work KiB: the kernel's working memory besides the cache (partials, per-thread scratch, tasks:\n"
              " kernels::decode_working_bytes, counted by tests/cpp/memory/decode_memory.cpp), %% cache: its share)\n\n");
  std::printf("%-36s %3s %10s %8s %10s %10s %7s %9s %9s %7s\n", "case", "thr", "ms", "GB/s", "stream GB/s",
              "read ms", "x read", "x read+W", "work KiB", "% cache");
  for (int t : threads) {
    set_num_threads(t);
    for (const DecodeCase& c : cases(quick)) {
      if (c.cache_bytes() > 0.4 * available_bytes()) {
        std::printf("%-36s %3d %10s (cache %.1f GB, over 40%% of the available memory)\n", c.name().c_str(), t,
                    "skipped", c.cache_bytes() / 1e9);
        continue;
      }
      const double before = stream_bandwidth(t);
      double s = 0, work = 0;
      {
        DecodeData data(c);
        s = median_time([&] { kernels::decode_attention(data.p); }, budget);
        work = static_cast<double>(kernels::decode_working_bytes(data.p, t));
      }
      const ModuleStep mod = time_module_step(c, budget);
      const double bw = std::max(before, stream_bandwidth(t));
      const double read = c.cache_bytes() / bw, read_w = (c.cache_bytes() + mod.weight_bytes) / bw;
      std::printf("%-36s %3d %10.3f %8.1f %10.1f %10.3f %7.2f %9s %9.0f %7.3f\n", c.name().c_str(), t, s * 1e3,
                  c.cache_bytes() / s / 1e9, bw / 1e9, read * 1e3, s / read, "", work / 1024,
                  100.0 * work / c.cache_bytes());
      std::printf("  %-34s %3d %10.3f %8s %10s %10.3f %7.2f %9.2f\n", mod.module, t, mod.seconds * 1e3, "", "",
                  read_w * 1e3, mod.seconds / read, mod.seconds / read_w);
      std::fflush(stdout);
    }
  }
}

void run_prefill_bench(const std::vector<int>& threads, double budget) {
  std::printf("prefill: Qn new queries over K0 cached keys and, causally, each other (32 query heads of 128);\n"
              "the decode kernel (decode_attention) against the fused kernel (decode_attention_fused),\n"
              "median wall ms; kernels::decode_forward takes the fused one from Qn >= %ld (f32 cache), "
              "%ld (bf16)\n\n",
              static_cast<long>(kernels::kDecodeFusedMinQueries), static_cast<long>(kernels::kDecodeFusedMinQueriesBf16));
  std::printf("%-36s %3s %10s %10s %8s\n", "case", "thr", "decode ms", "fused ms", "fused/dec");
  for (int t : threads) {
    set_num_threads(t);
    for (auto dtype : {kernels::CacheDtype::F32, kernels::CacheDtype::BF16})
      for (int64_t Hkv : {32, 8})
        for (int64_t K0 : {0, 4096})
          for (int64_t Qn : {4, 8, 16, 32, 64, 128, 256}) {
            const DecodeCase c{1, 32, Hkv, Qn, K0 + Qn, 128, dtype};
            DecodeData data(c);
            const double dec = median_time([&] { kernels::decode_attention(data.p); }, budget, 5);
            const double fus = median_time([&] { kernels::decode_attention_fused(data.p); }, budget, 5);
            char name[96];
            std::snprintf(name, sizeof name, "Qn%-3ld K0 %-5ld %ld/%ld heads %s", static_cast<long>(Qn),
                          static_cast<long>(K0), 32L, static_cast<long>(Hkv),
                          dtype == kernels::CacheDtype::F32 ? "f32 " : "bf16");
            std::printf("%-36s %3d %10.3f %10.3f %8.2f\n", name, t, dec * 1e3, fus * 1e3, fus / dec);
            std::fflush(stdout);
          }
  }
}

}  // namespace mha::tools
