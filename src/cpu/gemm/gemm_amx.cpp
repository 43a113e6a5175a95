// The bfloat16 product on AMX tiles (gemm_amx.h): packing of
// op(B) and op(A) into tiles, the 2 x 2-tile kernel and its driver.
#include "cpu/gemm/gemm_amx.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "cpu/isa/have_x86.h"
#include "cpu/isa/isa.h"

#if MHA_HAVE_X86
#include <immintrin.h>
#endif

namespace mha::cpu {

namespace {

bool g_amx_enabled = true;

}  // namespace

bool amx_usable() { return g_amx_enabled && detected_isa() == Isa::AmxBf16; }
void set_amx_enabled(bool enabled) { g_amx_enabled = enabled; }

void PackedBf16B::Free::operator()(uint16_t* p) const { std::free(p); }

PackedBf16B::PackedBf16B(int64_t K, int64_t N) : K_(K), N_(N) {
  const size_t elements = static_cast<size_t>(std::max<int64_t>(panels() * steps(), 1)) * 2 * 512;
  data_.reset(static_cast<uint16_t*>(std::aligned_alloc(64, elements * sizeof(uint16_t))));
  if (!data_) throw std::bad_alloc();
}

}  // namespace mha::cpu

#if MHA_HAVE_X86
#define MHA_ISA_TARGET "amx-tile,amx-bf16,avx512f,avx2,fma"
#include "cpu/isa/target_begin.h"

#include "cpu/gemm/gemm_amx_driver.h"
#include "cpu/gemm/gemm_amx_tiles.h"

namespace mha::cpu {

void PackedBf16B::pack(bool trans_b, const float* B, int64_t ldb, int64_t panel0, int64_t panel1,
                       const float* const* rows) {
  for (int64_t p = panel0; p < std::min(panel1, panels()); ++p)
    amx::pack_panel(trans_b, B, ldb, rows, K_, N_, p, data_.get() + p * steps() * 2 * 512);
}

void gemm_amx_packed(const GemmBlock& g, const PackedBf16B& b) { amx::run(g, b); }

void gemm_amx_unpacked(const GemmBlock* g, int64_t count, const float* const* rows, int64_t panel0,
                       int64_t panel1) {
  amx::run_unpacked(g, count, rows, panel0, panel1);
}

}  // namespace mha::cpu

#include "cpu/isa/target_end.h"

#else  // not x86: amx_usable() is false, so nothing calls these.

namespace mha::cpu {
void PackedBf16B::pack(bool, const float*, int64_t, int64_t, int64_t, const float* const*) {}
void gemm_amx_packed(const GemmBlock&, const PackedBf16B&) {}
void gemm_amx_unpacked(const GemmBlock*, int64_t, const float* const*, int64_t, int64_t) {}
}  // namespace mha::cpu

#endif
