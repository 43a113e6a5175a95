// The unfused attention forward: for each (batch row, head) the (Q, K) score
// matrix is one BLAS product, the masked softmax runs over its rows, and the
// output is a second BLAS product. Its cost is the Q x K scratch per thread; it
// is the path that materialises attention weights most simply, and the one
// that honours every option of AttentionForward (the fallback of the others).

#include <vector>

#include "core/parallel.h"
#include "cpu/blas/attention_blas.h"
#include "cpu/blas/blas.h"
#include "cpu/reference/reference.h"
#include "kernels/masked_row.h"
#include "mha/threads.h"

namespace mha::kernels {

void attention_forward_blas(const AttentionForward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  // The (batch row, head) pairs split over mha's threads, each pair from
  // start to end on one thread, so that the softmax runs in parallel with
  // the products; cpu::sgemm inside is one single-threaded product whose
  // bits do not depend on where it runs (cpu/gemm/parallel_gemm.h). One pair
  // alone runs its products on every thread instead.
  struct Scratch {
    std::vector<float> weights, dropped;
  };
  const double work = static_cast<double>(B * H) * static_cast<double>(Q * K) * static_cast<double>(d + dv);
  core::parallel_for_with(
      B * H, core::team_for(work, B * H),
      [&](int) {
        return Scratch{std::vector<float>(p.weights ? 0 : static_cast<size_t>(Q * K)),
                       std::vector<float>(p.dropout.active() ? static_cast<size_t>(Q * K) : 0)};
      },
      [&](int64_t bh, Scratch& st) {
      const int64_t b = bh / H, h = bh % H;
      std::vector<float>& scratch = st.weights;
      std::vector<float>& dropped = st.dropped;
      const int64_t hk = p.kv_head(h);  // grouped heads share k and v
      const uint64_t base = static_cast<uint64_t>((b * H + h) * Q * K);
      float* s = p.weights ? p.weights + base : scratch.data();
      // s:[Q,K] = q_bh:[Q,d] @ k_bhk:[K,d]^T
      cpu::sgemm(false, true, Q, K, d, 1.0f, p.q.ptr(b, h), p.q.stride[2], p.k.ptr(b, hk),
                 p.k.stride[2], 0.0f, s, K, p.precision);
      for (int64_t i = 0; i < Q; ++i)
        masked_softmax_row(p.masks, p.length(b, i), p.scale_divisor, b, h, i, Q, K, s + i * K);
      const float* pw = s;
      if (p.dropout.active()) {
        for (int64_t x = 0; x < Q * K; ++x) dropped[x] = s[x] * p.dropout.multiplier(base + x);
        pw = dropped.data();
      }
      // out_bh:[Q,dv] = pw:[Q,K] @ v_bhk:[K,dv]
      cpu::sgemm(false, false, Q, dv, K, 1.0f, pw, K, p.v.ptr(b, hk), p.v.stride[2], 0.0f,
                 p.out.ptr(b, h), p.out.stride[2]);
      });
}

}  // namespace mha::kernels
