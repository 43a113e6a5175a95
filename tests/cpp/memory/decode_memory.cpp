// tests/cpp/memory/decode_memory.cpp: the decode kernel's working memory,
// counted allocation by allocation (its own test binary, mha_memory_tests,
// because it replaces the global operator new and delete).
//
// The bound: a decode step needs the cache plus O(threads x head
// dim) working memory. decode_attention allocates, besides the cache and the
// output, the chunks' partials (a number of chunks that stops growing with
// the cache length: kDecodeMaxChunks + B*Hkv at most), one scratch per
// thread and its task list (kernels/params.h, decode_working_bytes).
// These tests count the bytes a call allocates at its peak and check them
// against that formula, against the bound term by term, and that they are
// the same at 32768 and 65536 keys (and, per thread, independent of the
// keys entirely).
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "cpu/decode/decode.h"
#include "kernels/params.h"
#include "mha/threads.h"

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};

void note(int64_t delta) {
  const int64_t now = g_live.fetch_add(delta) + delta;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

void* counted_alloc(std::size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  note(static_cast<int64_t>(malloc_usable_size(p)));
  return p;
}

void counted_free(void* p) {
  if (!p) return;
  note(-static_cast<int64_t>(malloc_usable_size(p)));
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

namespace mha::kernels {
namespace {

// 32 query heads over 8 cache heads of d; a bfloat16 cache of K keys per batch row (values irrelevant to memory:
// zeros), q and out, and the peak bytes one decode_attention call allocates.
struct Case {
  int64_t B = 1, Hq = 32, Hkv = 8, Qn = 1, K = 0, d = 0;
  std::vector<uint16_t> k, v;
  std::vector<float> q, out;
  std::vector<int64_t> lengths;
  DecodeParams p;

  Case(int64_t keys, int64_t head_dim, int64_t queries = 1) : Qn(queries), K(keys), d(head_dim) {
    k.assign(static_cast<size_t>(B * Hkv * K * d), 0);
    v.assign(k.size(), 0);
    q.assign(static_cast<size_t>(B * Hq * Qn * d), 0.5f);
    out.assign(q.size(), 0.0f);
    lengths.assign(static_cast<size_t>(B), K);
    p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Qn = Qn, p.capacity = K, p.d = d, p.dv = d;
    p.set_contiguous_strides();
    p.q = q.data(), p.out = out.data(), p.lengths = lengths.data();
    p.k = k.data(), p.v = v.data(), p.dtype = CacheDtype::BF16;
    p.scale_divisor = std::sqrt(static_cast<float>(d));
  }

  int64_t peak_extra_bytes() {
    const int64_t before = g_live.load();
    g_peak.store(before);
    decode_attention(p);
    EXPECT_EQ(g_live.load(), before) << "decode_attention kept memory after returning";
    return g_peak.load() - before;
  }
  int64_t cache_bytes() const { return static_cast<int64_t>((k.size() + v.size()) * sizeof(uint16_t)); }
};

// malloc_usable_size rounds each block up (16 bytes for a small one, a page
// for a large one); a call makes 4 + threads blocks.
int64_t rounding_slack(int threads) { return 4096 * (4 + threads); }

TEST(DecodeMemory, CallAllocatesWhatDecodeWorkingBytesSays) {
  const int saved = num_threads();
  for (int threads : {1, 2})
    for (auto [K, d] : {std::pair<int64_t, int64_t>{4096, 128}, {32768, 16}}) {
      set_num_threads(threads);
      Case c(K, d);
      const int64_t seen = c.peak_extra_bytes(), said = decode_working_bytes(c.p, threads);
      EXPECT_LE(seen, said + rounding_slack(threads)) << K << " keys, " << threads << " threads";
      EXPECT_GE(seen, said) << K << " keys, " << threads << " threads";
    }
  set_num_threads(saved);
}

TEST(DecodeMemory, StopsGrowingWithTheCacheAndIsTinyBesideIt) {
  // 8 cache heads (of 16, to keep the test's caches small): 32768 keys make
  // the most chunks (kDecodeMaxChunks), so 65536 keys (a 2x cache) need the
  // same memory.
  const int saved = num_threads();
  set_num_threads(2);
  Case small(32768, 16), large(65536, 16);
  const int64_t a = small.peak_extra_bytes(), b = large.peak_extra_bytes();
  EXPECT_LE(b, a + rounding_slack(2)) << "32768 keys: " << a << " bytes; 65536 keys: " << b;
  EXPECT_LT(static_cast<double>(b), 0.01 * static_cast<double>(large.cache_bytes()));
  set_num_threads(saved);
}

TEST(DecodeMemory, BoundedTermByTerm) {
  // partials <= (kDecodeMaxChunks + B*Hkv) chunks x R rows x (dv + 2) floats,
  // scratch per thread R x (d + kDecodeTile + dv + 2) floats (+ 64 of
  // alignment room), tasks 24 bytes per chunk, a few words per (b, g).
  const int saved = num_threads();
  for (int threads : {1, 2})
    for (int64_t Qn : {1, 4})
      for (auto [K, d] : {std::pair<int64_t, int64_t>{4096, 128}, {32768, 16}, {65536, 16}}) {
        set_num_threads(threads);
        Case c(K, d, Qn);
        const int64_t R = c.p.group() * Qn, chunks = kDecodeMaxChunks + c.B * c.Hkv;
        const int64_t bound = 4 * chunks * R * (c.d + 2) + threads * 4 * (R * (c.d + kDecodeTile + c.d + 2) + 64) +
                              24 * chunks + 16 * (c.B * c.Hkv + 1);
        EXPECT_LE(c.peak_extra_bytes(), bound + rounding_slack(threads))
            << K << " keys, " << Qn << " queries, " << threads << " threads";
      }
  set_num_threads(saved);
}

TEST(DecodeMemory, EachThreadAddsOneScratchWhateverTheKeys) {
  const int saved = num_threads();
  for (int64_t K : {4096, 65536}) {
    Case c(K, 16);
    set_num_threads(1);
    const int64_t one = c.peak_extra_bytes();
    set_num_threads(2);
    const int64_t two = c.peak_extra_bytes();
    const int64_t R = c.p.group() * c.Qn, scratch = 4 * (R * (c.d + kDecodeTile + c.d + 2) + 64);
    // Both threads' scratch is alive at the end of the loop (its barrier):
    // exactly one more scratch than one thread, up to malloc's rounding.
    EXPECT_LE(two - one, scratch + 4096) << K << " keys";
    EXPECT_GE(two - one, scratch) << K << " keys";
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace mha::kernels
