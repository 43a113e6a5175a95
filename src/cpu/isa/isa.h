// src/cpu/isa/isa.h: the one list of instruction sets mha's kernels are
// built for, the one detection, and the one way tests force a lower one.
//
// The fused, decode and GEMM dispatchers index their kernel tables by Isa
// (isa_entry below); each keeps its own choice (set_fused_isa,
// set_gemm_isa, set_amx_enabled) so that a test can force one kernel family
// without the others, but every choice is checked against detected_isa().
#pragma once

namespace mha::cpu {

// In order: each implies the ones before it (AMX-BF16 here means the tiles
// plus AVX-512F, AVX2 and FMA, all granted by the OS).
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, AmxBf16 = 3 };

// The best this CPU and OS allow, found once per process: cpuid for the
// instructions, XCR0 for the register state the OS saves (YMM for AVX2;
// opmask and ZMM for AVX-512; XTILECFG/XTILEDATA for AMX), and for AMX
// Linux's per-process grant of the tile data (arch_prctl
// ARCH_REQ_XCOMP_PERM). Scalar where mha is built without its x86 kernels.
Isa detected_isa();

// The best vector (non-tile) level: detected_isa() capped at Avx512. The
// fused, decode and GEMM tables have kernels up to this level; AMX is an
// extra path beside the AVX-512 ones.
Isa best_vector_isa();

// Whether this CPU has `isa` (isa <= detected_isa()).
bool isa_supported(Isa isa);

// "scalar", "avx2", "avx512", "amx-bf16".
const char* isa_name(Isa isa);

// The entry of a per-ISA kernel table for `isa`: AVX-512's for AMX (the
// tables hold vector kernels), and the scalar one where mha is built
// without its x86 kernels (the x86 entries are then never defined, so they
// are passed as pointers and never read).
template <class T>
const T& isa_entry(Isa isa, const T& scalar, const T* avx2, const T* avx512) {
  switch (isa) {
    case Isa::AmxBf16:
    case Isa::Avx512:
      if (avx512) return *avx512;
      break;
    case Isa::Avx2:
      if (avx2) return *avx2;
      break;
    case Isa::Scalar: break;
  }
  return scalar;
}

// One forced choice of a kernel family (for tests): starts at `best`, and
// set() accepts only levels this CPU has.
class IsaChoice {
 public:
  explicit IsaChoice(Isa best) : isa_(best) {}
  Isa get() const { return isa_; }
  // false, and no change, when the CPU lacks `isa`. Not thread-safe
  // against running kernels.
  bool set(Isa isa) {
    if (!isa_supported(isa)) return false;
    isa_ = isa;
    return true;
  }

 private:
  Isa isa_;
};

}  // namespace mha::cpu
