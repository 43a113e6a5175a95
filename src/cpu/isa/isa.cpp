// The one detection of the instruction sets (cpu/isa/isa.h).
#include "cpu/isa/isa.h"

#include <cstdint>

#include "cpu/isa/have_x86.h"

#if MHA_HAVE_X86
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace mha::cpu {

namespace {

#if MHA_HAVE_X86
uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

Isa detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::Scalar;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), avx = c & (1u << 28);
  if (!osxsave || !fma || !avx) return Isa::Scalar;  // xgetbv needs OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::Scalar;
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16);
  const bool amx_tile = d & (1u << 24), amx_bf16 = d & (1u << 22);
  const uint64_t x = xcr0();
  constexpr uint64_t kYmm = 0x6u;             // SSE and AVX state (bits 1, 2)
  constexpr uint64_t kZmm = kYmm | 0xe0u;     // + opmask and both ZMM halves (5-7)
  constexpr uint64_t kTiles = kZmm | (3u << 17);  // + XTILECFG and XTILEDATA (17, 18)
  if (!avx2 || (x & kYmm) != kYmm) return Isa::Scalar;
  if (!avx512f || (x & kZmm) != kZmm) return Isa::Avx2;
  if (!amx_tile || !amx_bf16 || (x & kTiles) != kTiles) return Isa::Avx512;
  // Linux hands out the 8 KB of tile data per process, on request.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return Isa::Avx512;
  return Isa::AmxBf16;
}
#else
Isa detect() { return Isa::Scalar; }
#endif

}  // namespace

Isa detected_isa() {
  static const Isa isa = detect();  // thread-safe, once per process
  return isa;
}

Isa best_vector_isa() {
  const Isa isa = detected_isa();
  return isa == Isa::AmxBf16 ? Isa::Avx512 : isa;
}

bool isa_supported(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(detected_isa()); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::AmxBf16: return "amx-bf16";
  }
  return "scalar";
}

}  // namespace mha::cpu
