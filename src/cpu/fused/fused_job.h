// src/cpu/fused/fused_job.h: what the dispatcher (attention_fused.cpp) hands
// the kernel of one instruction set, and the table each such kernel exports.
//
// Plain data only: this header is included before the `#pragma GCC target`
// regions of the ISA files, so nothing in it is compiled for a wider target.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/params.h"

namespace mha::kernels::fused {

// The mask options as the tile kernels read them (kernels/params.h
// MaskOptions). Causality, lengths and each row's last kept key are already
// folded into the per-query key limit n_valid, and MaskOptions::first_key
// into `first`; keys inside [first, n_valid) still need the masking pass when
// `tile_mask[b]` is set (a key_keep with holes, a bias, a pair mask).
struct MaskJob {
  const MaskOptions* m = nullptr;      // never null in a job
  const uint8_t* tile_mask = nullptr;  // [B]: 1 when row b's keys below n need the masking pass
  // Scores are kept in base 2 (t = s * log2 e, the cheaper exponential),
  // except with an additive mask: a bias of -1e4 or -2e6 leaves too few bits
  // for the differences once scaled, so such calls keep natural scores
  // s + bias, as the reference adds them, and scale each difference to the
  // running max instead (`natural`; the statistics are then natural too).
  bool natural = false;
  float unit = 1.0f;                   // natural ? log2(e) : 1: a score difference -> base 2
  float fill = 0.0f;                   // a masked score in these units: the d2l chapter's fill or -inf
  float policy = 0.0f;                 // weight of every key in a fully masked row: 1/K or 0
  bool neg_inf = false;                // fill == NegInf
  bool zeros = false;                  // fully_masked == Zeros
  // The score options (MaskOptions::softcap, alibi_slopes, sinks). `scores`:
  // a softcap or ALiBi, applied by the score pass (Kernel::score_tile) to
  // each computed tile before the masking pass; off, the kernels run as
  // without them. Sinks join each row's statistics once, after its keys.
  bool scores = false;
  float score_unit = 1.0f;             // a natural score -> the job's units: natural ? 1 : log2(e)
  float cap = 0.0f;                    // the softcap in the job's units (0: off)
  const float* slopes = nullptr;       // [H] ALiBi slopes (natural units), or null
  const float* sinks = nullptr;        // [H] sink logits (natural units), or null
  // The score tile's scale c2 (a dot product -> the job's units) for the
  // score pass: divided by the softcap, which the pass's tanh then reads
  // directly (one multiply less per score).
  float score_scale(float c2) const { return cap > 0.0f ? c2 / cap : c2; }
};

// One query tile of a call: queries [i0, i0 + mq), and key0, the key its
// key tiles are counted from. Without documents tile t is [t*MQ, ...) and
// key0 is 0 (QueryTiles::at computes them); in a packed batch
// (MaskOptions::doc_offsets) the dispatcher cuts each document's rows from
// its first row, which is key0 too, so that no tile holds two documents'
// queries and a document's tiles of queries and keys fall as in a call on
// it alone. Tiles that straddled a boundary computed the union of both
// documents' keys, and key tiles began at the multiple of NK below the
// document: the packed forward took 1.19-1.33x the kernel time of its
// documents one by one, 1.05-1.07x with these tiles (B8 lengths averaging
// 40% of 1024, h8 d64 causal, -inf fill, one thread, CPU time, medians of
// 21; the rest went with the order of the chunks, QueryTiles::chunk).
// With documents also the document's key rows [key0, key_end) and its
// tiles [first_tile, first_tile + doc_tiles) of the table.
struct QueryTile {
  int64_t i0 = 0, mq = 0, key0 = 0;
  int64_t key_end = 0, first_tile = 0, doc_tiles = 0;
};
// The query tiles of one call: `count` of them; `table` null (no documents)
// or [count] (kernels::fused_query_tiles).
struct QueryTiles {
  const QueryTile* table = nullptr;
  int64_t count = 0;
  int64_t size = 0;  // queries per tile at most (the kernel's MQ)
  int64_t Q = 0;
  QueryTile at(int64_t t) const {
    if (table) return table[t];
    const int64_t i0 = t * size;
    return {i0, Q - i0 < size ? Q - i0 : size, 0, 0, 0, 0};
  }
  // Chunk c of B*H*count as (b*H + h, tile). Without documents
  // c = (b*H + h)*count + t. With them (B = 1) a document's chunks are
  // consecutive, its heads outer, so that a thread's next chunks read the
  // rows of the same document and head, as calls on each document alone:
  // the whole row's tiles head after head swept each head's quarter-KiB of
  // every 2 KiB row of q, k, v and out (h8 d64) across all documents, and
  // measured 1.05-1.07x the documents one by one, in this order 0.99-1.00x.
  QueryTile chunk(int64_t c, int64_t H, int64_t* bh) const {
    if (!table) {
      *bh = c / count;
      return at(c % count);
    }
    // Document x's chunks are [H*first_tile, H*(first_tile + doc_tiles)), so
    // tile c / H is one of x's.
    const QueryTile& any = table[c / H];
    const int64_t r = c - H * any.first_tile;
    *bh = r / any.doc_tiles;
    return table[any.first_tile + r % any.doc_tiles];
  }
};

// One forward call. Chunk c is (b, head, query tile) = c / (H*q_tiles), ...
struct ForwardJob {
  const AttentionForward* p = nullptr;
  // [B,Q]: the keys [0, n) query q may see: min of the length count
  // #{k < K : float(k) < length(b, q)}, its causal limit + 1 and row b's
  // last kept key (key_keep) + 1. Keys past it are masked.
  const int32_t* n_valid = nullptr;
  // [B,Q]: the first key query q may see (MaskOptions::first_key, at least
  // 0); keys before it are masked. first < n_valid, or both are 0 (no key).
  const int32_t* first = nullptr;
  float* row_max2 = nullptr;         // [B,h,Q] or null
  float* row_sum = nullptr;          // [B,h,Q] or null
  float c2 = 0.0f;                   // log2(e) / scale_divisor
  QueryTiles tiles;                  // the query tiles of a batch row
  int64_t q_tiles = 0;               // tiles.count
  const int64_t* kv_rows = nullptr;  // [B]: max over q of n_valid, the key rows read (K where read_all)
  int64_t pack_rows = 0;             // max over b of kv_rows
  const uint8_t* read_all = nullptr; // [B] or null: read every key of these rows
  // Where the keys and values are read. With kv_shared every thread reads
  // `keys` [B,Hkv,K,d] and `values` [B,Hkv,K,dv] in place, their rows d and
  // dv floats apart (attention_fused.cpp share_keys_values: when). Without
  // it each thread packs the (b, kv head) slice of its chunk into its
  // scratch (kernel_impl.h Scratch::kp, vp).
  bool kv_shared = false;
  TensorView keys, values;
  MaskJob mask;
};

// One weights request. Chunk c is (pair, query tile); pair = (row i, head j)
// of the request, writing out[(i*n_heads + j), Q, K].
struct WeightsJob {
  TensorView q, k;                   // [B,h,Q,d], [B,hkv,K,d]
  const int32_t* n_valid = nullptr;  // [B,Q]: per-query key limit, as in ForwardJob
  const int32_t* first = nullptr;    // [B,Q]: per-query first key, as in ForwardJob
  const float* row_max2 = nullptr;   // [B,h,Q]
  const float* row_sum = nullptr;    // [B,h,Q]
  float c2 = 0.0f;
  const int64_t* batch_rows = nullptr;
  const int64_t* heads = nullptr;
  int64_t n_rows = 0, n_heads = 0;
  float* out = nullptr;              // [n_rows, n_heads, Q, K]
  QueryTiles tiles;                  // as in ForwardJob
  int64_t q_tiles = 0;               // tiles.count
  const int64_t* kv_rows = nullptr;  // [B], as in ForwardJob
  int64_t pack_rows = 0;
  MaskJob mask;
};

// One backward call. Chunk c is (b, kv head) = (c / Hkv, c % Hkv), or with
// `segments` (document, kv head); it runs the query heads of that kv head
// in order, so that grad_k and grad_v sum over them on one thread.
struct BackwardJob {
  const AttentionBackward* p = nullptr;
  const int32_t* n_valid = nullptr;   // [B,Q]
  const int32_t* first = nullptr;     // [B,Q], as in ForwardJob
  const float* row_max2 = nullptr;    // [B,h,Q] from the fused forward
  const float* row_sum = nullptr;     // [B,h,Q]
  float c2 = 0.0f;                    // log2(e) / scale_divisor
  const int64_t* kv_rows = nullptr;   // [B]: key rows with any live key
  int64_t pack_rows = 0;              // max over b of kv_rows
  QueryTiles tiles;                   // as in ForwardJob (the key tiles follow documents too)
  // A packed batch whose masked keys weigh 0 (the -inf fill, the zeros
  // policy): a chunk per (document, kv head) (backward_impl.h).
  bool segments = false;
  // [B,h] with sinks ([documents,h] with segments): each (b, h)'s share of
  // dL/d sink_h, written by the chunk of (b, kv head of h); the dispatcher
  // sums it over b in order.
  double* sink_part = nullptr;
  MaskJob mask;
};

// The entry points of one instruction set's kernel (fused_<isa>.cpp).
struct IsaKernels {
  const char* name;
  int64_t query_tile;  // queries per chunk
  // Per-thread scratch for head widths d, dv and `rows` packed key rows; its
  // first 64 bytes must be zero before a thread's first chunk.
  size_t (*scratch_floats)(int64_t d, int64_t dv, int64_t rows);
  void (*forward_chunk)(const ForwardJob& job, int64_t chunk, float* scratch);
  void (*weights_chunk)(const WeightsJob& job, int64_t chunk, float* scratch);
  size_t (*backward_scratch_floats)(int64_t Q, int64_t d, int64_t dv, int64_t rows);
  void (*backward_chunk)(const BackwardJob& job, int64_t chunk, float* scratch);
};

extern const IsaKernels kScalarKernels;
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;

}  // namespace mha::kernels::fused
