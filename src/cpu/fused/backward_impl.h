// src/cpu/fused/backward_impl.h: the fused attention backward, written once
// over a vector type V and its tile sizes T, beside the forward
// (kernel_impl.h, whose score micro-kernel it reuses). Included by
// fused_<isa>.cpp inside its `#pragma GCC target` region.
//
// One chunk is one (batch row b, kv head hk), computed by one thread from
// start to end, running the query heads that read hk one after another in
// head order: no two chunks write the same gradient rows, so no atomics, and
// the result does not depend on the thread count. Per query head h of the
// chunk, with the forward's statistics (row_max2 m, row_sum l;
// kernels/params.h) and key limits n (fused_job.h):
//   D[i]   = dO[i] . O[i]                      (= rowsum(dP * P))
//   for each key tile J below the longest n, for each query tile I that
//   sees a key of J (some query's range [f, n) meets J, or masked keys carry weight)
//   (in a packed batch both cut at each document's first row, fused_job.h QueryTile):
//     P^T  = 2^(S^T - m) / l                   S^T as in the forward, with its masking pass;
//                                              the policy's weight in fully masked rows
//     dP^T = (v_J dO_I^T) * M                  M: dropout multipliers
//     dS^T = P^T (dP^T - D) / sqrt(d)          0 on masked keys (the mask assigns their
//                                              score) and in fully masked rows; times
//                                              1 - tanh^2 under a softcap
//     dv_J += (P^T * M) dO_I,  dk_J += dS^T q_I,  dq_I += dS_I k_J
//   keys past every limit: dk = 0, dv from the rows whose masked keys carry
//   weight (valid length 0, the uniform policy) in closed form.
//   With sinks: (b, h)'s share of dL/d sink_h = -sum_i 2^(sink - m_i) / l_i * D[i].
// Memory is linear: per thread, the kv head's k, v and gradient rows, one
// query head's q and dO packed (both row-major and, for the score products,
// transposed), dq, and a few tiles.

namespace mha::kernels::fused {

template <class V, class T>
struct BackwardKernel {
  using F = Kernel<V, T>;
  using Reg = typename V::Reg;
  static constexpr int L = F::L, NV = F::NV, MQ = F::MQ, NK = F::NK, MR = F::MR;

  static int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

  struct Shape {
    int64_t Q, d, dv, rows;  // rows: key rows packed (the longest length)
    int64_t qpad, dpad, dvpad;
  };
  static Shape shape_of(int64_t Q, int64_t d, int64_t dv, int64_t rows) {
    // qpad: a tile's U*L lanes from any i0 < Q (a packed batch's tiles
    // start at documents, not at multiples of MQ) stay inside the padded,
    // zeroed rows.
    return {Q, d, dv, rows, up(Q, MQ) + L, up(d, L), up(dv, L)};
  }

  struct Scratch {
    int64_t* slice;  // [1] unused tag slot (kept for the forward's layout rule)
    float *qT, *doT;  // [d, qpad], [dv, qpad]  transposed: lanes are queries
    float *qr, *dor;  // [qpad, dpad], [qpad, dvpad]
    float *kr, *vr;   // [rows, dpad], [rows, dvpad]
    float* dq;        // [qpad, dpad]
    float *D, *m, *linv, *nf, *lo, *w, *pm;  // [qpad] each; w: weight of a masked key, pm: 1 in a fully masked row
    int32_t *nf_int, *lo_int;                // [qpad] the key limits, the first keys
    float *pt, *dst, *mt, *kt;          // [NK, MQ]: P^T, dS^T, dropout multipliers, kept keys
    float* ct;                          // [NK, MQ]: the softcap's derivative 1 - tanh^2
    float* pos;                         // [qpad]: each query's diagonal key (ALiBi's)
    float* dvj;                         // [dvpad]: the tail's value gradient
    float *dk, *dv;                     // [rows, dpad], [rows, dvpad]: grad_k, grad_v of the kv head
  };
  static size_t scratch_floats(const Shape& s) {
    const int64_t n = 16 + up(s.d * s.qpad, 16) + up(s.dv * s.qpad, 16) + s.qpad * s.dpad +
                      s.qpad * s.dvpad + up(s.rows * s.dpad, 16) + up(s.rows * s.dvpad, 16) +
                      s.qpad * s.dpad + 10 * s.qpad + 5 * NK * MQ + s.dvpad + up(s.rows * s.dpad, 16) +
                      up(s.rows * s.dvpad, 16);
    return static_cast<size_t>(n);
  }
  static Scratch carve(float* p, const Shape& s) {
    Scratch r;
    r.slice = reinterpret_cast<int64_t*>(p); p += 16;
    r.qT = p; p += up(s.d * s.qpad, 16);
    r.doT = p; p += up(s.dv * s.qpad, 16);
    r.qr = p; p += s.qpad * s.dpad;
    r.dor = p; p += s.qpad * s.dvpad;
    r.kr = p; p += up(s.rows * s.dpad, 16);
    r.vr = p; p += up(s.rows * s.dvpad, 16);
    r.dq = p; p += s.qpad * s.dpad;
    r.D = p; p += s.qpad;
    r.m = p; p += s.qpad;
    r.linv = p; p += s.qpad;
    r.nf = p; p += s.qpad;
    r.lo = p; p += s.qpad;
    r.w = p; p += s.qpad;
    r.pm = p; p += s.qpad;
    r.nf_int = reinterpret_cast<int32_t*>(p); p += s.qpad;
    r.lo_int = reinterpret_cast<int32_t*>(p); p += s.qpad;
    r.pt = p; p += NK * MQ;
    r.dst = p; p += NK * MQ;
    r.mt = p; p += NK * MQ;
    r.kt = p; p += NK * MQ;
    r.ct = p; p += NK * MQ;
    r.pos = p; p += s.qpad;
    r.dvj = p; p += s.dvpad;
    r.dk = p; p += up(s.rows * s.dpad, 16);
    r.dv = p;
    return r;
  }

  // C[r, :] += sum_x A[x*ax + r*ar] * Bm[x, :] for R rows and CV vectors of
  // columns: the products whose output rows are keys (dv, dk) or queries
  // (dq), broadcasting one element of P^T or dS^T at a time.
  template <int R, int CV>
  static void rg_block(const float* A, int64_t ax, int64_t ar, const float* Bm, int64_t bs,
                       int64_t nx, float* C, int64_t cs) {
    Reg acc[R][CV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < CV; ++v) acc[r][v] = V::load(C + r * cs + v * L);
    for (int64_t x = 0; x < nx; ++x) {
      Reg b[CV];
      for (int v = 0; v < CV; ++v) b[v] = V::load(Bm + x * bs + v * L);
      for (int r = 0; r < R; ++r) {
        const Reg a = V::set1(A[x * ax + r * ar]);
        for (int v = 0; v < CV; ++v) acc[r][v] = V::fmadd(a, b[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < CV; ++v) V::store(C + r * cs + v * L, acc[r][v]);
  }
  template <int R, int CV>
  static void rg_cols(int cv, const float* A, int64_t ax, int64_t ar, const float* Bm, int64_t bs,
                      int64_t nx, float* C, int64_t cs) {
    if constexpr (CV >= 1) {
      if (cv == CV) return rg_block<R, CV>(A, ax, ar, Bm, bs, nx, C, cs);
      rg_cols<R, CV - 1>(cv, A, ax, ar, Bm, bs, nx, C, cs);
    }
  }
  template <int R>
  static void rg_rows(int rows, int cv, const float* A, int64_t ax, int64_t ar, const float* Bm,
                      int64_t bs, int64_t nx, float* C, int64_t cs) {
    if constexpr (R >= 1) {
      if (rows == R) return rg_cols<R, NV>(cv, A, ax, ar, Bm, bs, nx, C, cs);
      rg_rows<R - 1>(rows, cv, A, ax, ar, Bm, bs, nx, C, cs);
    }
  }
  // C:[rows, width] += A' Bm with A'[r, x] = A[x*ax + r*ar]; width a multiple
  // of L (padded), Bm:[nx, width] at row stride bs.
  static void rowgemm(const float* A, int64_t ax, int64_t ar, int64_t rows, const float* Bm,
                      int64_t bs, int64_t width, int64_t nx, float* C, int64_t cs) {
    const int64_t vectors = width / L;
    for (int64_t r0 = 0; r0 < rows; r0 += MR) {
      const int r = static_cast<int>(F::lmin(MR, rows - r0));
      for (int64_t v0 = 0; v0 < vectors; v0 += NV) {
        const int cv = static_cast<int>(F::lmin(NV, vectors - v0));
        rg_rows<MR>(r, cv, A + r0 * ar, ax, ar, Bm + v0 * L, bs, nx, C + r0 * cs + v0 * L, cs);
      }
    }
  }

  // x rows [0, n) of one (b, h) (row stride xs, width w) -> row-major dst at
  // stride wpad (zero padded), and, when dT is set, transposed into
  // dT[c, i] at stride tstride; rows [n, rows_to) of both zeroed.
  static void pack(const float* x, int64_t xs, int64_t n, int64_t w, int64_t wpad, float* dst,
                   int64_t rows_to, float* dT, int64_t tstride) {
    for (int64_t r = 0; r < n; ++r) F::prefetch_row(x + r * xs, w);
    for (int64_t r = 0; r < n; ++r) {
      const float* src = x + r * xs;
      float* out = dst + r * wpad;
      for (int64_t c = 0; c < w; ++c) out[c] = src[c];
      for (int64_t c = w; c < wpad; ++c) out[c] = 0.0f;
      if (dT)
        for (int64_t c = 0; c < w; ++c) dT[c * tstride + r] = src[c];
    }
    for (int64_t r = n; r < rows_to; ++r)
      for (int64_t c = 0; c < wpad; ++c) dst[r * wpad + c] = 0.0f;
    if (dT)
      for (int64_t c = 0; c < w; ++c)
        for (int64_t r = n; r < rows_to; ++r) dT[c * tstride + r] = 0.0f;
  }

  // The key ranges of queries [i0, i0 + mq) (F::Bounds), the fewest keys in
  // one query's range, and whether some query's masked keys carry weight or
  // it is fully masked.
  struct Range : F::Bounds {
    int64_t single = INT64_MAX;
    bool weighted_mask = false, any_policy = false;
  };
  static Range range_of(const Scratch& s, int64_t i0, int64_t mq) {
    Range r;
    r.end = 0;
    r.shortest = INT64_MAX;
    r.first = INT64_MAX;
    r.first_max = 0;
    for (int64_t i = i0; i < i0 + mq; ++i) {
      const int64_t n = s.nf_int[i], f = s.lo_int[i];
      r.end = F::lmax(r.end, n);
      r.shortest = F::lmin(r.shortest, n);
      if (n > f) r.first = F::lmin(r.first, f);
      r.first_max = F::lmax(r.first_max, f);
      r.single = F::lmin(r.single, n - f);
      r.weighted_mask = r.weighted_mask || s.w[i] != 0.0f;
      r.any_policy = r.any_policy || s.pm[i] != 0.0f;
    }
    if (r.first == INT64_MAX) r.first = 0;
    return r;
  }

  template <int U, bool kNat>
  static void tile(const AttentionBackward& p, const BackwardJob& job, const Shape& sh,
                   const Scratch& s, int64_t b, int64_t h, int64_t j0, int64_t nk, int64_t i0,
                   int64_t mq, const Range& kv, bool any_policy, float* dkj, float* dvj) {
    const int64_t Q = sh.Q, K = p.K();
    const MaskJob& mj = job.mask;
    const bool tile_mask = mj.tile_mask[b] != 0;
    Reg nfv[U], mv[U], lv[U], Dv[U], pmv[U];
    for (int v = 0; v < U; ++v) {
      nfv[v] = V::load(s.nf + i0 + v * L);
      mv[v] = V::load(s.m + i0 + v * L);
      lv[v] = V::load(s.linv + i0 + v * L);
      Dv[v] = V::load(s.D + i0 + v * L);
      pmv[v] = V::load(s.pm + i0 + v * L);
    }
    const Reg fill = V::set1(mj.fill), zero = V::zero(), one_half = V::set1(0.5f);
    const Reg policy = V::set1(mj.policy);
    // P^T = 2^(S^T - m) / l, masked keys at the fill (weight 0 unless the
    // row's masked keys carry weight), the policy's weight in fully masked
    // rows.
    const bool mask = kv.masks(j0, nk);
    const bool capped = mj.cap > 0.0f;
    F::template qk_tile<U, false>(s.kr, sh.dpad, sh.d, s.qT + i0, sh.qpad, j0, nk, mask && !mj.scores, nfv,
                                  s.lo + i0, V::set1(mj.scores ? mj.score_scale(job.c2) : job.c2), fill, s.pt, nullptr);
    if (mj.scores)  // the score pass masks the range itself
      F::template score_tile<U>(mj, h, s.pos + i0, j0, nk, mask, nfv, s.lo + i0, fill, s.pt,
                                capped ? s.ct : nullptr);
    if (tile_mask) F::mask_tile(mj, b, h, i0, mq, K, j0, nk, s.nf_int + i0, s.lo_int + i0, s.pt, nullptr, s.kt);
    for (int64_t r = 0; r < nk; ++r)
      for (int v = 0; v < U; ++v) {
        float* x = s.pt + r * MQ + v * L;
        Reg w = V::mul(V::exp2(F::template to_base2<kNat>(V::sub(V::load(x), mv[v]))), lv[v]);
        if (any_policy) w = V::select_lt(one_half, pmv[v], policy, w);
        V::store(x, w);
      }
    // dP^T = v_J dO^T (times M below).
    F::template qk_tile<U, false>(s.vr, sh.dvpad, sh.dv, s.doT + i0, sh.qpad, j0, nk, false, nfv, s.lo + i0,
                                  V::set1(1.0f), fill, s.dst, nullptr);
    const bool drop = p.fwd.dropout.active();
    if (drop) {
      const uint64_t row0 = static_cast<uint64_t>(((b * p.H() + h) * Q + i0) * K);
      for (int64_t r = 0; r < nk; ++r)
        for (int64_t i = 0; i < mq; ++i) {
          const float mult = p.fwd.dropout.multiplier(row0 + i * K + j0 + r);
          s.mt[r * MQ + i] = mult;
          s.dst[r * MQ + i] *= mult;
        }
    }
    // dS^T = P^T (dP^T - D) / sqrt(d) on kept keys, 0 on masked ones and in
    // fully masked rows (the policy's weights are constants), and 0 in rows
    // with a single live key and weightless masked keys: that key's weight
    // is 1 whatever its score, so the exact gradient is 0 (dP - D would
    // leave float32 rounding).
    const Reg inv_scale = V::set1(1.0f / p.fwd.scale_divisor), one_and_half = V::set1(1.5f);
    // (kv.single: the fewest keys in a lane's range, read below as n - f.)
    // (Not with sinks: a single key then shares the row with the sink.)
    const bool single = kv.single <= 1 && !p.stats_span_more_keys && !mj.sinks;
    for (int64_t r = 0; r < nk; ++r) {
      const Reg jv = V::set1(static_cast<float>(j0 + r));
      for (int v = 0; v < U; ++v) {
        float* x = s.dst + r * MQ + v * L;
        const Reg pt = V::load(s.pt + r * MQ + v * L);
        Reg ds = V::mul(V::mul(pt, V::sub(V::load(x), Dv[v])), inv_scale);
        if (capped) ds = V::mul(ds, V::load(s.ct + r * MQ + v * L));  // the softcap's chain rule
        if (mask) ds = V::select_lt(jv, V::load(s.lo + i0 + v * L), zero, V::select_lt(jv, nfv[v], ds, zero));
        if (tile_mask) ds = V::select_lt(one_half, V::load(s.kt + r * MQ + v * L), ds, zero);
        if (single) {
          const Reg weighted_mask = V::select_lt(zero, V::load(s.w + i0 + v * L), ds, zero);
          ds = V::select_lt(one_and_half, V::sub(nfv[v], V::load(s.lo + i0 + v * L)), ds, weighted_mask);
        }
        if (any_policy) ds = V::select_lt(one_half, pmv[v], zero, ds);
        V::store(x, ds);
      }
    }
    if (drop)
      for (int64_t r = 0; r < nk; ++r)
        for (int64_t i = 0; i < mq; ++i) s.pt[r * MQ + i] *= s.mt[r * MQ + i];
    // dv_J += (P^T M) dO_I;  dk_J += dS^T q_I;  dq_I += dS k_J.
    rowgemm(s.pt, 1, MQ, nk, s.dor + i0 * sh.dvpad, sh.dvpad, sh.dvpad, mq, dvj, sh.dvpad);
    rowgemm(s.dst, 1, MQ, nk, s.qr + i0 * sh.dpad, sh.dpad, sh.dpad, mq, dkj, sh.dpad);
    rowgemm(s.dst, MQ, 1, mq, s.kr + j0 * sh.dpad, sh.dpad, sh.dpad, nk, s.dq + i0 * sh.dpad, sh.dpad);
  }

  static void chunk(const BackwardJob& job, int64_t chunk_index, float* scratch) {
    if (job.mask.natural) return chunk_as<true>(job, chunk_index, scratch);
    chunk_as<false>(job, chunk_index, scratch);
  }

  // One (b, kv head hk): its key rows packed once, then each query head of
  // the group in order, accumulating grad_k and grad_v of hk.
  //
  // A packed batch whose masked keys carry no weight (the -inf fill and the
  // zeros policy: FlashAttention's, mha.torch.attention's; BackwardJob::
  // segments) has a chunk per (document, kv head) instead, documents outer:
  // the document's key rows, then per head its query rows, packed, computed
  // and written, as calls on each document alone. One chunk per kv head
  // swept each head's quarter-KiB of every 2 KiB row of q, dO, out and
  // the gradients (h8 d64) across all documents, head after head: forward
  // and backward measured 1.10-1.12x its documents one by one, in this order
  // 1.00-1.01x (B8 lengths averaging 40% of 1024, h8 d64 causal, one
  // thread, CPU time, medians of 21). The tiles and their order are
  // those of the whole row (there a document's tiles skip every other
  // document's), so the gradients are bitwise the same.
  template <bool kNat>
  static void chunk_as(const BackwardJob& job, int64_t chunk_index, float* scratch) {
    const AttentionBackward& p = *job.p;
    const MaskJob& mj = job.mask;
    const int64_t H = p.H(), Hkv = p.Hkv(), G = H / Hkv, Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
    const bool segments = job.segments;
    const int64_t b = segments ? 0 : chunk_index / Hkv, hk = chunk_index % Hkv;
    const int64_t x = segments ? chunk_index / Hkv : 0;  // the document
    const int64_t rows = job.kv_rows[b];
    const Shape sh = shape_of(Q, d, dv, job.pack_rows);
    const Scratch s = carve(scratch, sh);
    const int64_t* docs = mj.m->doc_offsets;
    // Queries [qs, qe) and key rows [ks, ke) of the chunk, its query tiles
    // [t_begin, t_end) (job.tiles, in row order).
    const int64_t qs = segments ? docs[x] : 0, qe = segments ? docs[x + 1] : Q;
    const int64_t ks = F::lmin(qs, rows), ke = segments ? F::lmin(qe, rows) : rows;
    int64_t t_begin = 0;
    while (t_begin < job.tiles.count && job.tiles.at(t_begin).i0 < qs) ++t_begin;
    int64_t t_end = t_begin;
    while (t_end < job.tiles.count && job.tiles.at(t_end).i0 < qe) ++t_end;

    // Keys past every key limit: no gradient through their (assigned)
    // scores; their values are weighted only by rows whose masked keys carry
    // weight (below, never in segments), summed over the group's heads.
    for (int64_t j = F::lmax(rows, qs); j < (segments ? qe : K); ++j) {
      float* gk = p.grad_k.ptr(b, hk, j);
      float* gv = p.grad_v.ptr(b, hk, j);
      for (int64_t c = 0; c < d; ++c) gk[c] = 0.0f;
      for (int64_t c = 0; c < dv; ++c) gv[c] = 0.0f;
    }
    if (qe == qs) return;
    const int32_t* n_valid = job.n_valid + b * Q;
    const int32_t* first = job.first + b * Q;
    // Rows a tile's U*L lanes read past qe: zeroed (in segments the next
    // document's rows, which its own chunk packs).
    const int64_t pad_to = segments ? F::lmin(sh.qpad, qe + L) : sh.qpad;
    for (int64_t i = qs; i < pad_to; ++i) {
      s.nf_int[i] = i < qe ? n_valid[i] : 0;
      s.lo_int[i] = i < qe ? first[i] : 0;
      s.pos[i] = static_cast<float>(mj.m->diagonal(i, Q, K));
    }

    std::vector<Range> ranges(static_cast<size_t>(job.tiles.count));  // per query tile, of one head
    if (ke > ks) {
      pack(p.fwd.k.ptr(b, hk, ks), p.fwd.k.stride[2], ke - ks, d, sh.dpad, s.kr + ks * sh.dpad, ke - ks, nullptr, 0);
      pack(p.fwd.v.ptr(b, hk, ks), p.fwd.v.stride[2], ke - ks, dv, sh.dvpad, s.vr + ks * sh.dvpad, ke - ks, nullptr, 0);
    }
    for (int64_t e = ks * sh.dpad; e < ke * sh.dpad; ++e) s.dk[e] = 0.0f;
    for (int64_t e = ks * sh.dvpad; e < ke * sh.dvpad; ++e) s.dv[e] = 0.0f;

    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hk * G + g;
      pack(p.fwd.q.ptr(b, h, qs), p.fwd.q.stride[2], qe - qs, d, sh.dpad, s.qr + qs * sh.dpad, pad_to - qs,
           s.qT + qs, sh.qpad);
      pack(p.grad_out.ptr(b, h, qs), p.grad_out.stride[2], qe - qs, dv, sh.dvpad, s.dor + qs * sh.dvpad,
           pad_to - qs, s.doT + qs, sh.qpad);
      const int64_t base = (b * H + h) * Q;
      for (int64_t i = qs; i < pad_to; ++i) {
        const bool real = i < qe;
        // D = dO . O, accumulated in the order and with the rounding of the
        // score micro-kernel's dP = dO . v: where a row has one live key
        // (O = v exactly), dP - D is then exactly 0, as the true gradient.
        Reg dot = V::zero();
        if (real) {
          const float* o = p.fwd.out.ptr(b, h, i);
          const float* gr = s.dor + i * sh.dvpad;
          for (int64_t c = 0; c < dv; ++c) dot = V::fmadd(V::set1(o[c]), V::set1(gr[c]), dot);
        }
        float lanes[L];
        V::store(lanes, dot);
        s.D[i] = lanes[0];
        // A fully masked row (the forward's row_max2 = -inf): the policy's
        // weight on every key, no gradient to the scores.
        const bool policy = real && job.row_max2[base + i] == -__builtin_inff();
        s.pm[i] = policy ? 1.0f : 0.0f;
        s.m[i] = real && !policy ? job.row_max2[base + i] : 0.0f;
        s.linv[i] = real && !policy ? 1.0f / job.row_sum[base + i] : 0.0f;
        s.nf[i] = real ? static_cast<float>(n_valid[i]) : 0.0f;
        s.lo[i] = real ? static_cast<float>(first[i]) : 0.0f;
        // The weight of a key past the row's limit: 0 under the -inf fill,
        // else 0 unless the row's max is near the fill.
        float w = 0.0f;
        if (policy) w = mj.policy;
        else if (real && !mj.neg_inf) w = std::exp2((mj.fill - s.m[i]) * mj.unit) * s.linv[i];
        s.w[i] = w;
      }
      for (int64_t e = qs * sh.dpad; e < pad_to * sh.dpad; ++e) s.dq[e] = 0.0f;
      if (mj.sinks) {
        // dL/d sink_h, this row's share: -sum_i exp(sink - lse_i) * D_i, the
        // sink's weight from the statistics (which include it).
        const float t = mj.sinks[h] * mj.score_unit;
        double acc = 0.0;
        for (int64_t i = qs; i < qe; ++i)
          acc -= static_cast<double>(std::exp2((t - s.m[i]) * mj.unit) * s.linv[i]) * s.D[i];
        job.sink_part[(segments ? x : b) * H + h] = acc;
      }

      // Each query tile's range once per head, not per (key tile, query
      // tile): in a packed batch of T rows that pair loop is (T / NK) x
      // (T / MQ) long, most pairs skipped, and range_of reads MQ queries.
      for (int64_t t = t_begin; t < t_end; ++t) {
        const QueryTile qt = job.tiles.at(t);
        ranges[static_cast<size_t>(t)] = range_of(s, qt.i0, qt.mq);
      }
      // Key tiles of NK keys from each document's first row (from 0 without
      // documents), and query tiles as the forward's (job.tiles): in a packed
      // batch no tile holds two documents, as in calls on each alone.
      int64_t doc = 0;  // the document of key j0
      for (int64_t j0 = ks, nk = 0; j0 < ke; j0 += nk) {
        nk = F::lmin(NK, ke - j0);
        if (docs) {
          while (docs[doc + 1] <= j0) ++doc;
          nk = F::lmin(nk, docs[doc + 1] - j0);
        }
        for (int64_t t = t_begin; t < t_end; ++t) {
          const QueryTile qt = job.tiles.at(t);
          const int64_t i0 = qt.i0, mq = qt.mq;
          const Range& kv = ranges[static_cast<size_t>(t)];
          // Every key here masked, at weight 0.
          if ((j0 >= kv.end || j0 + nk <= kv.first) && !kv.weighted_mask) continue;
          F::template dispatch_used<NV>(F::used_vectors(mq), [&](auto u) {
            tile<decltype(u)::value, kNat>(p, job, sh, s, b, h, j0, nk, i0, mq, kv, kv.any_policy,
                                           s.dk + j0 * sh.dpad, s.dv + j0 * sh.dvpad);
          });
        }
      }
      // Values past every limit: from the rows whose masked keys carry
      // weight (none in segments: their masked keys weigh 0).
      const uint64_t row0 = static_cast<uint64_t>(base * K);
      float* acc = s.dvj;  // [dv]
      if (!segments && rows < K && !p.fwd.dropout.active()) {
        for (int64_t c = 0; c < dv; ++c) acc[c] = 0.0f;
        for (int64_t i = 0; i < Q; ++i)
          if (s.w[i] != 0.0f)
            for (int64_t c = 0; c < dv; ++c) acc[c] += s.w[i] * s.dor[i * sh.dvpad + c];
      }
      for (int64_t j = rows; j < K && !segments; ++j) {
        float* gv = p.grad_v.ptr(b, hk, j);
        if (p.fwd.dropout.active()) {
          for (int64_t c = 0; c < dv; ++c) acc[c] = 0.0f;
          for (int64_t i = 0; i < Q; ++i) {
            if (s.w[i] == 0.0f) continue;
            const float wm = s.w[i] * p.fwd.dropout.multiplier(row0 + i * K + j);
            for (int64_t c = 0; c < dv; ++c) acc[c] += wm * s.dor[i * sh.dvpad + c];
          }
        }
        for (int64_t c = 0; c < dv; ++c) gv[c] += acc[c];
      }
      for (int64_t i = qs; i < qe; ++i) {
        float* gq = p.grad_q.ptr(b, h, i);
        for (int64_t c = 0; c < d; ++c) gq[c] = s.dq[i * sh.dpad + c];
      }
    }
    for (int64_t r = ks; r < ke; ++r) {
      float* gk = p.grad_k.ptr(b, hk, r);
      float* gv = p.grad_v.ptr(b, hk, r);
      for (int64_t c = 0; c < d; ++c) gk[c] = s.dk[r * sh.dpad + c];
      for (int64_t c = 0; c < dv; ++c) gv[c] = s.dv[r * sh.dvpad + c];
    }
  }
};

}  // namespace mha::kernels::fused
