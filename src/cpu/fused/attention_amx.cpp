// The fused forward on AMX tiles (attention_amx.h): per chunk (b, h, 32
// queries), the fused kernel's loop over key tiles with its two products on
// tdpbf16ps.
//
//   Q^T  (d pairs x 32 queries, bf16)       packed once per chunk
//   k    (key rows x d, bf16), v^T (dv x key pairs, bf16)
//                                           packed once per (b, kv head) and thread
//   for each key tile [j0, j0 + kKeys):
//     S^T[j, i] = k[j] . q[i]               tiles: 16 keys x 16 queries, 2 x 2 at a time
//     the fused kernel's scale, masks, online softmax (kernel_impl.h), in float32
//     P^T -> bf16 pairs (hi, and lo = P - hi)
//     O^T[c, i] = O^T[c, i] * corr + (v^T P^T)[c, i]
//                                           tiles: 16 value columns x 16 queries
//   the fused kernel's closed-form masked tail, fully-masked policy, out = O^T / l
//
// The layout is the fused kernel's, transposed (queries along the vector
// lanes), so that its masking pass and statistics are reused as they are
// (Kernel<Avx512, AmxTiles>), and the softmax is lane-wise.
#include "cpu/fused/attention_amx.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/fused/attention_fused.h"
#include "cpu/isa/have_x86.h"
#include "cpu/fused/fused_job.h"
#include "cpu/fused/limits.h"
#include "cpu/fused/traits.h"
#include "cpu/gemm/gemm_amx.h"

namespace mha::kernels::fused {

namespace {

// AVX512-BF16 and AVX512-BW (the weights' conversion to bfloat16 pairs):
// every CPU with AMX-BF16 has them, but amx_usable() does not say so.
bool has_bf16_conversions() {
#if MHA_HAVE_X86
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  return has;
#else
  return false;
#endif
}

}  // namespace

bool amx_forward_supports(const AttentionForward& p) {
  // Not the score options (softcap, ALiBi, sinks): the AMX chunk has no
  // score pass or sink, and cannot be run on the machines these were
  // written on, so such calls take the AVX-512 fused kernel, which honours
  // them (the same job, float32 products).
  return p.precision == Precision::BFloat16 && !p.dropout.active() && !p.masks.has_score_options() &&
         cpu::amx_usable() && has_bf16_conversions();
}

bool amx_forward_pays(const AttentionForward& p) {
  // The bfloat16 module against the float32 one, B2, self-attention, 2
  // threads, best of 5 (one run, other tools idle): at D100 h5 (d 20) the
  // AMX forward made L4 1.62x slower than float32, L8 1.20x, L16 1.02x; with
  // it off below 16 queries or 64 keys: 1.00x, 0.90x, 0.90x; at D256 h4
  // L4-L16 0.65-0.84x instead of 0.71-1.06x. (Tiles are set up per chunk and
  // padded to 32 queries and 128 keys.)
  return p.Q() >= kAmxMinQueries && p.K() >= kAmxMinKeys;
}

namespace {

// Keys per key tile: a multiple of 32 (the tiles' depth in the v^T P^T
// product). The O^T rescale (dv x 32 floats) is paid once per tile. 128
// against 64, alternating runs of the bfloat16 module at B1 L4096 D512 h8,
// one thread, on the shared 2-core machine: 155-159 against 163-171 ms.
constexpr int64_t kKeys = 128;
// Whether P goes to the tiles as hi + lo (two products) or rounded once.
// Measured on the 120 cases of tests/cpp/kernels/test_attention_amx.cpp
// (normalised error of the output against the reference): split 6.8e-6,
// rounded once 1.9e-3 -- the whole of test_bf16.py's module-level bound
// (2e-3) spent in attention alone. The split's second product costs ~12%
// of the attention (B1 h8 L4096 d64, one thread, best of 8: 122-125 ms
// split, 107-114 rounded once, against 264 for the float32 AVX-512 fused
// kernel), ~5% of the module forward: the split it is.
constexpr bool kSplitWeights = true;

constexpr int64_t MQ = kAmxQueryTile;
constexpr int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Where each array of a thread's scratch lives (floats, each 64-byte aligned).
struct Layout {
  int64_t d_steps, dv_groups, key_rows;  // d / 32, dv / 16 (even), rows padded to kKeys
  size_t slice, qb, pb, st, ob, ot, m, l, nf, lo, kept, vsum, kb, vb, total;
  Layout(int64_t d, int64_t dv, int64_t rows) {
    d_steps = up(d, 32) / 32;
    dv_groups = up(dv, 32) / 16;
    key_rows = up(rows, kKeys);
    size_t at = 0;
    auto take = [&](int64_t floats) {
      const size_t here = at;
      at += static_cast<size_t>(up(floats, 16));
      return here;
    };
    slice = take(16);
    qb = take(d_steps * 2 * 256);                     // [d step][query half] 16 x 32 bf16
    pb = take(2 * (kKeys / 32) * 2 * 256);            // hi, lo: [key step][query half]
    st = take(kKeys * MQ);                            // S^T, then P^T, float32
    ob = take(dv_groups * 16 * MQ);                   // v^T P^T of one key tile
    ot = take(dv * MQ);
    m = take(MQ);
    l = take(MQ);
    nf = take(MQ);
    lo = take(MQ);
    kept = take(MQ);
    vsum = take(dv);
    kb = take(key_rows * d_steps * 16);               // [key group][d step] 16 keys x 32 bf16
    vb = take(key_rows / 32 * dv_groups * 256);       // [key step][dv group] 16 columns x 32 bf16
    total = at;
  }
};

}  // namespace

size_t amx_forward_scratch_floats(int64_t d, int64_t dv, int64_t rows) { return Layout(d, dv, rows).total; }

}  // namespace mha::kernels::fused

#if MHA_HAVE_X86
// Everything below is compiled for AMX and AVX-512 (as gemm_amx.cpp); it
// runs only where amx_usable() (which checks AVX-512F too).
#define MHA_ISA_TARGET "amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16,avx2,fma"
#include "cpu/isa/target_begin.h"

#include "cpu/fused/simd_avx512.h"
#include "cpu/fused/kernel_impl.h"
#include "cpu/gemm/gemm_amx_tiles.h"

namespace mha::kernels::fused {

namespace {

// The fused kernel's helpers at 2 query vectors (MQ = 32): its masking
// pass, fully-masked test, closed-form tail and policy rows read S^T, O^T
// and the statistics in the layout used here. (The block sizes matter only
// to its own micro-kernels, which are not called.)
struct AmxTiles : cpu::Avx512Registers {
  static constexpr int kQueryVectors = 2;
  static constexpr int kBlockRows = 8;
  static constexpr int kKeyTile = static_cast<int>(kKeys);
};
static_assert(tiles_are_valid<AmxTiles>());
using Base = Kernel<Avx512, AmxTiles>;
using V = Avx512;
static_assert(Base::MQ == MQ);

inline uint16_t* bf16_at(float* base) { return reinterpret_cast<uint16_t*>(base); }

// kb: the slice's key rows [0, rows) of width d as 16 x 32 bf16 tiles,
// [key group][d step], rows past `rows` and columns past d zero.
void pack_keys(const float* k, int64_t ks, int64_t rows, int64_t d, const Layout& lay, uint16_t* kb) {
  for (int64_t g = 0; g < lay.key_rows / 16; ++g)
    for (int64_t t = 0; t < lay.d_steps; ++t) {
      uint16_t* tile = kb + (g * lay.d_steps + t) * 512;
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t j = g * 16 + r;
        _mm512_store_si512(tile + r * 32, j < rows ? cpu::amx::round_pairs(k + j * ks + t * 32, d - t * 32)
                                                   : _mm512_setzero_si512());
      }
    }
}

// vb: v^T of the slice's value rows [0, rows), width dv, as 16 x 32 bf16
// tiles [key step][dv group]: tile row c = value column 16 g + c, its 16
// words the key pairs (2r, 2r + 1) of the step; keys past `rows` and
// columns past dv zero.
void pack_values(const float* v, int64_t vs, int64_t rows, int64_t dv, const Layout& lay, uint16_t* vb) {
  for (int64_t t = 0; t < lay.key_rows / 32; ++t)
    for (int64_t g = 0; g < lay.dv_groups; ++g) {
      const __mmask16 cols = cpu::amx::first_lanes(dv - g * 16);
      __m512i words[16];  // words[r] lane c: the pair (2r, 2r + 1) of column c, then transposed
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t j = t * 32 + 2 * r;
        const __m512 even = j < rows ? _mm512_maskz_loadu_ps(cols, v + j * vs + g * 16) : _mm512_setzero_ps();
        const __m512 odd = j + 1 < rows ? _mm512_maskz_loadu_ps(cols, v + (j + 1) * vs + g * 16) : _mm512_setzero_ps();
        words[r] = cpu::amx::pair_rows(even, odd);
      }
      cpu::amx::transpose_words(words);
      uint16_t* tile = vb + (t * lay.dv_groups + g) * 512;
      for (int r = 0; r < 16; ++r) _mm512_store_si512(tile + r * 32, words[r]);
    }
}

// qb: Q^T of queries i0.. i0 + mq as 16 x 32 bf16 tiles [d step][query
// half]: tile row r = the d pairs (2r, 2r + 1) of 16 queries; queries past
// mq and d past d zero.
void pack_queries(const TensorView& q, int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t d,
                  const Layout& lay, uint16_t* qb) {
  const float* rows[MQ];
  for (int64_t i = 0; i < MQ; ++i) rows[i] = i < mq ? q.ptr(b, h, i0 + i) : nullptr;
  for (int64_t t = 0; t < lay.d_steps; ++t)
    for (int64_t half = 0; half < 2; ++half)
      cpu::amx::pack_columns_tile(nullptr, 0, rows, half * 16, std::clamp<int64_t>(mq - half * 16, 0, 16), t * 32,
                                  d, reinterpret_cast<uint32_t*>(qb + (t * 2 + half) * 512));
}

// The 2 x 2 tile block both products below run (the tile layout:
// gemm_amx_tiles.h): tiles 0-3 accumulate, 4 and 5 hold the rows (keys or
// value columns) 0-15 and 16-31, 6 and 7 the queries 0-15 and 16-31 (of q,
// or of P^T). Always inlined: the tile numbers are immediates.
[[gnu::always_inline]] inline void zero_accumulators() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
// Tiles 0-3 += tiles 4, 5 times the two query tiles at b (loaded into 6, 7).
[[gnu::always_inline]] inline void multiply_accumulate(const uint16_t* b) {
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b + 512, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}
// out[32, 32] (rows MQ floats apart) = tiles 0-3.
[[gnu::always_inline]] inline void store_accumulators(float* out) {
  _tile_stored(0, out, MQ * 4);
  _tile_stored(1, out + 16, MQ * 4);
  _tile_stored(2, out + 16 * MQ, MQ * 4);
  _tile_stored(3, out + 16 * MQ + 16, MQ * 4);
}

// st[r, :] = k[j0 + r] . q[:] for keys r < nk (rounded up to 32; the rows
// past nk are zero keys or keys some other query sees), [kKeys, MQ] float32.
void score_tiles(const uint16_t* kb, const uint16_t* qb, int64_t j0, int64_t nk, const Layout& lay, float* st) {
  __asm__ volatile("" ::: "memory");
  for (int64_t r0 = 0; r0 < nk; r0 += 32) {
    const uint16_t* k0 = kb + (j0 + r0) / 16 * lay.d_steps * 512;
    const uint16_t* k1 = k0 + lay.d_steps * 512;
    zero_accumulators();
    for (int64_t t = 0; t < lay.d_steps; ++t) {
      _tile_loadd(4, k0 + t * 512, 64);
      _tile_loadd(5, k1 + t * 512, 64);
      multiply_accumulate(qb + t * 1024);
    }
    store_accumulators(st + r0 * MQ);
  }
  __asm__ volatile("" ::: "memory");
}

// ob[c, :] = sum_j v[j0 + j, c] P^T[j, :] over the tile's nk keys (pb: its
// bf16 pairs, hi then lo), every value column group, [dv_groups * 16, MQ].
void value_tiles(const uint16_t* vb, const uint16_t* pb, int64_t j0, int64_t nk, const Layout& lay, float* ob) {
  constexpr int64_t kLo = (kKeys / 32) * 1024;  // the lo parts, after the hi ones
  const int64_t steps = (nk + 31) / 32;
  __asm__ volatile("" ::: "memory");
  for (int64_t g = 0; g < lay.dv_groups; g += 2) {
    zero_accumulators();
    for (int64_t t = 0; t < steps; ++t) {
      const uint16_t* v0 = vb + ((j0 / 32 + t) * lay.dv_groups + g) * 512;
      _tile_loadd(4, v0, 64);
      _tile_loadd(5, v0 + 512, 64);
      multiply_accumulate(pb + t * 1024);
      if constexpr (kSplitWeights) multiply_accumulate(pb + kLo + t * 1024);
    }
    store_accumulators(ob + g * 16 * MQ);
  }
  __asm__ volatile("" ::: "memory");
}

// The words of one row of a P^T tile from the weights of keys 2r (a) and
// 2r + 1 (b) of 16 queries: word c = bf16(a[c]) | bf16(b[c]) << 16,
// rounded to nearest even (vcvtne2ps2bf16, then the halves interleaved).
inline __m512i bf16_pairs(__m512 a, __m512 b) {
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // a in words 0-15, b in 16-31
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, both);
}

// The hi part of a weight: x truncated to bfloat16 (its top 16 bits), so
// that lo = x - hi is exact in float32 and below 2^-7 x; lo is then rounded
// to bfloat16, so hi + lo carries x to within 2^-16 relative.
inline __m512 bf16_hi(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
// bf16_pairs of two hi parts: their top halves, interleaved.
inline __m512i hi_pairs(__m512 a, __m512 b) {
  return _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(_mm512_castps_si512(a), 16), _mm512_castps_si512(b));
}

// One key tile's weights P^T[r, :] = 2^(S^T[r, :] - m_safe) for the 16
// queries of vector v (base 2, natural scores scaled by log2 e as the fused
// kernel does), as bf16 pairs into pb (zero from nk to the next multiple of
// 32). `st` holds the tile's S^T; with kRaw they are the raw dots,
// scaled here by c2 in one rounding, keys outside a lane's range [lo, n)
// (when `limit`) at weight 0. Returns the sum of the float32 weights.
template <bool kNat, bool kRaw>
__m512 weights_to_tiles(const float* st, int v, int64_t j0, int64_t nk, bool limit, __m512 nfv, __m512 lov,
                        __m512 c2v, __m512 m_safe, uint16_t* pb) {
  __m512 sum = V::zero();
  const __m512 neg_inf = V::set1(-__builtin_inff());
  for (int64_t r = 0; r < up(nk, 32); r += 2) {
    __m512 e[2];
    for (int u = 0; u < 2; ++u) {
      e[u] = V::zero();
      if (r + u >= nk) continue;
      const __m512 x = V::load(st + (r + u) * MQ + v * 16);
      __m512 t;
      if constexpr (kRaw) {
        t = Base::to_base2<kNat>(_mm512_fmsub_ps(x, c2v, m_safe));
        if (limit) {
          const __m512 jv = V::set1(static_cast<float>(j0 + r + u));
          t = V::select_lt(jv, lov, neg_inf, V::select_lt(jv, nfv, t, neg_inf));
        }
      } else {
        t = Base::to_base2<kNat>(V::sub(x, m_safe));
      }
      e[u] = V::exp2(t);
      sum = V::add(sum, e[u]);
    }
    uint16_t* row = pb + ((r / 32) * 2 + v) * 512 + (r % 32) / 2 * 32;
    if constexpr (kSplitWeights) {
      const __m512 hi0 = bf16_hi(e[0]), hi1 = bf16_hi(e[1]);
      _mm512_store_si512(row, hi_pairs(hi0, hi1));
      _mm512_store_si512(row + (kKeys / 32) * 1024, bf16_pairs(V::sub(e[0], hi0), V::sub(e[1], hi1)));
    } else {
      _mm512_store_si512(row, bf16_pairs(e[0], e[1]));
    }
  }
  return sum;
}

template <bool kNat>
void forward_tile(const ForwardJob& job, int64_t chunk, float* scratch) {
  const AttentionForward& p = *job.p;
  const int64_t H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  // The query tiles of the fused kernel (in a packed batch cut at each
  // document's first row); the key tiles stay at multiples of kKeys, where
  // the packed bfloat16 tiles start.
  int64_t bh = 0;
  const QueryTile tile = job.tiles.chunk(chunk, H, &bh);
  const int64_t h = bh % H, b = bh / H, Hkv = p.Hkv(), hk = p.kv_head(h);
  const int64_t i0 = tile.i0, mq = tile.mq;
  const Layout lay(d, dv, job.pack_rows);
  int64_t* slice = reinterpret_cast<int64_t*>(scratch + lay.slice);
  uint16_t* qb = bf16_at(scratch + lay.qb);
  uint16_t* pb = bf16_at(scratch + lay.pb);
  uint16_t* kb = bf16_at(scratch + lay.kb);
  uint16_t* vb = bf16_at(scratch + lay.vb);
  float* st = scratch + lay.st;
  float* ob = scratch + lay.ob;
  Base::Scratch s{};  // what the fused kernel's helpers read
  s.ot = scratch + lay.ot;
  s.m = scratch + lay.m;
  s.l = scratch + lay.l;
  s.nf = scratch + lay.nf;
  s.lo = scratch + lay.lo;
  s.kept = scratch + lay.kept;
  s.vsum = scratch + lay.vsum;
  const MaskJob& mj = job.mask;
  const bool tile_mask = mj.tile_mask[b] != 0;

  // Another library on this thread may have loaded its own tile
  // configuration since the last chunk (gemm_amx_tiles.h).
  cpu::amx::configure_tiles();
  pack_queries(p.q, b, h, i0, mq, d, lay, qb);
  const int32_t* n_valid = job.n_valid + b * Q + i0;
  const int32_t* first = job.first + b * Q + i0;
  Base::Bounds kv = Base::load_bounds(n_valid, first, mq, s.nf, s.lo);
  for (int64_t i = 0; i < MQ; ++i) s.kept[i] = tile_mask ? 0.0f : s.nf[i] - s.lo[i];
  if (job.read_all && job.read_all[b]) kv.end = K, kv.first = 0;
  if (*slice != b * Hkv + hk + 1) {
    const int64_t rows = job.kv_rows[b];
    pack_keys(p.k.ptr(b, hk), p.k.stride[2], rows, d, lay, kb);
    pack_values(p.v.ptr(b, hk), p.v.stride[2], rows, dv, lay, vb);
    *slice = b * Hkv + hk + 1;
  }
  __m512 nfv[2], lov[2], m[2], l[2];
  for (int v = 0; v < 2; ++v) {
    nfv[v] = V::load(s.nf + v * 16);
    lov[v] = V::load(s.lo + v * 16);
    m[v] = V::set1(-__builtin_inff());
    l[v] = V::zero();
  }
  for (int64_t x = 0; x < dv * MQ; ++x) s.ot[x] = 0.0f;
  const __m512 c2v = V::set1(job.c2), neg_inf = V::set1(-__builtin_inff());
  const __m512 lowest = V::set1(-__FLT_MAX__), zero = V::zero();

  for (int64_t j0 = kv.start(kKeys); j0 < kv.end; j0 += kKeys) {
    const int64_t nk = std::min(kKeys, kv.end - j0);
    score_tiles(kb, qb, j0, nk, lay, st);
    const bool limit = kv.masks(j0, nk);
    __m512 mx[2] = {neg_inf, neg_inf};
    if (!tile_mask) {
      // The row max over raw dots (keys past a lane's limit left out), then
      // scaled: max(s) c2 = max(s c2) bit for bit, as c2 > 0 and rounding
      // is monotonic; the weights scale each dot as they read it.
      for (int64_t r = 0; r < nk; ++r) {
        const __m512 jv = V::set1(static_cast<float>(j0 + r));
        for (int v = 0; v < 2; ++v) {
          const __m512 x = V::load(st + r * MQ + v * 16);
          mx[v] = V::max(mx[v], limit ? V::select_lt(jv, lov[v], neg_inf, V::select_lt(jv, nfv[v], x, neg_inf)) : x);
        }
      }
      for (int v = 0; v < 2; ++v) mx[v] = V::mul(mx[v], c2v);
    } else {
      // The scale and the key limits as the fused kernel's qk_tile (the dot
      // first, then the scale; keys at or past a lane's limit -inf), then
      // its masking pass.
      for (int64_t r = 0; r < nk; ++r) {
        const __m512 jv = V::set1(static_cast<float>(j0 + r));
        for (int v = 0; v < 2; ++v) {
          float* x = st + r * MQ + v * 16;
          __m512 t = V::mul(V::load(x), c2v);
          if (limit) t = V::select_lt(jv, lov[v], neg_inf, V::select_lt(jv, nfv[v], t, neg_inf));
          V::store(x, t);
        }
      }
      Base::mask_tile(mj, b, h, i0, mq, K, j0, nk, n_valid, first, st, s.kept, nullptr);
      for (int64_t r = 0; r < nk; ++r)
        for (int v = 0; v < 2; ++v) mx[v] = V::max(mx[v], V::load(st + r * MQ + v * 16));
    }
    // The online softmax, as the fused kernel's: rescale what came before to
    // the new running max (a lane that has seen no key yet exponentiates
    // against 0, so that -inf - -inf never makes a NaN).
    __m512 corr[2];
    for (int v = 0; v < 2; ++v) {
      const __m512 m_new = V::max(m[v], mx[v]);
      const __m512 m_safe = V::select_lt(m_new, lowest, zero, m_new);
      corr[v] = V::exp2(Base::to_base2<kNat>(V::sub(m[v], m_safe)));
      m[v] = m_new;
      const __m512 sum = tile_mask ? weights_to_tiles<kNat, false>(st, v, j0, nk, limit, nfv[v], lov[v], c2v, m_safe, pb)
                                   : weights_to_tiles<kNat, true>(st, v, j0, nk, limit, nfv[v], lov[v], c2v, m_safe, pb);
      l[v] = V::fmadd(l[v], corr[v], sum);
    }
    value_tiles(vb, pb, j0, nk, lay, ob);
    for (int64_t c = 0; c < dv; ++c)
      for (int v = 0; v < 2; ++v) {
        float* o = s.ot + c * MQ + v * 16;
        V::store(o, V::fmadd(V::load(o), corr[v], V::load(ob + c * MQ + v * 16)));
      }
  }
  for (int v = 0; v < 2; ++v) {
    V::store(s.m + v * 16, m[v]);
    V::store(s.l + v * 16, l[v]);
  }
  bool policy[MQ];
  for (int64_t i = 0; i < mq; ++i) policy[i] = Base::takes_policy(mj, s, i, n_valid[i], K);
  const uint64_t row0 = static_cast<uint64_t>(((b * H + h) * Q + i0) * K);  // dropout index (none here)
  if (!mj.neg_inf) Base::masked_tail(p, mj, n_valid, first, mq, p.v.ptr(b, hk), p.v.stride[2], row0, policy, s);
  Base::policy_rows(p, mj, mq, p.v.ptr(b, hk), p.v.stride[2], row0, policy, s);

  Base::write_rows<2>(job, b, h, i0, mq, s.ot, s.m, s.l);
}

}  // namespace

void amx_forward_chunk(const ForwardJob& job, int64_t chunk, float* scratch) {
  if (job.mask.natural) forward_tile<true>(job, chunk, scratch);
  else forward_tile<false>(job, chunk, scratch);
}

}  // namespace mha::kernels::fused

#include "cpu/isa/target_end.h"

#else  // not x86: amx_forward_supports() is false, so nothing calls this.

namespace mha::kernels::fused {
void amx_forward_chunk(const ForwardJob&, int64_t, float*) {}
}  // namespace mha::kernels::fused

#endif
