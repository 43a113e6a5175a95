// src/kernels/params.h: the one interface every attention kernel takes.
//
// Plain structs of strided views, shapes and options, in the spirit of
// FlashAttention's Flash_fwd_params / Flash_bwd_params: a module validates
// its users' inputs once, fills one of them and calls kernels/dispatch.h,
// which checks the struct (kernels/validate.h, every build) and runs a
// kernel. Here, in order: the masks (MaskOptions), dropout, the softmax
// statistics, a cached call's keys (KeyCache), the forward
// (AttentionForward: an uncached call, or with `cache` set a cached one),
// the backward that contains it (AttentionBackward), the recomputed weights
// (AttentionWeightsParams), and a cached forward's flat form as the decode
// kernels read it (DecodeParams, made by decode_params()).
//
// The forward:
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv]
//     (+ weights:[B,h,Q,K], + stats:[B,h,Q] twice)
//
// Scores are (q . k) / sqrt(d); key k of query q in row b is masked when
// float(k) >= length(b, q) and its score then becomes -1e6, the d2l
// chapter's fill, so a row with every key masked gets uniform weights 1/K.
//
// Options beyond the chapter (all additive; their defaults are the chapter's
// behaviour; every kernel honours every option; docs/masks.md has the table
// of fields):
// - grouped heads: k and v may have Hkv = k.shape[1] heads, Hkv dividing H;
//   query head h reads kv head h / (H / Hkv) (Hkv = 1: multi-query);
// - in `masks` (MaskOptions): boolean masks (1 = the key takes part) and
//   additive masks per key [B,K] or per (query, key) pair, causal masking,
//   a sliding window,
//   the fill of masked scores (the chapter's -1e6, or -inf: the key drops out)
//   and the policy for rows in which no key is live (uniform or zeros).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mha/masks.h"
#include "mha/precision.h"
#include "mha/tensor.h"

namespace mha::kernels {

enum class LengthKind { None, PerBatch, PerQuery };

// The chapter's masked_softmax replaces masked scores by this value.
inline constexpr float kMaskFill = -1e6f;

// What a masked score becomes before the softmax.
enum class MaskFill {
  Seed,    // -1e6, as masked_softmax: the d2l chapter's API
  NegInf,  // -inf: the key drops out (PyTorch's nn.MultiheadAttention)
};

// The masks beyond valid_lens, for key j of query i in batch row b, head h.
// One struct so that the forward and backward parameter structs carry the
// same thing. The defaults are the d2l chapter's behaviour (no mask, -1e6, uniform).
//
// Every kernel reads it (reference, BLAS, fused, AMX, decode, and the ring's
// blocks through the fused one), and asks it, not its own copy of the rule,
// for the range of keys a query may see (first_key, last_key) and a
// row's key masks (keep_row, bias_row).
struct MaskOptions {
  // Boolean masks read 1 = takes part; additive masks add to the scaled score.
  const uint8_t* key_keep = nullptr;   // [B,K], rows key_stride_b apart
  const float* key_bias = nullptr;     // [B,K], rows key_stride_b apart
  // Elements between the batch rows of key_keep / key_bias; 0: K (contiguous).
  // A cached call's rows have different K, so its masks cover the longest.
  int64_t key_stride_b = 0;
  // Per (query, key) pair: element b*pair_stride_b + h*pair_stride_h + i*K + j
  // (stride 0 broadcasts: a (Q,K) mask has both 0, a (B*h,Q,K) one has
  // pair_stride_h = Q*K, pair_stride_b = H*Q*K). Shared by keep and bias.
  const uint8_t* pair_keep = nullptr;
  const float* pair_bias = nullptr;
  int64_t pair_stride_b = 0, pair_stride_h = 0;
  Causal causal = Causal::None;
  // A sliding window (FlashAttention's window_size), aligned to the bottom
  // right as its causal is: query i sees key j iff
  //   i + K - Q - window_left <= j <= i + K - Q + window_right,
  // -1 leaving that side unbounded (>= -1, kernels/validate.h). It
  // intersects causal and the other masks; (-1, 0) is BottomRight causal.
  int64_t window_left = -1, window_right = -1;
  // A block of a larger attention (a ring's blocks over ranks): query i's
  // diagonal key, which the window, BottomRight causal and ALiBi are aligned
  // to, is i + K - Q + diagonal_shift (diagonal() below) instead of
  // i + K - Q, so that they follow the larger attention's positions. 0 for
  // every call over a whole attention; cached calls refuse any other value.
  int64_t diagonal_shift = 0;
  // Score options (FlashAttention's, ggml's), applied to the scaled score s
  // of query i, key j, head h, in this order, before the additive masks and
  // the masks above:
  // - softcap > 0 (Gemma 2's logit softcapping): s -> softcap * tanh(s / softcap);
  //   0: off. The backward multiplies dS by 1 - tanh^2.
  // - alibi_slopes [h] or null (ALiBi, BLOOM/MPT): adds
  //   -alibi_slopes[h] * |i + K - Q - j| (bottom right, as the window).
  float softcap = 0.0f;
  const float* alibi_slopes = nullptr;
  // Attention sinks [h] or null (gpt-oss): one logit per head that joins
  // every row's softmax denominator and has no value, so a row's weights sum
  // to 1 - exp(sink - logsumexp). They are parameters: the backward writes
  // their gradient (AttentionBackward::grad_sinks). With sinks no row is
  // fully masked (the denominator always holds the sink): masked keys
  // score the fill and compete with the sink, so under the -inf fill a row
  // with no live key puts all its weight on the sink (out = 0, weights 0),
  // and under the d2l chapter's -1e6 the sink, if above the fill, takes
  // nearly all of it; `fully_masked` is then never used. Slopes and sinks
  // are finite (kernels/validate.h); softcap finite and >= 0. (The ring over
  // ranks, dist/ring_attention.cpp, runs its blocks without the sink and adds
  // it once per row after the last block: each block adding it would count
  // it once per block.)
  const float* sinks = nullptr;
  // A packed batch of documents (FlashAttention's varlen cu_seqlens):
  // [documents + 1] nondecreasing offsets from 0 to Q = K (B = 1); query i
  // of document [s, e) sees only keys in [s, e), every other option then
  // applying within the document (positions in a document and in the
  // packed row differ by the same s for queries and keys). Null: one
  // document per batch row.
  const int64_t* doc_offsets = nullptr;
  int64_t documents = 0;
  MaskFill fill = MaskFill::Seed;
  // A row is fully masked when no key takes part, or when every score of
  // the row is -inf (kept keys scoring -inf and no masked key holding the
  // d2l chapter's finite fill); it then gets this policy instead of a softmax.
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

  float fill_value() const { return fill == MaskFill::Seed ? kMaskFill : -__builtin_inff(); }
  // The keys query i (of Q, among K keys) may see: [first_key, last_key].
  // Every kernel masks a key outside it exactly as a key past the causal
  // limit (the fill, or dropped under -inf); the fused kernels skip key
  // tiles wholly outside it, so a narrow range costs little whatever K is.
  // first_key may be below 0 (from the first key) and above last_key (none).
  // (A side past the first key (left) or the last (right) bounds nothing:
  // compared first, so that no sum overflows.)
  // In a packed batch (doc_offsets) both are clamped to query i's document.
  int64_t first_key(int64_t i, int64_t Q, int64_t K) const {
    const int64_t diag = diagonal(i, Q, K);
    const int64_t first = window_left >= 0 && window_left < diag ? diag - window_left : 0;
    if (!doc_offsets) return first;
    const int64_t begin = doc_offsets[document_of(i)];
    return first > begin ? first : begin;
  }
  int64_t last_key(int64_t i, int64_t Q, int64_t K) const {
    const int64_t diag = diagonal(i, Q, K);
    int64_t last = causal_last_key(i, Q, K);
    if (window_right >= 0 && window_right < K - diag && diag + window_right < last) last = diag + window_right;
    if (!doc_offsets) return last;
    const int64_t end = doc_offsets[document_of(i) + 1] - 1;
    return last < end ? last : end;
  }
  // The key on query i's diagonal (of Q queries, among K keys), bottom right.
  int64_t diagonal(int64_t i, int64_t Q, int64_t K) const { return i + K - Q + diagonal_shift; }
  // Whether first_key or last_key bound any query's keys.
  bool bounds_keys() const {
    return causal != Causal::None || window_left >= 0 || window_right >= 0 || doc_offsets != nullptr;
  }
  // The document of row i of a packed batch: the one x with
  // doc_offsets[x] <= i < doc_offsets[x + 1] (empty documents hold no row).
  // The kernels that ask per (query, key) pair (the reference, the BLAS
  // backward's dS) ask about one query K times in a row, so the last answer
  // of this thread is tried first (two loads), and a binary search over the
  // offsets runs once per query, not per pair. The answer is checked
  // against the offsets themselves, so a reused buffer cannot return a stale
  // document.
  int64_t document_of(int64_t i) const {
    thread_local int64_t last = 0;
    if (last < documents && doc_offsets[last] <= i && i < doc_offsets[last + 1]) return last;
    // upper_bound over offsets 1..documents-1: the first offset above i.
    int64_t lo = 0, hi = documents;  // the answer x is in [lo, hi)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (doc_offsets[mid] <= i) lo = mid;
      else hi = mid;
    }
    last = lo;
    return lo;
  }
  // The last key query i of Q may see among K under `causal` alone (K-1: all).
  int64_t causal_last_key(int64_t i, int64_t Q, int64_t K) const {
    switch (causal) {
      case Causal::None: return K - 1;
      case Causal::TopLeft: return i;
      case Causal::BottomRight: return diagonal(i, Q, K);
    }
    return K - 1;
  }
  // Row b's key_keep / key_bias over its K keys, or null.
  const uint8_t* keep_row(int64_t b, int64_t K) const {
    return key_keep ? key_keep + b * (key_stride_b ? key_stride_b : K) : nullptr;
  }
  const float* bias_row(int64_t b, int64_t K) const {
    return key_bias ? key_bias + b * (key_stride_b ? key_stride_b : K) : nullptr;
  }
  bool has_key_mask() const { return key_keep != nullptr || key_bias != nullptr; }
  // Whether a score option (softcap, ALiBi, sinks) is set.
  bool has_score_options() const { return softcap > 0.0f || alibi_slopes != nullptr || sinks != nullptr; }
  // ALiBi's distance of query i (of Q) from key j (of K): |diagonal - j|,
  // bottom right as the window (i + K - Q - j over a whole attention).
  int64_t alibi_distance(int64_t i, int64_t j, int64_t Q, int64_t K) const {
    const int64_t x = diagonal(i, Q, K) - j;
    return x < 0 ? -x : x;
  }
  // Offset of (b, h, i, key 0) in pair_keep / pair_bias.
  int64_t pair_offset(int64_t b, int64_t h, int64_t i, int64_t K) const {
    return b * pair_stride_b + h * pair_stride_h + i * K;
  }
};

// ---- Dropout ----------------------------------------------------------------
//
// Counter-based dropout on attention weights.
//
// Every kernel draws the keep/drop decision of weight (b, head, q, k) from a
// hash of (key, flat index) instead of a sequential stream. The decision is
// therefore the same in every kernel, in any order, at any thread count, and
// the backward pass recomputes the forward's mask from the key alone instead
// of storing a (B, h, Q, K) tensor. The key is drawn once per forward call from
// the module's seedable Generator.

// A call over a block of a larger attention (one batch row and head of a
// ring's key block) keys its mask by the larger tensor's flat index, so that
// the blocks together drop what one call over everything would: the call's
// own extents (H, Q, K; its batch rows need none), where its (0, 0, 0, 0)
// sits in the larger tensor, and that tensor's extents. Unset (K = 0): the
// call's own index.
struct DropoutFrame {
  int64_t H = 0, Q = 0, K = 0;          // the call's extents
  int64_t b0 = 0, h0 = 0, q0 = 0, k0 = 0;  // its origin in the larger tensor
  int64_t H_all = 0, Q_all = 0, K_all = 0;  // the larger tensor's extents
};

struct Dropout {
  float p = 0.0f;     // probability of dropping a weight, in [0, 1]
  uint64_t key = 0;   // per-call key
  DropoutFrame frame = {};  // unset: indices are the call's own
  bool active() const { return p > 0.0f; }
  // The index in the larger tensor of the call's flat index x (the kernels
  // index (b, h, q, k) row-major over the call's extents).
  uint64_t framed(uint64_t x) const {
    const DropoutFrame& f = frame;
    const auto K = static_cast<uint64_t>(f.K), Q = static_cast<uint64_t>(f.Q), H = static_cast<uint64_t>(f.H);
    const uint64_t j = x % K, i = (x / K) % Q, h = (x / K / Q) % H, b = x / K / Q / H;
    return ((((b + static_cast<uint64_t>(f.b0)) * static_cast<uint64_t>(f.H_all) + h + static_cast<uint64_t>(f.h0)) *
                 static_cast<uint64_t>(f.Q_all) +
             i + static_cast<uint64_t>(f.q0)) *
                static_cast<uint64_t>(f.K_all) +
            j + static_cast<uint64_t>(f.k0));
  }
  // nn.Dropout scales survivors by 1/(1-p); p = 1 drops everything.
  float survivor_scale() const { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

  // The multiplier of weight number `index` (row-major in (B, h, Q, K)):
  // 0 when dropped, survivor_scale() when kept; 1 when dropout is off.
  float multiplier(uint64_t index) const {
    if (!active()) return 1.0f;
    if (frame.K != 0) index = framed(index);
    // SplitMix64's finaliser over a Weyl step of the index: a bijective,
    // well-mixed hash, so neighbouring indices give independent-looking bits.
    uint64_t z = key + (index + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * 0x1.0p-24f;  // [0, 1)
    return u < p ? 0.0f : survivor_scale();
  }
};

// ---- Softmax statistics -----------------------------------------------------
//
// The two numbers per query row from which a
// forward's softmax weights are recomputed without storing a (Q, K) matrix.
//
// The fused kernel works in base 2 (exp2 is the cheaper vector exponential):
//   t_k      = score_k * log2(e), masked keys at the fill * log2(e)
//   row_max2 = max_k t_k          over the keys the kernel included
//   row_sum  = sum_k 2^(t_k - row_max2)
//   weight_k = 2^(t_k - row_max2) / row_sum
// so that a row of masked keys (every t_k equal to the fill) recomputes to
// exactly uniform weights. With an additive mask the statistics are in
// natural units instead (cpu/fused/fused_job.h says why). A fully masked row
// (kernels/masked_row.h) has row_max2 = -inf, row_sum = 1.
//
// Only the kernel that wrote them can read them back: they are opaque to
// everyone else, and kernels::attention_forward says whether it wrote them.

// Where a forward writes its statistics (both set, or both null: not
// wanted), and where the backward and the weights read them back.
struct SoftmaxStats {
  float* row_max2 = nullptr;  // [B,h,Q]
  float* row_sum = nullptr;   // [B,h,Q]

  bool empty() const { return row_max2 == nullptr; }
};

// ---- A cached call's keys ---------------------------------------------------
//
// A forward over a KV cache (incremental decoding): k and v are the cache's
// storage, capacity = k.shape[2] slots per row, of which row b holds
// lengths[b] keys; the forward's Q queries are the last Q of them (the new
// keys already written), so query i of row b sits at position
// lengths[b] - Q + i. kernels::decode_forward takes it (the decode kernel's
// split-K chunks, or the fused kernel for long prefills); DecodeParams below
// is the flat form the decode kernels read.

// The number format of a cache's storage: float32, or bfloat16 (the upper
// 16 bits of a float32, core/bf16.h).
enum class CacheDtype { F32, BF16 };

// The decode kernel's split-K chunks are whole tiles of this many keys.
inline constexpr int64_t kDecodeTile = 32;

struct KeyCache {
  // [B]: how many keys row b holds (each in [0, capacity]); null: the call
  // is not a cached one.
  const int64_t* lengths = nullptr;
  CacheDtype dtype = CacheDtype::F32;
  // dtype BF16: the cache's bits, at k's and v's shapes and strides (whose
  // float data pointers are then null).
  const uint16_t* k_bf16 = nullptr;
  const uint16_t* v_bf16 = nullptr;
  // Keys per split-K chunk of the decode kernel: 0 (its choice,
  // decode_chunk_keys) or a positive multiple of kDecodeTile. The chunking
  // fixes the order of the sums, so a given value gives the same bits at
  // any thread count.
  int64_t chunk_keys = 0;
  // A ring buffer (a cache made for a sliding window): lengths[b] counts
  // every position row b was given, which may pass the capacity; the row
  // holds only the last min(lengths[b], capacity) of them, position j in
  // slot j % capacity. Every query's window must lie within them
  // (window_left >= 0 and window_left + Q <= capacity; checked).
  bool ring = false;

  bool active() const { return lengths != nullptr; }
};

// ---- The forward ------------------------------------------------------------

struct AttentionForward {
  TensorView q, k, v;   // [B,h,Q,d], [B,hkv,K,d], [B,hkv,K,dv] (hkv = h: the d2l chapter)
  TensorView out;       // [B,h,Q,dv], may be a view into a (B, Q, h*d) buffer
  // Optional [B,h,Q,K] contiguous: the softmax weights before dropout.
  float* weights = nullptr;
  // Optional: where the fused kernel writes its softmax statistics
  // (kernels/params.h). Only the fused kernel writes them, so
  // kernels::attention_forward returns them when it did and an empty
  // SoftmaxStats otherwise: what a backward may then be given.
  SoftmaxStats stats;
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;  // [B] or [B,Q]
  float scale_divisor = 1.0f;   // sqrt(d), applied as the chapter does: scores / sqrt(d)
  Dropout dropout;

  MaskOptions masks;  // beyond the chapter (all off by default)

  // [B] or null: batch rows whose every key the fused kernel must read,
  // masked or not, because some value row past the lengths is not finite:
  // the chapter multiplies it by weight 0, and 0 * NaN reaches the row's
  // outputs. All their k and v rows must be valid. (The other kernels read
  // every row anyway.)
  const uint8_t* read_all_keys = nullptr;

  // BFloat16: q, k and v hold bfloat16 values (the engine rounds the
  // projections, mha/precision.h), so a kernel may form q k^T on bfloat16
  // units (the Blas kernel does) with the same result as in float32 but for
  // the order of the float32 sums. The fused forward on AMX
  // (cpu/fused/attention_amx.h) also forms P v there, P split into two
  // bfloat16 parts (2^-16 relative). The weights, their statistics and the
  // backward's gradients stay float32.
  Precision precision = Precision::Float32;

  // Set: a cached call (KeyCache above); k and v then span the cache's
  // capacity and each row's keys are its cache.lengths[b] first slots. Only
  // kernels::decode_forward takes it; attention_forward refuses it.
  KeyCache cache;

  int64_t B() const { return q.shape[0]; }
  int64_t H() const { return q.shape[1]; }
  int64_t Q() const { return q.shape[2]; }
  int64_t K() const { return k.shape[2]; }
  int64_t d() const { return q.shape[3]; }
  int64_t dv() const { return v.shape[3]; }  // value width (= d inside the module)
  int64_t Hkv() const { return k.shape[1]; }   // kv heads, dividing H()
  int64_t kv_head(int64_t h) const { return h / (H() / Hkv()); }
  // The length seen by query i of batch row b; +inf when unmasked.
  float length(int64_t b, int64_t i) const {
    switch (length_kind) {
      case LengthKind::None: return __builtin_inff();
      case LengthKind::PerBatch: return lens[b];
      case LengthKind::PerQuery: return lens[b * Q() + i];
    }
    return __builtin_inff();
  }
};

// ---- The backward -----------------------------------------------------------
//
// The gradient of the forward above with respect to its three
// inputs, given the gradient of its output:
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] grad_out:[B,h,Q,dv]
//     -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
//
// (hkv = h: the d2l chapter; with grouped heads, hkv dividing h, query head h reads
// kv head h / (h / hkv), and grad_k, grad_v sum over the query heads of each
// kv head.)
//
// With S = mask(q k^T / sqrt(d)), P = softmax(S) per row, M the dropout
// multipliers (0 or 1/(1-p); all 1 without dropout) and out = (P*M) v:
//
//   grad_v = (P*M)^T grad_out
//   dP     = (grad_out v^T) * M
//   dS     = P * (dP - rowsum(dP * P))   on unmasked entries, 0 on masked ones
//   grad_q = dS k / sqrt(d),  grad_k = dS^T q / sqrt(d)
//
// A masked score was *replaced* by -1e6 (the d2l chapter's masked_softmax assigns
// it), so no gradient flows through it: its dS is exactly 0. A masked key
// whose weight underflowed to 0 in every row therefore gets exactly zero
// grad_k and grad_v.
//
// `fwd.masks` carries the forward's MaskOptions (above):
// dS is 0 on every pair that does not take part, and on every fully masked
// row (its weights are the policy's constant, not a function of the scores),
// so such a row passes gradient to v alone (uniform) or nowhere (zeros), and
// never NaN. cpu/reference/attention_backward_masked.h writes the formulas out.
//
// The dropout mask is not stored: `fwd.dropout` carries the forward call's key and
// the kernel recomputes each multiplier from it (Dropout above).
//
// Outputs are overwritten, not accumulated; the module accumulates parameter
// gradients itself. Every view's innermost dimension is contiguous.

struct AttentionBackward {
  // The forward call being differentiated, as it was made: q, k, v, lengths,
  // scale, dropout (p and key), masks, and its results, now read-only inputs:
  //   fwd.out     [B,h,Q,dv] the forward's output (gives rowsum(dP * P));
  //               the fused backward needs it
  //   fwd.weights [B,h,Q,K] or null: the saved weights before dropout (the
  //               BLAS backward uses them instead of recomputing)
  //   fwd.stats   the statistics kernels::attention_forward returned, or
  //               empty: given, the fused backward runs from them
  // The reference backward recomputes everything from q, k and v.
  AttentionForward fwd;
  TensorView grad_out;  // [B,h,Q,dv]: dL/d(out), may be a view into a (B, Q, h*dv) buffer

  // Outputs, overwritten.
  TensorView grad_q, grad_k, grad_v;  // [B,h,Q,d], [B,hkv,K,d], [B,hkv,K,dv]
  // [h], overwritten, when fwd.masks.sinks is set (required then): dL/d sinks,
  // -sum over rows and queries of exp(sink - logsumexp) * rowsum(dP * P).
  float* grad_sinks = nullptr;

  // fwd.stats (and fwd.out) are those of a softmax over more keys than this
  // call's: one key block of several, merged by kernels/softmax_merge.h (the
  // ring over ranks). The gradients are then this block's share of the
  // whole softmax's; a row's single live key here need not carry weight 1.
  bool stats_span_more_keys = false;

  // The forward's shapes (methods, not copies).
  int64_t B() const { return fwd.B(); }
  int64_t H() const { return fwd.H(); }
  int64_t Q() const { return fwd.Q(); }
  int64_t K() const { return fwd.K(); }
  int64_t d() const { return fwd.d(); }
  int64_t dv() const { return fwd.dv(); }
  int64_t Hkv() const { return fwd.Hkv(); }
  int64_t kv_head(int64_t h) const { return fwd.kv_head(h); }
  float length(int64_t b, int64_t i) const { return fwd.length(b, i); }
};

// ---- Weights recomputed from statistics -------------------------------------
//
// The weights of some (batch row, head)
// pairs, recomputed from the statistics a forward saved.
//
//   q:[B,h,Q,d] k:[B,hkv,K,d] stats:[B,h,Q] -> out:[rows.size(), heads.size(), Q, K]
//
// A module that ran the fused forward keeps two floats per query instead of
// the (B, h, Q, K) weights; a later attention_weights() asks for the pairs it
// wants through kernels::attention_weights (kernels/dispatch.h).

struct AttentionWeightsParams {
  // The forward call, as it was made: q, k, lengths, scale and masks, and in
  // fwd.stats the statistics it returned (required). v, out, weights, dropout
  // and read_all_keys are not read: the weights are before dropout.
  AttentionForward fwd;
  std::vector<int64_t> batch_rows;  // each in [0, B)
  std::vector<int64_t> heads;       // each in [0, h)
  float* out = nullptr;             // [rows, heads, Q, K] contiguous
};

// ---- A cached call, flat (incremental decoding) -----------------------------
//
// A few new queries attending over many cached keys: the cached
// AttentionForward's fields spelled out as the decode kernels read them
// (decode_params() makes it; tests and `mha bench` fill it directly).
//
//   q:[B,Hq,Qn,d] k_cache:[B,Hkv,capacity,d] v_cache:[B,Hkv,capacity,dv]
//   lengths:[B] -> out:[B,Hq,Qn,dv]
//
// A plain struct of pointers and strides (in elements; the innermost axis of
// every view is contiguous), as the forward above.
//
// What a cached length means. lengths[b] is how many keys batch row b has:
// cache slots 0 .. lengths[b]-1, the Qn new keys (of the queries being
// decoded) already written as the last Qn of them. So the key axis of row b
// is K = lengths[b] long; slots from lengths[b] to capacity are unwritten
// storage, not keys, and are never read. That is the d2l chapter's attention
// of the Qn queries over those K keys, with, when `masks.causal` is set, the
// chapter's valid lengths per query (shape (B, Q)): query i keeps keys
// j < K - Qn + i + 1 (itself and everything before it) and the others get
// the chapter's -1e6 score, so a query whose valid length is <= 0 gets
// uniform weights over the row's K keys, as masked_softmax gives. Without
// causality every query sees all K keys.
//   lengths[b] = 0: row b has no keys at all (an idle slot of a ragged
// batch); the chapter's softmax over an empty axis is undefined, and its
// output is 0 here (nothing is read). When causal, a row with keys must
// hold the new block: lengths[b] >= Qn (checked).
//
// Masks beyond causality (both optional, both combine with it):
// - the chapter's valid lengths, (B,) or (B, Qn) (length_kind, lens): query
//   i of row b keeps keys j < min(lens, its causal limit); the others get
//   the -1e6 fill (LengthKind above; a fractional
//   length keeps the keys below it, as masked_softmax's arange < length);
// - nn.MultiheadAttention's key_padding_mask over each row's K keys
//   (masks.key_keep: 1 = takes part; masks.key_bias: added to the scaled
//   score), rows masks.key_stride_b apart. With fill NegInf a masked key drops out
//   (weight exactly 0) and a query whose every key is masked, or scores
//   -inf, gets `masks.fully_masked`: zeros, or uniform weights 1/K over the row's K
//   keys (the drop-in's policy, mha/masks.h).
//
// Grouped heads: query head h reads cache head h / (Hq / Hkv).
// Storage: the cache is float32 or bfloat16 (the upper 16 bits of a float32,
// rounded to nearest even by to_bf16); the math is float32 either way.

// The default masks of a cached call: causal within the new block.
inline MaskOptions causal_masks() {
  MaskOptions m;
  m.causal = Causal::BottomRight;
  return m;
}

struct DecodeParams {
  const float* q = nullptr;  // [B,Hq,Qn,d]
  int64_t q_stride_b = 0, q_stride_h = 0, q_stride_i = 0;
  // [B,Hkv,capacity,d] and [B,Hkv,capacity,dv], elements of `dtype`
  // (float or uint16_t bfloat16 bits); strides count elements.
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride_b = 0, k_stride_h = 0, k_stride_j = 0;
  int64_t v_stride_b = 0, v_stride_h = 0, v_stride_j = 0;
  CacheDtype dtype = CacheDtype::F32;
  float* out = nullptr;  // [B,Hq,Qn,dv]
  int64_t out_stride_b = 0, out_stride_h = 0, out_stride_i = 0;
  const int64_t* lengths = nullptr;  // [B], each in [0, capacity]
  int64_t B = 0, Hq = 0, Hkv = 0, Qn = 0, capacity = 0, d = 0, dv = 0;
  float scale_divisor = 1.0f;  // sqrt(d): scores are (q . k) / scale_divisor
  // The chapter's valid lengths: [B] (PerBatch) or [B, Qn] (PerQuery), each
  // a number >= 0 (+inf: no limit); null with LengthKind::None.
  LengthKind length_kind = LengthKind::None;
  const float* lens = nullptr;
  // The masks beyond the lengths: the one mask type of every kernel
  // (MaskOptions above). A cached call reads: causal None or
  // BottomRight (the new block is the last Qn of each row's K keys, so
  // BottomRight is "causal within the new block"; the default); key_keep /
  // key_bias, nn.MultiheadAttention's key_padding_mask, [B, key_stride_b]
  // (key_stride_b >= every length), key j of row b at b * key_stride_b + j;
  // fill and fully_masked; the score options softcap, alibi_slopes [Hq]
  // (query i of row b at position lengths[b] - Qn + i) and sinks [Hq]
  // (one term per row's denominator, however many chunks the row takes).
  // Pair masks are not taken (checked).
  MaskOptions masks = causal_masks();
  // Keys per split-K chunk: 0 (decode_chunk_keys chooses) or a positive
  // multiple of kDecodeTile (KeyCache::chunk_keys).
  int64_t chunk_keys = 0;
  // A ring buffer (KeyCache::ring): row b's keys are positions
  // held_from(b) .. lengths[b]-1, position j in slot(j); lengths may pass
  // the capacity. The row's keys, for the fully-masked policy too, are the
  // held ones; the window keeps every query inside them (checked).
  bool ring = false;
  int64_t held_from(int64_t b) const { return ring ? std::max<int64_t>(0, lengths[b] - capacity) : 0; }
  int64_t slot(int64_t j) const { return ring ? j % capacity : j; }

  int64_t group() const { return Hq / Hkv; }  // query heads per cache head
  // Query i's valid length in row b of K keys: keys j < valid_len(b, K, i)
  // take part (before key_keep / key_bias), the causal limit, the window's
  // right side and the chapter's length together.
  int64_t valid_len(int64_t b, int64_t K, int64_t i) const {
    int64_t n = std::min(K, masks.last_key(i, Qn, K) + 1);
    if (length_kind == LengthKind::None) return n;
    const float len = lens[length_kind == LengthKind::PerBatch ? b : b * Qn + i];
    // #{j : float(j) < len}; exact for the capacities a cache can have (< 2^24 keys).
    if (len < static_cast<float>(n)) n = len <= 0.0f ? 0 : static_cast<int64_t>(std::ceil(len));
    return n;
  }
  // Query i's first key in a row of K keys (the window's left side; 0
  // without one): keys j < first_key(K, i) take no part either.
  int64_t first_key(int64_t K, int64_t i) const { return std::max<int64_t>(0, masks.first_key(i, Qn, K)); }
  bool causal() const { return masks.causal != Causal::None; }

  // Contiguous views of contiguous buffers (strides of a row-major layout).
  void set_contiguous_strides() {
    q_stride_i = d, q_stride_h = Qn * d, q_stride_b = Hq * Qn * d;
    k_stride_j = d, k_stride_h = capacity * d, k_stride_b = Hkv * capacity * d;
    v_stride_j = dv, v_stride_h = capacity * dv, v_stride_b = Hkv * capacity * dv;
    out_stride_i = dv, out_stride_h = Qn * dv, out_stride_b = Hq * Qn * dv;
  }
};

// The flat form of a cached forward (p.cache.active()): the same call, the
// views' pointers and strides spelled out. With `check`, the one validation
// of a cached call: throws mha::Error naming `op` for anything a decode
// kernel cannot take (check_decode_params, kernels/validate.h, included).
// Without, only the views' ranks and the lengths are checked: enough to size
// a call whose pointers are not set yet (decode_forward_working_bytes).
DecodeParams decode_params(const AttentionForward& p, const char* op, bool check = true);

// n[b*Q + q] = #{k < K : float(k) < length(b, q)}: how many keys query q of
// row b sees (K when unmasked). K must be at most 2^24.
std::vector<int32_t> valid_key_counts(LengthKind kind, const float* lens, int64_t B, int64_t Q,
                                      int64_t K);

}  // namespace mha::kernels
