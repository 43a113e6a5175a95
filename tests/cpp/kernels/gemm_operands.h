// tests/cpp/kernels/gemm_operands.h: random operands of one product
// C = alpha op(A) op(B) + beta C (+ bias), with padded row strides, for the
// GEMM tests (test_gemm.cpp, test_gemm_bf16.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/gemm/gemm.h"
#include "mha/random.h"

namespace mha::test {

struct GemmOperands {
  bool trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  bool bias;
  std::vector<float> A, B, C, b;

  GemmOperands(Generator& gen, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad, float alpha_,
               float beta_, bool with_bias)
      : trans_a(ta), trans_b(tb), M(m), N(n), K(k), alpha(alpha_), beta(beta_), bias(with_bias) {
    // Stored shapes: A is [M,K] or [K,M], B is [K,N] or [N,K]; rows `pad` longer.
    lda = (ta ? M : K) + pad;
    ldb = (tb ? K : N) + pad;
    ldc = N + pad;
    A.resize(static_cast<size_t>(std::max<int64_t>((ta ? K : M) * lda, 1)));
    B.resize(static_cast<size_t>(std::max<int64_t>((tb ? N : K) * ldb, 1)));
    C.resize(static_cast<size_t>(M * ldc));
    b.resize(static_cast<size_t>(N));
    for (float& x : A) x = gen.uniform(-1.0f, 1.0f);
    for (float& x : B) x = gen.uniform(-1.0f, 1.0f);
    for (float& x : C) x = gen.uniform(-1.0f, 1.0f);
    for (float& x : b) x = gen.uniform(-1.0f, 1.0f);
  }
  // op(A)[i, k] and op(B)[k, j].
  float a(int64_t i, int64_t k) const { return trans_a ? A[k * lda + i] : A[i * lda + k]; }
  float bb(int64_t k, int64_t j) const { return trans_b ? B[j * ldb + k] : B[k * ldb + j]; }
  // The product writing into `out` (C's shape and stride).
  cpu::GemmBlock block(std::vector<float>& out) const {
    return {trans_a, trans_b, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta,
            bias ? b.data() : nullptr, out.data(), ldc};
  }
  std::string describe() const {
    return "trans " + std::to_string(trans_a) + std::to_string(trans_b) + " M" + std::to_string(M) + " N" +
           std::to_string(N) + " K" + std::to_string(K) + " ld " + std::to_string(lda) + "/" + std::to_string(ldb) +
           "/" + std::to_string(ldc) + " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta) +
           " bias " + std::to_string(bias);
  }
};

}  // namespace mha::test
