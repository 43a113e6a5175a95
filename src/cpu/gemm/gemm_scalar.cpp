// mha's product without vector intrinsics: a 4 x 8 micro-tile in plain
// loops (the compiler vectorises them for the baseline target), for CPUs
// without AVX2 and for other processors.
#include <cstdint>

#include "cpu/gemm/gemm_traits.h"
#include "cpu/gemm/gemm_impl.h"

namespace mha::cpu::gemm_kernels {
namespace {

struct ScalarMicro {
  using Tiles = ScalarTiles;
  static constexpr const char* kName = "scalar";
  static constexpr int MR = Tiles::MR, NR = Tiles::NR;

  static void tile_to(int64_t kc, const float* a, const float* b, float* acc) {
    for (int i = 0; i < MR * NR; ++i) acc[i] = 0.0f;
    for (int64_t k = 0; k < kc; ++k) {
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) acc[i * NR + j] += a[i] * b[j];
      a += MR;
      b += NR;
    }
  }

  static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                   float beta) {
    alignas(64) float acc[MR * NR];
    tile_to(kc, a, b, acc);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        float* ce = c + i * ldc + j;
        *ce = update(acc[i * NR + j], alpha, beta, ce);
      }
  }
};

}  // namespace

const IsaGemm kScalarGemm = Driver<ScalarMicro>::table();

}  // namespace mha::cpu::gemm_kernels
