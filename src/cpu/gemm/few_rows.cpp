// Dot products of very few rows against a weight in place (cpu/gemm/few_rows.h).
#include "cpu/gemm/few_rows.h"

#include "core/parallel.h"

namespace mha::cpu {

void dot_product_rows(const float* x, int64_t rows, int64_t ldx, int64_t K, const float* W, int64_t N, const float* bias,
                      float* y, int64_t ldy, int threads) {
  // Four weight rows per block; blocks fixed by N alone.
  const int64_t blocks = (N + 3) / 4;
  core::parallel_for(blocks, threads, [&](int64_t ob) {
    const int64_t o = ob * 4;
    if (o + 4 <= N) {
      const float *w0 = W + o * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t i = 0; i < K; ++i) {
          s0 += xr[i] * w0[i];
          s1 += xr[i] * w1[i];
          s2 += xr[i] * w2[i];
          s3 += xr[i] * w3[i];
        }
        float* yr = y + r * ldy + o;
        yr[0] = bias ? s0 + bias[o] : s0;
        yr[1] = bias ? s1 + bias[o + 1] : s1;
        yr[2] = bias ? s2 + bias[o + 2] : s2;
        yr[3] = bias ? s3 + bias[o + 3] : s3;
      }
      return;
    }
    for (int64_t oo = o; oo < N; ++oo) {  // the last 1-3 outputs
      const float* w = W + oo * K;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < K; ++i) sum += xr[i] * w[i];
        y[r * ldy + oo] = bias ? sum + bias[oo] : sum;
      }
    }
  });
}

}  // namespace mha::cpu
