// src/cpu/fused/kernel_impl.h: the fused attention kernel, written once over
// a vector type V (simd_*.h) and its tile sizes T (traits.h).
//
// Included by fused_<isa>.cpp inside that file's target region (a GCC pragma
// or a clang attribute), so every function here is compiled for one
// instruction set; everything is a
// member of the class template Kernel<V, T>, so each set's code has its own
// symbols and nothing compiled for AVX-512 can be picked by the linker for a
// caller on a CPU without it. Calls out of this file go only to inline code
// of headers included before the region (compiled for the baseline target).
//
// One chunk is (batch row b, head h, query tile [i0, i0 + mq)): tiles of MQ
// queries, in a packed batch cut at each document's first row (fused_job.h
// QueryTile). Per chunk:
//   k, v rows of (b, kv head of h) below the longest key limit n
//                                                   packed once per thread and slice
//   Q^T[c, i]  = q[b, h, i0 + i, c]                 packed once per chunk
//   for each key tile [j0, j0 + NK) from the one holding the tile's
//   smallest first key f (tiles counted from its document's first row) to
//   its largest key limit n:
//     S^T[j, i] = (k[j] . q[i]) * log2(e) / sqrt(d), or -inf unless f[i] <= j < n[i]
//     (score pass, only with a softcap or ALiBi slopes: S^T -> cap tanh(S^T / cap)
//      - slope |i + K - Q - j|, score_tile)
//     (masking pass, only for rows with boolean holes or additive masks:
//      S^T[j, i] += bias on kept keys, the fill on masked ones; a call with
//      an additive mask keeps natural scores, MaskJob::natural)
//     m_new = max(m, max_j S^T[j, i]);  c = 2^(m - m_new)
//     P^T = 2^(S^T - m_new);  l = l * c + sum_j P^T;  P^T *= dropout
//     O^T[:, i] = O^T[:, i] * c + v^T P^T
//   masked keys [0, f) and [n, K) with non-zero weight (valid length 0): added in closed form
//   with sinks: the head's sink joins m and l as one more key with no value
//   (then no row is fully masked)
//   fully masked rows (kernels/masked_row.h): the policy, marked row_max2 = -inf
//   out[b, h, i0 + i] = O^T[:, i] / l;   row_max2 = m, row_sum = l
// n (ForwardJob::n_valid) folds lengths, causality and the last kept key in,
// and f (ForwardJob::first) the first key a query may see, so the tiles past
// every query's n or before every query's f are never computed: causal,
// padding and window masks skip whole tiles.
// The order of every sum is fixed by the tiling alone, so the result does not
// depend on which thread runs the chunk.

namespace mha::kernels::fused {

template <class V, class T>
struct Kernel {
  using Reg = typename V::Reg;
  static constexpr int L = T::kLanes;
  static constexpr int NV = T::kQueryVectors;
  static constexpr int MQ = L * NV;  // queries per chunk
  static constexpr int NK = T::kKeyTile;
  static constexpr int MR = T::kBlockRows;
  static_assert(V::kLanes == T::kLanes && V::kRegisters == T::kRegisters);

  static int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }
  static int64_t lmax(int64_t a, int64_t b) { return a > b ? a : b; }
  static int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

  // Per-thread scratch, each array 64-byte aligned when the base is. It
  // starts with a tag naming the (b, h) slice packed in kp/vp, zeroed by the
  // dispatcher before the first chunk: consecutive chunks of a thread mostly
  // share (b, h), and pack its keys and values once.
  struct Scratch {
    int64_t* slice;  // [2]        b*Hkv + kv head + 1 of the packed slice, 0: none; its document + 1 or 0
    float* qt;       // [d, MQ]    Q^T
    float* st;       // [NK, MQ]   S^T, then P^T
    float* ot;       // [dv, MQ]   O^T, unnormalised
    float* m;        // [MQ]       running max (base 2)
    float* l;        // [MQ]       running sum
    float* nf;       // [MQ]       valid key count, as float
    float* kept;     // [MQ]       keys kept (the fully-masked test)
    float* vsum;     // [dv]       masked-key value sum (closed-form tail)
    float* kp;       // [rows, d]  the slice's key rows, packed
    float* vp;       // [rows, dv] the slice's value rows, packed
    float* lo;       // [MQ]       first key, as float (after the arrays above: they keep their offsets)
    float* pos;      // [MQ]       each lane's query's diagonal key, as float (ALiBi's)
  };
  static size_t scratch_floats(int64_t d, int64_t dv, int64_t rows) {
    return static_cast<size_t>(16 + round16(d * MQ) + round16(NK * MQ) + round16(dv * MQ) +
                               6 * round16(MQ) + round16(dv) + round16(rows * d) + round16(rows * dv));
  }
  static Scratch carve(float* s, int64_t d, int64_t dv, int64_t rows) {
    Scratch r;
    r.slice = reinterpret_cast<int64_t*>(s); s += 16;
    r.qt = s; s += round16(d * MQ);
    r.st = s; s += round16(NK * MQ);
    r.ot = s; s += round16(dv * MQ);
    r.m = s; s += round16(MQ);
    r.l = s; s += round16(MQ);
    r.nf = s; s += round16(MQ);
    r.kept = s; s += round16(MQ);
    r.vsum = s; s += round16(dv);
    r.kp = s; s += round16(rows * d);
    r.vp = s; s += round16(rows * dv);
    r.lo = s; s += round16(MQ);
    r.pos = s;
    return r;
  }

  // Copies rows [0, rows) of one (b, h) of x (row stride xs, width w) to
  // dst (row stride w). The projections hold a head's rows H*d or 3*H*d
  // floats apart, each on its own page: read in place, every key tile would
  // miss in the TLB and in cache sets that the stride aliases, again for
  // every query tile. Packed, the slice is contiguous and stays in L2 for
  // the thread's next chunks (measured ~10% faster at K = 2048, d = 64).
  static void pack_rows(const float* x, int64_t xs, int64_t rows, int64_t w, float* dst) {
    constexpr int64_t kAhead = 16;  // rows in flight
    for (int64_t r = 0; r < rows && r < kAhead; ++r) prefetch_row(x + r * xs, w);
    for (int64_t r = 0; r < rows; ++r) {
      if (r + kAhead < rows) prefetch_row(x + (r + kAhead) * xs, w);
      const float* src = x + r * xs;
      float* out = dst + r * w;
      for (int64_t c = 0; c < w; ++c) out[c] = src[c];
    }
  }

  static void prefetch_row(const float* row, int64_t n) {
    for (int64_t c = 0; c < n; c += 16) __builtin_prefetch(row + c, 0, 3);
  }

  // Q^T[c, i] = q[b, h, i0 + i, c]; lanes from the last query up to `lanes`
  // are 0.
  static void pack_queries(const TensorView& q, int64_t b, int64_t h, int64_t i0, int64_t mq,
                           int64_t lanes, int64_t d, float* qt) {
    // The rows are on different pages: ask for all of them first, so that
    // their misses overlap instead of queueing one row at a time.
    for (int64_t i = 0; i < mq; ++i) prefetch_row(q.ptr(b, h, i0 + i), d);
    for (int64_t i = 0; i < mq; ++i) {
      const float* row = q.ptr(b, h, i0 + i);
      for (int64_t c = 0; c < d; ++c) qt[c * MQ + i] = row[c];
    }
    for (int64_t c = 0; c < d; ++c)
      for (int64_t i = mq; i < lanes; ++i) qt[c * MQ + i] = 0.0f;
  }

  // The key range of a query tile, from its queries' ranges [f, n).
  struct Bounds {
    int64_t end;         // the largest n: no key at or past it is seen
    int64_t shortest;    // the smallest n: keys below it need no upper masking
    int64_t first;       // the smallest f of the queries that see a key: none before it is seen
    int64_t first_max;   // the largest f: keys at or past it need no lower masking
    // Whether keys [j0, j0 + nk) need the range compare (some key outside a lane's range).
    bool masks(int64_t j0, int64_t nk) const { return j0 + nk > shortest || j0 < first_max; }
    // The key tile of size `tile` to start from, tiles counted from key0 <=
    // first (QueryTile::key0: a document's first row, else 0).
    // (A first below key0 (no query sees a key) falls back to multiples of tile.)
    int64_t start(int64_t tile, int64_t key0 = 0) const {
      return first >= key0 ? key0 + (first - key0) / tile * tile : first / tile * tile;
    }
  };
  // nf[i], lo[i] = key limit n and first key f of query i0 + i (0 for lanes
  // past the last query, which therefore see no key).
  static Bounds load_bounds(const int32_t* n_valid, const int32_t* first, int64_t mq, float* nf, float* lo) {
    Bounds r{0, INT64_MAX, INT64_MAX, 0};
    for (int64_t i = 0; i < MQ; ++i) {
      const int64_t n = i < mq ? n_valid[i] : 0, f = i < mq ? first[i] : 0;
      nf[i] = static_cast<float>(n);
      lo[i] = static_cast<float>(f);
      r.end = lmax(r.end, n);
      if (i < mq) r.shortest = lmin(r.shortest, n);
      if (n > f) r.first = lmin(r.first, f);
      r.first_max = lmax(r.first_max, f);
    }
    if (r.first == INT64_MAX) r.first = 0;
    return r;
  }

  // The masking pass over keys [j0, j0 + nk) of S^T, for lanes i < mq and
  // keys in the lane's range [f, n) (qk_tile set those outside it): a key a
  // boolean mask drops scores the fill, a kept one gets its additive masks
  // (there are some only in natural mode, MaskJob::natural, so no scaling).
  // S^T is [key, query], so pair masks are read along
  // their rows, one query at a time. kept[i] += the lane's kept keys; kt,
  // when set, gets 1 on kept keys and 0 elsewhere (every lane of the tile).
  static void mask_tile(const MaskJob& mj, int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t K,
                        int64_t j0, int64_t nk, const int32_t* n_valid, const int32_t* first,
                        float* st, float* kept, float* kt) {
    const MaskOptions& m = *mj.m;
    const uint8_t* kk = m.key_keep ? m.keep_row(b, K) + j0 : nullptr;
    const float* kb = m.key_bias ? m.bias_row(b, K) + j0 : nullptr;
    if (kt)
      for (int64_t x = 0; x < nk * MQ; ++x) kt[x] = 0.0f;
    for (int64_t i = 0; i < mq; ++i) {
      const int64_t end = lmin(nk, n_valid[i] - j0);  // keys of the tile below n
      const int64_t begin = lmax(0, first[i] - j0);   // and from f
      if (end <= begin) continue;
      const int64_t off = m.pair_offset(b, h, i0 + i, K) + j0;
      const uint8_t* pk = m.pair_keep ? m.pair_keep + off : nullptr;
      const float* pb = m.pair_bias ? m.pair_bias + off : nullptr;
      float count = 0.0f;
      for (int64_t r = begin; r < end; ++r) {
        const bool keep = (!kk || kk[r]) && (!pk || pk[r]);
        float& x = st[r * MQ + i];
        if (!keep) {
          x = mj.fill;
        } else if (mj.natural) {  // as the reference: (s + key bias) + pair bias
          if (kb) x += kb[r];
          if (pb) x += pb[r];
        }
        count += keep ? 1.0f : 0.0f;
        if (kt) kt[r * MQ + i] = keep ? 1.0f : 0.0f;
      }
      if (kept) kept[i] += count;
    }
  }

  // cap * tanh(y) lane by lane: Eigen's rational approximation of tanh (odd
  // degree 13 over even degree 6, y clamped to +-7.905, where it reaches 1
  // in float32; a few ulp, relative error ~1e-7 near 0), the numerator's
  // coefficients times cap, the division a refined reciprocal estimate
  // (V::rcp), the 1 / cap folded into the score's scale. Against Cephes'
  // tanhf (an exponential, a division and a polynomial, selected by |y|)
  // the softcap's cost in the fused forward went from 16% to 9% (B8 L512
  // d64 h12, softcap 50, one thread, thread CPU time, best of 15; the bench
  // rows of `mha bench --masks`).
  // The coefficients, made once per tile (a float read through a pointer
  // could alias the tile being written, so the compiler would not hoist
  // them itself).
  struct CappedTanh {
    Reg p[7], q[4], hi, lo;
    explicit CappedTanh(float cap) {
      const float pc[7] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                           5.12229709037114e-08f,  1.48572235717979e-05f, 6.37261928875436e-04f,
                           4.89352455891786e-03f};
      const float qc[4] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f,
                           4.89352518554385e-03f};
      for (int x = 0; x < 7; ++x) p[x] = V::set1(pc[x] * cap);
      for (int x = 0; x < 4; ++x) q[x] = V::set1(qc[x]);
      hi = V::set1(7.90531110763549805f);
      lo = V::set1(-7.90531110763549805f);
    }
    Reg operator()(Reg y) const {
      // (min and max return their second operand on NaN: a NaN score stays NaN, as in the reference.)
      const Reg x = V::max(lo, V::min(hi, y));
      const Reg x2 = V::mul(x, x);
      Reg n = p[0];
      for (int c = 1; c < 7; ++c) n = V::fmadd(n, x2, p[c]);
      Reg d = q[0];
      for (int c = 1; c < 4; ++c) d = V::fmadd(d, x2, q[c]);
      return V::mul(V::mul(n, x), V::rcp(d));  // d >= 4.9e-3: a normal number
    }
  };

  // The score pass (MaskJob::scores) over keys [j0, j0 + nk) of S^T, lanes
  // the queries whose i + K - Q are pos:[U*L]: in the job's units, the
  // softcap x -> cap * tanh(x / cap) (S^T computed at MaskJob::score_scale,
  // so x / cap on entry), then ALiBi's -slope_h * |i + K - Q - j|;
  // then, when `mask`, keys outside a lane's range [lo, n) set to `masked`
  // (the caller's qk_tile left them unmasked, so that the options never see
  // a masked value). dcap, when set, gets 1 - tanh^2 ([NK, MQ]: the
  // backward's chain rule). Runs only when an option is on: a call without
  // them never enters it.
  // mx, when set, gets the running max of the results (the forward without
  // a masking pass: no second pass over the tile).
  template <int U>
  static void score_tile(const MaskJob& mj, int64_t h, const float* pos, int64_t j0, int64_t nk, bool mask,
                         const Reg* nfv, const float* lo, Reg masked, float* st, float* dcap, Reg* mx = nullptr) {
    if (mj.cap > 0.0f) {
      if (mj.slopes) return score_tile_as<U, true, true>(mj, h, pos, j0, nk, mask, nfv, lo, masked, st, dcap, mx);
      return score_tile_as<U, true, false>(mj, h, pos, j0, nk, mask, nfv, lo, masked, st, dcap, mx);
    }
    score_tile_as<U, false, true>(mj, h, pos, j0, nk, mask, nfv, lo, masked, st, dcap, mx);
  }
  template <int U, bool kCap, bool kAlibi>
  static void score_tile_as(const MaskJob& mj, int64_t h, const float* pos, int64_t j0, int64_t nk, bool mask,
                            const Reg* nfv, const float* lo, Reg masked, float* st, float* dcap, Reg* mx) {
    const Reg zero = V::zero(), one = V::set1(1.0f);
    const Reg inv_cap = V::set1(kCap ? 1.0f / mj.cap : 0.0f);
    const CappedTanh capped_tanh(kCap ? mj.cap : 1.0f);
    const Reg neg_slope = V::set1(kAlibi ? -mj.slopes[h] * mj.score_unit : 0.0f);
    Reg posv[U], lov[U];
    for (int v = 0; v < U; ++v) {
      posv[v] = V::load(pos + v * L);
      lov[v] = V::load(lo + v * L);
    }
    for (int64_t r = 0; r < nk; ++r) {
      const Reg jv = V::set1(static_cast<float>(j0 + r));
      for (int v = 0; v < U; ++v) {
        float* x = st + r * MQ + v * L;
        Reg t = V::load(x);
        if constexpr (kCap) {
          t = capped_tanh(t);  // t came scaled by 1 / cap (MaskJob::score_scale)
          if (dcap) {
            const Reg th = V::mul(t, inv_cap);
            V::store(dcap + r * MQ + v * L, V::sub(one, V::mul(th, th)));
          }
        }
        if constexpr (kAlibi) {
          const Reg diff = V::sub(posv[v], jv);
          t = V::fmadd(neg_slope, V::max(diff, V::sub(zero, diff)), t);
        }
        if (mask) t = V::select_lt(jv, lov[v], masked, V::select_lt(jv, nfv[v], t, masked));
        V::store(x, t);
        if (mx) mx[v] = V::max(mx[v], t);
      }
    }
  }
  // pos[i] = the diagonal key of query i0 + i (MaskOptions::diagonal:
  // i0 + i + K - Q, moved by a block's diagonal_shift) for every lane of the
  // query tile.
  static void diagonal(const MaskOptions& m, int64_t i0, int64_t Q, int64_t K, float* pos) {
    for (int64_t i = 0; i < MQ; ++i) pos[i] = static_cast<float>(m.diagonal(i0 + i, Q, K));
  }

  // The head's sink joins the denominator of rows 0 .. mq of the tile, as
  // one more key with no value: m, l and O^T rescaled to max(m, sink).
  static void add_sink(const MaskJob& mj, int64_t h, int64_t mq, int64_t dv, const Scratch& s) {
    const float t = mj.sinks[h] * mj.score_unit;
    for (int64_t i = 0; i < mq; ++i) {
      const float m = s.m[i], m_new = m > t ? m : t;
      const float corr = std::exp2((m - m_new) * mj.unit);  // 0 when m = -inf (no live key)
      s.m[i] = m_new;
      s.l[i] = s.l[i] * corr + std::exp2((t - m_new) * mj.unit);
      if (corr != 1.0f)
        for (int64_t c = 0; c < dv; ++c) s.ot[c * MQ + i] *= corr;
    }
  }

  // Whether query i ends fully masked (kernels/masked_row.h), from the
  // running max m over its keys below n and its kept count: every score
  // -inf (m = -inf) where no masked key holds the d2l chapter's finite fill (fill
  // -inf, or no key masked: n = K and none dropped inside), or no key kept
  // under the zeros policy (under uniform, the d2l chapter's fill alone already
  // gives the policy's 1/K, through the closed-form tail).
  static bool fully_masked(const MaskJob& mj, float m, float kept, int64_t n, int64_t K) {
    if (m == -__builtin_inff() && (mj.neg_inf || (n == K && kept == static_cast<float>(K))))
      return true;
    return mj.zeros && kept == 0.0f;
  }

  // fully_masked for row i of a tile once its keys are done (s.m, s.l, s.kept
  // final), but for a NaN row: a kept key that scored NaN (a NaN query or
  // key) is skipped by the maxima, so m can read -inf, while its exponential
  // (taken against 0 there) made l NaN. Such a row is NaN, not masked
  // (PyTorch's issue 141128 calls zeros there a silent correctness bug);
  // m = NaN marks it so in the statistics, for the weights and the backward.
  static bool takes_policy(const MaskJob& mj, const Scratch& s, int64_t i, int64_t n, int64_t K) {
    if (s.l[i] != s.l[i] && s.m[i] == -__builtin_inff()) {
      s.m[i] = __builtin_nanf("");
      return false;
    }
    return fully_masked(mj, s.m[i], s.kept[i], n, K);
  }

  // R keys of S^T: st[r, :] = (k_r . q_:) * c2, the base-2 scores (dot
  // first, then the scale, as the d2l chapter divides the product by sqrt(d): a
  // score that ties with the -1e6 fill in the d2l chapter ties here too), with kMask
  // keys outside a lane's range [lo, n) set to `masked` (lo: [U*L] first
  // keys as floats, read from memory only here, so that the unmasked path
  // holds no more registers than before the lower bound existed). k0 points at the block's
  // first key row, ks is the key row stride, j_first that key's index.
  // kTrackMax: mx = max(mx, S^T).
  template <int R, int U, bool kTrackMax, bool kMask>
  [[gnu::always_inline]] static void qk_block(const float* k0, int64_t ks, int64_t d, const float* qt, int64_t qs, float j_first,
                       const Reg* nfv, const float* lo, Reg c2v, Reg masked, float* st, Reg* mx) {
    Reg acc[R][U];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < U; ++v) acc[r][v] = V::zero();
    for (int64_t c = 0; c < d; ++c) {
      Reg qv[U];
      for (int v = 0; v < U; ++v) qv[v] = V::load(qt + c * qs + v * L);
      for (int r = 0; r < R; ++r) {
        const Reg a = V::set1(k0[r * ks + c]);
        for (int v = 0; v < U; ++v) acc[r][v] = V::fmadd(a, qv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const Reg jv = V::set1(j_first + static_cast<float>(r));
      for (int v = 0; v < U; ++v) {
        Reg t = V::mul(acc[r][v], c2v);
        if constexpr (kMask) t = V::select_lt(jv, V::load(lo + v * L), masked, V::select_lt(jv, nfv[v], t, masked));
        V::store(st + r * MQ + v * L, t);
        if constexpr (kTrackMax) mx[v] = V::max(mx[v], t);
      }
    }
  }
  // The R < MR remainder of a key tile.
  template <int R, int U, bool kTrackMax, bool kMask>
  [[gnu::always_inline]] static void qk_rows(int rows, const float* k0, int64_t ks, int64_t d, const float* qt,
                      int64_t qs, float j_first, const Reg* nfv, const float* lo, Reg c2v, Reg masked, float* st,
                      Reg* mx) {
    if constexpr (R >= 1) {
      if (rows == R)
        return qk_block<R, U, kTrackMax, kMask>(k0, ks, d, qt, qs, j_first, nfv, lo, c2v, masked, st, mx);
      qk_rows<R - 1, U, kTrackMax, kMask>(rows, k0, ks, d, qt, qs, j_first, nfv, lo, c2v, masked, st, mx);
    }
  }
  // Keys [j0, j0 + nk) of S^T; `mask` when some key is outside some lane's
  // range [lo, n) (Bounds::masks; else the compares and blends are skipped).
  // Always inlined (with qk_tile_as, qk_block, qk_rows): where GCC's
  // heuristics left the forward's score tile out of line, its running max
  // went through memory every block, 5% of the forward at B1 L4096 d64
  // (best of 3 alternating runs, one thread, 196-205 against 185-188 ms).
  template <int U, bool kTrackMax>
  [[gnu::always_inline]] static void qk_tile(const float* kb, int64_t ks, int64_t d, const float* qt, int64_t qs, int64_t j0, int64_t nk,
                      bool mask, const Reg* nfv, const float* lo, Reg c2v, Reg masked, float* st, Reg* mx) {
    if (mask) return qk_tile_as<U, kTrackMax, true>(kb, ks, d, qt, qs, j0, nk, nfv, lo, c2v, masked, st, mx);
    qk_tile_as<U, kTrackMax, false>(kb, ks, d, qt, qs, j0, nk, nfv, lo, c2v, masked, st, mx);
  }
  template <int U, bool kTrackMax, bool kMask>
  [[gnu::always_inline]] static void qk_tile_as(const float* kb, int64_t ks, int64_t d, const float* qt, int64_t qs, int64_t j0,
                         int64_t nk, const Reg* nfv, const float* lo, Reg c2v, Reg masked, float* st, Reg* mx) {
    int64_t jb = 0;
    for (; jb + MR <= nk; jb += MR)
      qk_block<MR, U, kTrackMax, kMask>(kb + (j0 + jb) * ks, ks, d, qt, qs, static_cast<float>(j0 + jb),
                                        nfv, lo, c2v, masked, st + jb * MQ, mx);
    if (jb < nk)
      qk_rows<MR - 1, U, kTrackMax, kMask>(static_cast<int>(nk - jb), kb + (j0 + jb) * ks, ks, d, qt, qs,
                                           static_cast<float>(j0 + jb), nfv, lo, c2v, masked, st + jb * MQ, mx);
  }

  // R columns of O^T: ot[r, :] = ot[r, :] * corr + sum_j v0[j, r] * P^T[j, :].
  // v0 points at v[j0, c0], vs is the value row stride.
  template <int R, int U>
  static void pv_block(const float* v0, int64_t vs, int64_t nk, const float* pt, const Reg* corr,
                       float* ot) {
    Reg acc[R][U];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < U; ++v) acc[r][v] = V::mul(V::load(ot + r * MQ + v * L), corr[v]);
    for (int64_t j = 0; j < nk; ++j) {
      Reg pv[U];
      for (int v = 0; v < U; ++v) pv[v] = V::load(pt + j * MQ + v * L);
      const float* vr = v0 + j * vs;
      for (int r = 0; r < R; ++r) {
        const Reg a = V::set1(vr[r]);
        for (int v = 0; v < U; ++v) acc[r][v] = V::fmadd(a, pv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < U; ++v) V::store(ot + r * MQ + v * L, acc[r][v]);
  }
  template <int R, int U>
  static void pv_rows(int rows, const float* v0, int64_t vs, int64_t nk, const float* pt,
                      const Reg* corr, float* ot) {
    if constexpr (R >= 1) {
      if (rows == R) return pv_block<R, U>(v0, vs, nk, pt, corr, ot);
      pv_rows<R - 1, U>(rows, v0, vs, nk, pt, corr, ot);
    }
  }
  template <int U>
  static void pv_tile(const float* v0, int64_t vs, int64_t dv, int64_t nk, const float* pt,
                      const Reg* corr, float* ot) {
    int64_t cb = 0;
    for (; cb + MR <= dv; cb += MR) pv_block<MR, U>(v0 + cb, vs, nk, pt, corr, ot + cb * MQ);
    if (cb < dv) pv_rows<MR - 1, U>(static_cast<int>(dv - cb), v0 + cb, vs, nk, pt, corr, ot + cb * MQ);
  }

  // The vectors of the query tile a chunk uses: all NV but in the last tile
  // of a short query axis (the d2l chapter's toy shape has 4 queries: 1 of 4).
  static int used_vectors(int64_t mq) { return static_cast<int>((mq + L - 1) / L); }

  static void forward_chunk(const ForwardJob& job, int64_t chunk, float* scratch) {
    int64_t bh = 0;
    dispatch_used<NV>(used_vectors(job.tiles.chunk(chunk, job.p->H(), &bh).mq),
                      [&](auto u) {
                        if (job.mask.natural) forward_tile<decltype(u)::value, true>(job, chunk, scratch);
                        else forward_tile<decltype(u)::value, false>(job, chunk, scratch);
                      });
  }
  static void weights_chunk(const WeightsJob& job, int64_t chunk, float* scratch) {
    dispatch_used<NV>(used_vectors(job.tiles.at(chunk % job.q_tiles).mq),
                      [&](auto u) {
                        if (job.mask.natural) weights_tile<decltype(u)::value, true>(job, chunk, scratch);
                        else weights_tile<decltype(u)::value, false>(job, chunk, scratch);
                      });
  }
  template <int U, class F>
  static void dispatch_used(int used, const F& f) {
    if constexpr (U >= 1) {
      if (used == U) return f(std::integral_constant<int, U>{});
      dispatch_used<U - 1>(used, f);
    }
  }

  // A score difference in base 2: natural scores (MaskJob::natural) are
  // scaled by log2(e) here, base-2 ones are already.
  template <bool kNat>
  static Reg to_base2(Reg x) {
    if constexpr (kNat) return V::mul(x, V::set1(kLog2e));
    else return x;
  }

  template <int U, bool kNat>
  static void forward_tile(const ForwardJob& job, int64_t chunk, float* scratch) {
    const AttentionForward& p = *job.p;
    const int64_t H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
    int64_t bh = 0;
    const QueryTile tile = job.tiles.chunk(chunk, H, &bh);
    const int64_t h = bh % H, b = bh / H, Hkv = p.Hkv(), hk = p.kv_head(h);
    const int64_t i0 = tile.i0, mq = tile.mq;
    int64_t key0 = tile.key0;
    const Scratch s = carve(scratch, d, dv, job.kv_shared ? 0 : job.pack_rows);
    const MaskJob& mj = job.mask;
    const bool tile_mask = mj.tile_mask[b] != 0;

    pack_queries(p.q, b, h, i0, mq, U * L, d, s.qt);
    const int32_t* n_valid = job.n_valid + b * Q + i0;
    const int32_t* first = job.first + b * Q + i0;
    Bounds kv = load_bounds(n_valid, first, mq, s.nf, s.lo);
    if (mj.scores) diagonal(*mj.m, i0, Q, K, s.pos);
    // Without the masking pass every key in [f, n) is kept.
    for (int64_t i = 0; i < MQ; ++i) s.kept[i] = tile_mask ? 0.0f : s.nf[i] - s.lo[i];
    if (job.read_all && job.read_all[b]) kv.end = K, kv.first = 0, key0 = 0;  // masked keys too, at weight 0
    Reg nfv[U], m[U], l[U];
    for (int v = 0; v < U; ++v) {
      nfv[v] = V::load(s.nf + v * L);
      m[v] = V::set1(-__builtin_inff());
      l[v] = V::zero();
    }
    for (int64_t c = 0; c < dv; ++c)
      for (int v = 0; v < U; ++v) V::store(s.ot + c * MQ + v * L, V::zero());

    const Reg c2v = V::set1(job.c2), neg_inf = V::set1(-__builtin_inff());
    const Reg c2s = V::set1(mj.score_scale(job.c2));  // with the score pass
    const Reg lowest = V::set1(-__FLT_MAX__), zero = V::zero();
    // Keys and values below the row's longest key limit, packed once per
    // slice (the heads of a group share it).
    // In a packed batch only the rows of the tile's document [key0,
    // key_end), where all its keys are (not with read_all), tagged with the
    // document too (slice[1]).
    const int64_t rows = job.kv_rows[b];
    const bool one_doc = job.tiles.table && !(job.read_all && job.read_all[b]);
    const int64_t from = one_doc ? lmin(key0, rows) : 0, to = one_doc ? lmin(tile.key_end, rows) : rows;
    if (!job.kv_shared && (s.slice[0] != b * Hkv + hk + 1 || s.slice[1] != (one_doc ? key0 + 1 : 0))) {
      pack_rows(p.k.ptr(b, hk) + from * p.k.stride[2], p.k.stride[2], to - from, d, s.kp + from * d);
      pack_rows(p.v.ptr(b, hk) + from * p.v.stride[2], p.v.stride[2], to - from, dv, s.vp + from * dv);
      s.slice[0] = b * Hkv + hk + 1;
      s.slice[1] = one_doc ? key0 + 1 : 0;
    }
    // Rows d (dv) floats apart either way.
    const float* kb = job.kv_shared ? job.keys.ptr(b, hk) : s.kp;
    const float* vb = job.kv_shared ? job.values.ptr(b, hk) : s.vp;
    const int64_t ks = d, vs = dv;
    const uint64_t row0 = static_cast<uint64_t>(((b * H + h) * Q + i0) * K);  // dropout index

    // Key tiles from the document's first key (key0), as in a call on the
    // document alone, not from the multiple of NK below it: up to NK - 1
    // keys fewer per query tile.
    for (int64_t j0 = kv.start(NK, key0); j0 < kv.end; j0 += NK) {
      const int64_t nk = lmin(NK, kv.end - j0);
      Reg mx[U];
      for (int v = 0; v < U; ++v) mx[v] = neg_inf;
      if (tile_mask || mj.scores) {
        const bool mask = kv.masks(j0, nk);  // the score pass masks the range when it runs
        qk_tile<U, false>(kb, ks, d, s.qt, MQ, j0, nk, mask && !mj.scores, nfv, s.lo, mj.scores ? c2s : c2v, neg_inf,
                          s.st, mx);
        // (The score pass tracks the max itself when no masking pass follows.)
        if (mj.scores) score_tile<U>(mj, h, s.pos, j0, nk, mask, nfv, s.lo, neg_inf, s.st, nullptr, tile_mask ? nullptr : mx);
        if (tile_mask) {
          mask_tile(mj, b, h, i0, mq, K, j0, nk, n_valid, first, s.st, s.kept, nullptr);
          for (int64_t r = 0; r < nk; ++r)
            for (int v = 0; v < U; ++v) mx[v] = V::max(mx[v], V::load(s.st + r * MQ + v * L));
        }
      } else {
        qk_tile<U, true>(kb, ks, d, s.qt, MQ, j0, nk, kv.masks(j0, nk), nfv, s.lo, c2v, neg_inf, s.st, mx);
      }
      // Online softmax: rescale what came before to the new running max. A
      // lane that has seen no key yet keeps max -inf; it exponentiates
      // against 0 instead, so that -inf - -inf never makes a NaN.
      Reg corr[U];
      for (int v = 0; v < U; ++v) {
        const Reg m_new = V::max(m[v], mx[v]);
        const Reg m_safe = V::select_lt(m_new, lowest, zero, m_new);
        corr[v] = V::exp2(to_base2<kNat>(V::sub(m[v], m_safe)));
        m[v] = m_new;
        Reg sum = V::zero();
        for (int64_t r = 0; r < nk; ++r) {
          float* x = s.st + r * MQ + v * L;
          const Reg e = V::exp2(to_base2<kNat>(V::sub(V::load(x), m_safe)));
          V::store(x, e);
          sum = V::add(sum, e);
        }
        l[v] = V::fmadd(l[v], corr[v], sum);
      }
      if (p.dropout.active()) {
        // The softmax sum above excludes dropout: it scales the weights
        // after normalisation, only in what multiplies v.
        for (int64_t r = 0; r < nk; ++r)
          for (int64_t i = 0; i < mq; ++i)
            s.st[r * MQ + i] *= p.dropout.multiplier(row0 + i * K + j0 + r);
      }
      pv_tile<U>(vb + j0 * vs, vs, dv, nk, s.st, corr, s.ot);
    }
    for (int v = 0; v < U; ++v) {
      V::store(s.m + v * L, m[v]);
      V::store(s.l + v * L, l[v]);
    }
    bool policy[MQ];  // never with sinks: the denominator holds the sink (kernels/params.h)
    for (int64_t i = 0; i < mq; ++i) policy[i] = !mj.sinks && takes_policy(mj, s, i, n_valid[i], K);
    // Keys outside [f, n) score the d2l chapter's fill (their weight is 0 under -inf).
    if (!mj.neg_inf)
      masked_tail(p, mj, n_valid, first, mq, p.v.ptr(b, hk), p.v.stride[2], row0, policy, s);  // may read past `rows`
    if (mj.sinks) add_sink(mj, h, mq, dv, s);  // in the statistics too: the weights and backward read them
    policy_rows(p, mj, mq, p.v.ptr(b, hk), p.v.stride[2], row0, policy, s);

    write_rows<U>(job, b, h, i0, mq, s.ot, s.m, s.l);
  }

  // Masked keys [0, f) and [n, K) of a query all score the fill, so their
  // share is closed-form: weight 2^(fill - m) each, times the sum of their
  // (dropout scaled) values. Only rows where that weight is not exactly 0 in float32
  // need it: valid length 0 (uniform weights over all K keys), or scores
  // within 150 (base 2) of the fill.
  // A chunk's epilogue, shared with the AMX forward (attention_amx.cpp):
  // out = O^T / l, divided lane-wise (a scalar division per element would
  // cost a tenth of the chunk at d = 64), then transposed into the output
  // rows i0 .. i0 + mq of (b, h); the statistics (m, l: [MQ]) when the job
  // keeps them. ot: [dv, MQ], divided in place.
  template <int U>
  static void write_rows(const ForwardJob& job, int64_t b, int64_t h, int64_t i0, int64_t mq, float* ot,
                         const float* m, const float* l) {
    const AttentionForward& p = *job.p;
    const int64_t dv = p.dv();
    Reg lv[U];
    for (int v = 0; v < U; ++v) lv[v] = V::load(l + v * L);
    for (int64_t c = 0; c < dv; ++c)
      for (int v = 0; v < U; ++v) {
        float* x = ot + c * MQ + v * L;
        V::store(x, V::div(V::load(x), lv[v]));
      }
    for (int64_t i = 0; i < mq; ++i) {
      float* o = p.out.ptr(b, h, i0 + i);
      for (int64_t c = 0; c < dv; ++c) o[c] = ot[c * MQ + i];
    }
    if (job.row_max2) {
      const int64_t base = (b * p.H() + h) * p.Q() + i0;
      for (int64_t i = 0; i < mq; ++i) {
        job.row_max2[base + i] = m[i];
        job.row_sum[base + i] = l[i];
      }
    }
  }

  static void masked_tail(const AttentionForward& p, const MaskJob& mj, const int32_t* n_valid,
                          const int32_t* first, int64_t mq, const float* vb, int64_t vs, uint64_t row0,
                          const bool* policy, const Scratch& s) {
    const int64_t K = p.K(), dv = p.dv();
    int64_t cached_f = -1, cached_n = -1;  // vsum holds the plain sum over [0, cached_f) and [cached_n, K)
    for (int64_t i = 0; i < mq; ++i) {
      const int64_t n = n_valid[i], f = first[i];
      if ((n >= K && f == 0) || policy[i]) continue;
      const float m = s.m[i];
      if (n > 0 && (m - mj.fill) * mj.unit >= kUnderflow2) continue;
      const int64_t ranges[4] = {0, f, n, K};
      if (p.dropout.active()) {
        for (int64_t c = 0; c < dv; ++c) s.vsum[c] = 0.0f;
        for (int x = 0; x < 4; x += 2)  // keys [0, f), then [n, K)
          for (int64_t j = ranges[x]; j < ranges[x + 1]; ++j) {
            const float mult = p.dropout.multiplier(row0 + i * K + j);
            if (mult == 0.0f) continue;
            const float* vr = vb + j * vs;
            for (int64_t c = 0; c < dv; ++c) s.vsum[c] += mult * vr[c];
          }
        cached_n = -1;
      } else if (n != cached_n || f != cached_f) {
        for (int64_t c = 0; c < dv; ++c) s.vsum[c] = 0.0f;
        for (int x = 0; x < 4; x += 2)  // keys [0, f), then [n, K)
          for (int64_t j = ranges[x]; j < ranges[x + 1]; ++j) {
            const float* vr = vb + j * vs;
            for (int64_t c = 0; c < dv; ++c) s.vsum[c] += vr[c];
          }
        cached_n = n;
        cached_f = f;
      }
      const float m_new = m > mj.fill ? m : mj.fill;
      const float corr = std::exp2((m - m_new) * mj.unit);  // 0 when m = -inf (no unmasked key)
      const float w = std::exp2((mj.fill - m_new) * mj.unit);
      s.m[i] = m_new;
      s.l[i] = s.l[i] * corr + static_cast<float>(K - n + f) * w;
      for (int64_t c = 0; c < dv; ++c) s.ot[c * MQ + i] = s.ot[c * MQ + i] * corr + w * s.vsum[c];
    }
  }

  // Fully masked rows get the policy: weight mj.policy (1/K or 0) on every
  // key, so the output is the mean of the (dropout scaled) values or 0. Their
  // statistics mark them: row_max2 = -inf (a row with any live score, or
  // with the d2l chapter's finite fill on some key, has a finite max), row_sum = 1.
  static void policy_rows(const AttentionForward& p, const MaskJob& mj, int64_t mq,
                          const float* vb, int64_t vs, uint64_t row0, const bool* policy,
                          const Scratch& s) {
    const int64_t K = p.K(), dv = p.dv();
    bool cached = false;  // vsum holds the plain sum over all keys
    for (int64_t i = 0; i < mq; ++i) {
      if (!policy[i]) continue;
      s.m[i] = -__builtin_inff();
      s.l[i] = 1.0f;
      if (mj.policy == 0.0f) {
        for (int64_t c = 0; c < dv; ++c) s.ot[c * MQ + i] = 0.0f;
        continue;
      }
      if (p.dropout.active() || !cached) {
        for (int64_t c = 0; c < dv; ++c) s.vsum[c] = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
          const float mult = p.dropout.multiplier(row0 + i * K + j);
          if (mult == 0.0f) continue;
          const float* vr = vb + j * vs;
          for (int64_t c = 0; c < dv; ++c) s.vsum[c] += mult * vr[c];
        }
        cached = !p.dropout.active();
      }
      for (int64_t c = 0; c < dv; ++c) s.ot[c * MQ + i] = mj.policy * s.vsum[c];
    }
  }

  template <int U, bool kNat>
  static void weights_tile(const WeightsJob& job, int64_t chunk, float* scratch) {
    const int64_t H = job.q.shape[1], Q = job.q.shape[2], K = job.k.shape[2], d = job.q.shape[3];
    const int64_t Hkv = job.k.shape[1];
    const QueryTile tile = job.tiles.at(chunk % job.q_tiles);
    const int64_t pair = chunk / job.q_tiles;
    const int64_t b = job.batch_rows[pair / job.n_heads], h = job.heads[pair % job.n_heads];
    const int64_t hk = h / (H / Hkv);
    const int64_t i0 = tile.i0, mq = tile.mq;
    const Scratch s = carve(scratch, d, 0, job.pack_rows);
    const MaskJob& mj = job.mask;
    const bool tile_mask = mj.tile_mask[b] != 0;

    pack_queries(job.q, b, h, i0, mq, U * L, d, s.qt);
    const int32_t* n_valid = job.n_valid + b * Q + i0;
    const int32_t* first = job.first + b * Q + i0;
    const Bounds kv = load_bounds(n_valid, first, mq, s.nf, s.lo);
    if (mj.scores) diagonal(*mj.m, i0, Q, K, s.pos);
    const int64_t base = (b * H + h) * Q + i0;
    bool policy[MQ];  // fully masked rows (row_max2 = -inf): the policy's weight
    for (int64_t i = 0; i < MQ; ++i) {
      s.kept[i] = 0.0f;  // counted by mask_tile, not needed here
      policy[i] = i < mq && job.row_max2[base + i] == -__builtin_inff();
      s.m[i] = i < mq && !policy[i] ? job.row_max2[base + i] : 0.0f;
      s.l[i] = i < mq && !policy[i] ? 1.0f / job.row_sum[base + i] : 0.0f;
    }
    Reg nfv[U], m[U], inv_l[U];
    for (int v = 0; v < U; ++v) {
      nfv[v] = V::load(s.nf + v * L);
      m[v] = V::load(s.m + v * L);
      inv_l[v] = V::load(s.l + v * L);
    }
    const Reg c2v = V::set1(mj.scores ? mj.score_scale(job.c2) : job.c2), fill = V::set1(mj.fill);
    if (*s.slice != b * Hkv + hk + 1) {
      pack_rows(job.k.ptr(b, hk), job.k.stride[2], job.kv_rows[b], d, s.kp);
      *s.slice = b * Hkv + hk + 1;
    }
    const float* kb = s.kp;
    const int64_t ks = d;
    float* out = job.out + pair * Q * K;
    for (int64_t j0 = 0; j0 < K; j0 += NK) {
      const int64_t nk = lmin(NK, K - j0);
      // Keys [from, computed) of the tile: those some lane sees.
      const int64_t computed = lmax(0, lmin(nk, kv.end - j0));
      const int64_t from = lmin(computed, lmax(0, kv.first - j0));
      const bool mask = kv.masks(j0 + from, computed - from);
      qk_tile<U, false>(kb, ks, d, s.qt, MQ, j0 + from, computed - from, mask && !mj.scores, nfv, s.lo, c2v, fill,
                        s.st + from * MQ, nullptr);
      if (mj.scores)
        score_tile<U>(mj, h, s.pos, j0 + from, computed - from, mask, nfv, s.lo, fill, s.st + from * MQ, nullptr);
      if (tile_mask) mask_tile(mj, b, h, i0, mq, K, j0, computed, n_valid, first, s.st, s.kept, nullptr);
      for (int64_t r = 0; r < nk; ++r)
        if (r < from || r >= computed)
          for (int v = 0; v < U; ++v) V::store(s.st + r * MQ + v * L, fill);
      for (int64_t r = 0; r < nk; ++r)
        for (int v = 0; v < U; ++v) {
          float* x = s.st + r * MQ + v * L;
          V::store(x, V::mul(V::exp2(to_base2<kNat>(V::sub(V::load(x), m[v]))), inv_l[v]));
        }
      for (int64_t i = 0; i < mq; ++i) {
        float* dst = out + (i0 + i) * K + j0;
        if (policy[i])
          for (int64_t r = 0; r < nk; ++r) dst[r] = mj.policy;
        else
          for (int64_t r = 0; r < nk; ++r) dst[r] = s.st[r * MQ + i];
      }
    }
  }
};

}  // namespace mha::kernels::fused
