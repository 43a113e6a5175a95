// src/cpu/decode/decode_impl.h: one chunk of the decode kernel, for the
// vector type V (a fused-kernel Simd type plus reduce_add and load_bf16).
//
// Include only from decode_<isa>.cpp, inside its target region.
//
// A chunk is C keys of one (batch row, cache head) and the R = group x Qn
// query rows that read it. Keys go in tiles of kDecodeTile:
//   s[r, j]  = (q_r * log2(e) / sqrt(d)) . k_j      (vectorised over d)
//   softcap and ALiBi (kernels/params.h, MaskOptions), in base 2 too:
//     s -> c * tanh(s / c) with c = softcap * log2(e) (the same map, scaled),
//     then s -= slope_h * log2(e) * |pos_q - j|, pos_q = K - Qn + i
//   masked j (j >= the row's valid length): s = -1e6 * log2(e), the chapter's fill
//   online softmax per row over the tile (running max m_r, sum l_r, base 2)
//   acc[r, :] = acc[r, :] * 2^(m_old - m_new) + sum_j 2^(s[r, j] - m_new) v_j
// Each k and v element loaded (and converted from bfloat16) feeds up to
// kRowBlock rows held in registers, so the cache streams through once.
// A ring-buffer cache (DecodeParams::ring) holds position j in slot
// p.slot(j): keys are still visited in position order, a tile ending early
// where the slots wrap.
// A head's attention sink joins each row's denominator once, in the chunks'
// merge (decode.cpp), not here: a chunk sees only some of the row's keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/decode/decode.h"
#include "cpu/decode/decode_job.h"

namespace mha::kernels::decode {

template <class V>
struct DecodeKernel {
  using Reg = typename V::Reg;
  static constexpr int64_t L = V::kLanes;
  static constexpr int64_t T = kDecodeTile;
  // Rows per register block: 8 accumulators + one operand + one q load fit
  // both 16 (AVX2) and 32 (AVX-512) registers.
  static constexpr int kRowBlock = 8;
  static_assert(T % 16 == 0, "a tile must be whole vectors on every instruction set");

  static size_t scratch_floats(const DecodeParams& p) {
    const int64_t R = p.group() * p.Qn;
    return static_cast<size_t>(R * (p.d + T + p.dv + 2) + 64);
  }

  template <class E>
  static Reg load(const E* x) {
    if constexpr (std::is_same_v<E, float>) return V::load(x);
    else return V::load_bf16(x);
  }
  template <class E>
  static float scalar(E x) {
    if constexpr (std::is_same_v<E, float>) return x;
    else return core::from_bf16(x);
  }

  // Independent accumulators per register block: NB rows x (8 / NB) keys in
  // the scores, NB rows x (8 / NB) vectors of a value row in the weighted
  // sum. Eight chains in flight hide the FMA latency (4 cycles, 2 ports);
  // one chain per row was 4-5x slower at NB = 1 (the common decode case).
  template <int NB>
  static constexpr int kSpread = NB >= 8 ? 1 : 8 / NB;

  // bfloat16 keys are read 2L elements at a time as their even and odd
  // elements (V::load_bf16_pair: a shift and a mask, no widening shuffle),
  // so the scaled query is kept the same way: in each whole block of 2L
  // columns, its even columns, then its odd ones; columns past the last
  // whole block stay in order. 2-3% off a bfloat16 step (same measurement
  // as prefetch_row's: 40.6 / 52.0 ms against 41.6 / 53.4).
  static int64_t pair_cols(int64_t d) { return d / (2 * L) * (2 * L); }
  static void split_pairs(const float* q, float c2, int64_t d, float* out) {
    const int64_t P = pair_cols(d);
    for (int64_t b = 0; b < P; b += 2 * L)
      for (int64_t i = 0; i < L; ++i) {
        out[b + i] = q[b + 2 * i] * c2;
        out[b + L + i] = q[b + 2 * i + 1] * c2;
      }
    for (int64_t c = P; c < d; ++c) out[c] = q[c] * c2;
  }

  // s[r * T + jj] = qs_r . k_jj for the NB rows starting at qs, keys jj0 <= jj < jj0 + KB.
  template <int NB, int KB, class E>
  static void score_block(const float* qs, int64_t d, const E* k, int64_t ks, int64_t jj0, float* s) {
    Reg a[NB][KB];
    for (int r = 0; r < NB; ++r)
      for (int kb = 0; kb < KB; ++kb) a[r][kb] = V::zero();
    int64_t c = 0;
    if constexpr (std::is_same_v<E, uint16_t>) {
      for (; c + 2 * L <= d; c += 2 * L) {  // qs in split_pairs' order here
        Reg qe[NB], qo[NB];
        for (int r = 0; r < NB; ++r) qe[r] = V::load(qs + r * d + c), qo[r] = V::load(qs + r * d + c + L);
        for (int kb = 0; kb < KB; ++kb) {
          Reg ke, ko;
          V::load_bf16_pair(k + (jj0 + kb) * ks + c, ke, ko);
          for (int r = 0; r < NB; ++r) a[r][kb] = V::fmadd(qo[r], ko, V::fmadd(qe[r], ke, a[r][kb]));
        }
      }
    }
    for (; c + L <= d; c += L) {
      Reg qv[NB];
      for (int r = 0; r < NB; ++r) qv[r] = V::load(qs + r * d + c);
      for (int kb = 0; kb < KB; ++kb) {
        const Reg kv = load(k + (jj0 + kb) * ks + c);
        for (int r = 0; r < NB; ++r) a[r][kb] = V::fmadd(qv[r], kv, a[r][kb]);
      }
    }
    for (int r = 0; r < NB; ++r)
      for (int kb = 0; kb < KB; ++kb) {
        float sum = V::reduce_add(a[r][kb]);
        const E* kr = k + (jj0 + kb) * ks;
        for (int64_t cc = c; cc < d; ++cc) sum += qs[r * d + cc] * scalar(kr[cc]);
        s[r * T + jj0 + kb] = sum;
      }
  }

  // s[r * T + jj] = qs_r . k_jj for NB rows starting at qs, jj < n (k: key 0 of the tile).
  // pf: rows of the next tile to ask for meanwhile (key jj's while key jj is scored).
  template <int NB, class E>
  static void scores(const float* qs, int64_t d, const E* k, int64_t ks, int64_t n, float* s, int64_t pf) {
    constexpr int KB = kSpread<NB>;
    int64_t jj = 0;
    for (; jj + KB <= n; jj += KB) {
      for (int kb = 0; kb < KB && jj + kb < pf; ++kb) prefetch_row(k + (T + jj + kb) * ks, d);
      score_block<NB, KB>(qs, d, k, ks, jj, s);
    }
    for (; jj < n; ++jj) {
      if (jj < pf) prefetch_row(k + (T + jj) * ks, d);
      score_block<NB, 1>(qs, d, k, ks, jj, s);
    }
  }

  // Asks for the w elements from `row` (a row of the next tile), spread
  // through the tile's work: key jj + T's row while key jj is scored or
  // summed, so that a few lines are requested at a time. bfloat16 only.
  // Measured at one thread (B1, 32 heads of 128, 32768 keys, bfloat16, CPU
  // time of the calling thread; two versions alternated in one process, 160
  // calls each; load average 8-12 on the 2 cores): asking for the whole
  // next tile at its start, 256 prefetches in a row, stalled on the
  // line-fill buffers (perf put 90% of the kernel's samples on them): 49.5
  // ms best, 63.6 median, against 40.6 and 52.0 spread out (wall time at 2 threads: 56.4 / 102.1 against
  // 44.3 / 86.0). float32 rows gained nothing from either (82 / 107 ms
  // without prefetching, 92 / 109 with it spread): the hardware prefetcher
  // keeps up with them alone (twice the bytes per key computed).
  template <class E>
  static void prefetch_row(const E* row, int64_t w) {
    const char* b = reinterpret_cast<const char*>(row);
    for (int64_t at = 0; at < w * static_cast<int64_t>(sizeof(E)); at += 64) __builtin_prefetch(b + at);
  }

  // acc[r, c .. c + CB*L) += sum_jj p[r * T + jj] v_jj[c ..] for NB rows, jj < n.
  template <int NB, int CB, class E>
  static void value_block(const float* p, const E* v, int64_t vs, int64_t n, int64_t dv, int64_t c, float* acc,
                          int64_t pf) {
    Reg a[NB][CB];
    for (int r = 0; r < NB; ++r)
      for (int cb = 0; cb < CB; ++cb) a[r][cb] = V::load(acc + r * dv + c + cb * L);
    for (int64_t jj = 0; jj < n; ++jj) {
      if (jj < pf) prefetch_row(v + (T + jj) * vs + c, CB * L);
      Reg vv[CB];
      for (int cb = 0; cb < CB; ++cb) vv[cb] = load(v + jj * vs + c + cb * L);
      for (int r = 0; r < NB; ++r) {
        const Reg pr = V::set1(p[r * T + jj]);
        for (int cb = 0; cb < CB; ++cb) a[r][cb] = V::fmadd(pr, vv[cb], a[r][cb]);
      }
    }
    for (int r = 0; r < NB; ++r)
      for (int cb = 0; cb < CB; ++cb) V::store(acc + r * dv + c + cb * L, a[r][cb]);
  }

  // acc[r, :] += sum_jj p[r * T + jj] v_jj for NB rows, jj < n (v: key 0 of the tile).
  template <int NB, class E>
  static void weighted_values(const float* p, const E* v, int64_t vs, int64_t n, int64_t dv, float* acc,
                              int64_t pf) {
    constexpr int CB = kSpread<NB>;
    int64_t c = 0;
    for (; c + CB * L <= dv; c += CB * L) value_block<NB, CB>(p, v, vs, n, dv, c, acc, pf);
    for (; c + L <= dv; c += L) value_block<NB, 1>(p, v, vs, n, dv, c, acc, pf);
    for (; c < dv; ++c)
      for (int r = 0; r < NB; ++r) {
        float x = acc[r * dv + c];
        for (int64_t jj = 0; jj < n; ++jj) x += p[r * T + jj] * scalar(v[jj * vs + c]);
        acc[r * dv + c] = x;
      }
  }

  // tanh lane by lane, as Cephes' tanhf: an odd polynomial below |y| =
  // 0.625 (relative error ~1e-7, where 1 - e^-2|y| would cancel), above it
  // (1 - e) / (1 + e) with e = 2^(-2|y| log2 e) (0 far out: tanh = 1), the
  // sign restored.
  static Reg tanh(Reg y) {
    const Reg zero = V::zero(), one = V::set1(1.0f);
    const Reg a = V::max(y, V::sub(zero, y));
    const Reg e = V::exp2(V::mul(a, V::set1(-2.0f * kLog2e)));
    const Reg big = V::div(V::sub(one, e), V::add(one, e));
    const Reg z = V::mul(a, a);
    Reg q = V::set1(-5.70498872745e-3f);
    q = V::fmadd(q, z, V::set1(2.06390887954e-2f));
    q = V::fmadd(q, z, V::set1(-5.37397155531e-2f));
    q = V::fmadd(q, z, V::set1(1.33314422036e-1f));
    q = V::fmadd(q, z, V::set1(-3.33332819422e-1f));
    const Reg small = V::fmadd(V::mul(q, z), a, a);
    const Reg r = V::select_lt(a, V::set1(0.625f), small, big);
    return V::select_lt(y, zero, V::sub(zero, r), r);
  }

  // The score options on one row's tile sr:[T] (base 2, before the masks):
  // softcap cap2 (softcap * log2 e; 0: off), then, with `alibi`,
  // nslope2 * |rel - jj| (nslope2 = -slope_h * log2 e, rel = pos_q - the
  // tile's first key); iota:[T] holds 0, 1, .. T-1. Lanes past the chunk
  // are overwritten with -inf afterwards, whatever this makes of them.
  static void score_options(float* sr, float cap2, bool alibi, float nslope2, float rel, const float* iota) {
    const Reg zero = V::zero(), cap = V::set1(cap2), inv = V::set1(cap2 > 0.0f ? 1.0f / cap2 : 0.0f);
    const Reg ns = V::set1(nslope2), rv = V::set1(rel);
    for (int64_t jj = 0; jj < T; jj += L) {
      Reg x = V::load(sr + jj);
      if (cap2 > 0.0f) x = V::mul(cap, tanh(V::mul(x, inv)));
      if (alibi) {
        const Reg diff = V::sub(rv, V::load(iota + jj));
        x = V::fmadd(ns, V::max(diff, V::sub(zero, diff)), x);
      }
      V::store(sr + jj, x);
    }
  }

  template <class F>
  static void by_block(int64_t R, const F& f) {  // f(std::integral_constant<int, NB>, first row)
    int64_t r = 0;
    for (; r + kRowBlock <= R; r += kRowBlock) f(std::integral_constant<int, kRowBlock>{}, r);
    switch (R - r) {
      case 7: f(std::integral_constant<int, 7>{}, r); break;
      case 6: f(std::integral_constant<int, 6>{}, r); break;
      case 5: f(std::integral_constant<int, 5>{}, r); break;
      case 4: f(std::integral_constant<int, 4>{}, r); break;
      case 3: f(std::integral_constant<int, 3>{}, r); break;
      case 2: f(std::integral_constant<int, 2>{}, r); break;
      case 1: f(std::integral_constant<int, 1>{}, r); break;
      default: break;
    }
  }

  template <class E>
  static void run(const DecodeJob& job, const Task& t, float* partial, float* scratch) {
    const DecodeParams& p = *job.p;
    const int64_t d = p.d, dv = p.dv, Qn = p.Qn, G = p.group(), R = G * Qn;
    const int64_t K = p.lengths[t.b];
    // Positions [j0, j1); a ring's position j sits in slot p.slot(j), so a
    // tile stops where the slots wrap.
    const int64_t j0 = std::max(t.chunk * job.chunk_keys, p.held_from(t.b));
    const int64_t j1 = std::min(K, t.chunk * job.chunk_keys + job.chunk_keys);
    const E* kb = static_cast<const E*>(p.k) + t.b * p.k_stride_b + t.g * p.k_stride_h;
    const E* vb = static_cast<const E*>(p.v) + t.b * p.v_stride_b + t.g * p.v_stride_h;
    float* qs = scratch;     // [R, d], scaled to base 2 (bfloat16: split_pairs' column order)
    float* s = qs + R * d;   // [R, T]: scores, then weights
    float* acc = s + R * T;  // [R, dv]
    float* m = acc + R * dv; // [R]
    float* l = m + R;        // [R]
    for (int64_t r = 0; r < R; ++r) {
      const float* q = p.q + t.b * p.q_stride_b + (t.g * G + r / Qn) * p.q_stride_h + (r % Qn) * p.q_stride_i;
      if constexpr (std::is_same_v<E, uint16_t>) split_pairs(q, job.c2, d, qs + r * d);
      else
        for (int64_t c = 0; c < d; ++c) qs[r * d + c] = q[c] * job.c2;
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
    std::fill(acc, acc + R * dv, 0.0f);
    const float fill2 = p.masks.fill == MaskFill::Seed ? kMaskFill2 : -INFINITY;
    const uint8_t* keep = p.masks.keep_row(t.b, K);
    const float* bias = p.masks.bias_row(t.b, K);
    const float cap2 = p.masks.softcap > 0.0f ? p.masks.softcap * kLog2e : 0.0f;
    const float* slopes = p.masks.alibi_slopes;
    float iota[T];
    for (int64_t jj = 0; jj < T; ++jj) iota[jj] = static_cast<float>(jj);
    for (int64_t t0 = j0, n = 0; t0 < j1; t0 += n) {
      const int64_t s0 = p.slot(t0), room = p.capacity - s0;  // slots before the ring wraps
      n = std::min(std::min(T, j1 - t0), room);
      // Rows of the next tile that the first row block asks for along the
      // way (prefetch_row); bfloat16 only.
      int64_t pf = 0;
      if constexpr (std::is_same_v<E, uint16_t>) pf = std::max<int64_t>(0, std::min(std::min(T, j1 - t0 - T), room - T));
      by_block(R, [&](auto nb, int64_t r0) {
        scores<decltype(nb)::value>(qs + r0 * d, d, kb + s0 * p.k_stride_j, p.k_stride_j, n, s + r0 * T,
                                    r0 == 0 ? pf : 0);
      });
      for (int64_t r = 0; r < R; ++r) {
        float* sr = s + r * T;
        // Softcap and ALiBi on the scaled score, before every mask.
        if (cap2 > 0.0f || slopes) {
          const float nslope2 = slopes ? -slopes[t.g * G + r / Qn] * kLog2e : 0.0f;
          const auto rel = static_cast<float>(K - Qn + r % Qn - t0);  // pos_q - t0, exact below 2^24
          score_options(sr, cap2, slopes != nullptr, nslope2, rel, iota);
        }
        // key_padding_mask first (an additive entry on a kept key), then the
        // lengths: a key past its query's valid length gets the fill whatever
        // the mask says.
        if (keep || bias)
          for (int64_t jj = 0; jj < n; ++jj) {
            if (keep && !keep[t0 + jj]) sr[jj] = fill2;
            else if (bias) sr[jj] += bias[t0 + jj] * kLog2e;
          }
        const int64_t valid = p.valid_len(t.b, K, r % Qn);  // causal limit, window and the chapter's length
        for (int64_t jj = std::max<int64_t>(valid - t0, 0); jj < n; ++jj) sr[jj] = fill2;
        const int64_t first = p.first_key(K, r % Qn);  // the window's left side
        for (int64_t jj = 0; jj < std::min(first - t0, n); ++jj) sr[jj] = fill2;
        for (int64_t jj = n; jj < T; ++jj) sr[jj] = -INFINITY;  // past the chunk: weight 0
        Reg mx = V::load(sr);
        for (int64_t jj = L; jj < T; jj += L) mx = V::max(mx, V::load(sr + jj));
        float m_new = std::max(m[r], V::reduce_max(mx));
        if (m_new == -INFINITY) {  // every key so far dropped out (-inf fill or bias): nothing to add yet
          // ... unless a kept key scored NaN, which the maxima skipped: then
          // the row is NaN (a NaN key stays NaN under every mask), not masked.
          if (std::none_of(sr, sr + n, [](float x) { return std::isnan(x); })) {
            std::fill(sr, sr + T, 0.0f);
            continue;
          }
          m_new = std::numeric_limits<float>::quiet_NaN();
        }
        const Reg mn = V::set1(m_new);
        Reg sum = V::zero();
        for (int64_t jj = 0; jj < T; jj += L) {
          const Reg e = V::exp2(V::sub(V::load(sr + jj), mn));
          V::store(sr + jj, e);
          sum = V::add(sum, e);
        }
        // m[r] = -inf before the first tile: the factor is 0 (acc and l are 0).
        const float alpha = m[r] == -INFINITY ? 0.0f : std::exp2(m[r] - m_new);
        l[r] = l[r] * alpha + V::reduce_add(sum);
        m[r] = m_new;
        if (alpha != 1.0f)
          for (int64_t c = 0; c < dv; ++c) acc[r * dv + c] *= alpha;
      }
      by_block(R, [&](auto nb, int64_t r0) {
        weighted_values<decltype(nb)::value>(s + r0 * T, vb + s0 * p.v_stride_j, p.v_stride_j, n, dv,
                                             acc + r0 * dv, r0 == 0 ? pf : 0);
      });
    }
    const int64_t S = job.partial_stride();
    for (int64_t r = 0; r < R; ++r) {
      partial[r * S] = m[r];
      partial[r * S + 1] = l[r];
      std::copy(acc + r * dv, acc + (r + 1) * dv, partial + r * S + 2);
    }
  }

  static void chunk(const DecodeJob& job, const Task& t, float* partial, float* scratch) {
    if (job.p->dtype == CacheDtype::BF16) run<uint16_t>(job, t, partial, scratch);
    else run<float>(job, t, partial, scratch);
  }
};

template <class V>
constexpr DecodeIsaKernels decode_kernels() {
  return {V::kName, &DecodeKernel<V>::scratch_floats, &DecodeKernel<V>::chunk};
}

}  // namespace mha::kernels::decode
