// src/nn/ring_rows.h: one rank's query rows of a sequence-parallel
// attention, attending over key/value blocks that arrive one at a time
// (ring attention's compute, without its transport). Both rings run it:
// the MPI ring (dist/ring_attention.cpp) and mha.torch.distributed's
// (python/bindings/ring_calls.cpp); each keeps only its transport and projections.
//
// The caller moves the blocks; this class runs the fused kernel on each
// (query tile, key piece) pair, merges the blocks' softmaxes into one over
// every key (kernels/softmax_merge.h, in the order the blocks are given)
// and, for the backward, runs the fused backward from the merged statistics
// block by block. A rank's rows and a block's keys are each one or more
// pieces of consecutive GLOBAL positions (two with the zigzag order: chunks
// r and 2P-1-r of 2P), so every option follows the whole attention's
// positions:
//   - lengths: none, per batch row (B,) or per query (B, Q_r: this rank's
//     rows) over global key positions (key j is live iff j < length);
//   - masks.causal over global positions (TopLeft: j <= x; BottomRight:
//     j <= x + K - Q), masks.window bottom right over the whole attention,
//     masks.key_padding_mask a keep mask (B, K) over global keys;
//   - doc_offsets: a packed row of documents over global positions;
//   - softcap, ALiBi (distances over global positions) and sinks of the
//     module's heads, read at first_head + h; a sink joins each row's
//     denominator once, after the last block (finish);
//   - dropout: each weight's mask indexed in the whole (B, H_all, Q, K)
//     tensor (kernels::DropoutFrame), so every rank drops what one process
//     does.
// A row with no live key anywhere gets masks.fully_masked_rows (uniform
// over all K keys, as the d2l chapter's -1e6 fill, or zeros), as one
// process's kernel gives it. A tile of rows (kTile) whose every row has a
// live key somewhere and none in a key piece skips that piece (stats()).
// The merged result is bitwise the same at any thread count.
//
// Shapes: q [B, Q_r, H*d] (this rank's rows, pieces in order), a block's
// k, v [B, K_b, H*d] (its pieces in order), out and grad_out [B, Q_r, H*d].
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "kernels/params.h"
#include "mha/masks.h"
#include "mha/valid_lens.h"

namespace mha::nn {

// Global positions [begin, begin + size), rows in this order.
struct Piece {
  int64_t begin = 0, size = 0;
};

struct RingRowsSpec {
  int64_t B = 0, H = 0, d = 0;  // batch rows, these heads, head width (values as wide)
  int64_t Q = 0, K = 0;         // the whole attention's queries and keys
  std::vector<Piece> q_pieces;  // this rank's query rows
  ValidLens lens;               // none, (B,) or (B, Q_r), over global keys
  // causal, window, fully_masked_rows and scores (one slope and sink per
  // head of the module); key_padding_mask none or a keep mask (B, K);
  // attn_mask none. Checked by the caller.
  CallMasks masks;
  std::vector<int64_t> doc_offsets;  // [documents + 1] from 0 to Q = K (B = 1), or empty
  kernels::MaskFill fill = kernels::MaskFill::Seed;
  kernels::Dropout dropout;     // p and key; frames are set per call
  // These heads' place among the module's (a rank's share of the heads, or a
  // grid's head group); all_heads 0: H.
  int64_t first_head = 0, all_heads = 0;
  Precision precision = Precision::Float32;  // q, k, v hold bfloat16 values in BFloat16
  float scale_divisor = 1.0f;   // sqrt(d)
  // [B, H, Q_r, K], zeroed, or null: the weights of every key, written by
  // add_block and rescaled by finish. Outlives the forward.
  float* weights = nullptr;
  // Called between kernel calls (MPI's progress, so that the next block's
  // transfer moves while this one is computed on); may be empty.
  std::function<void()> progress;
};

// What the forward did: (batch row, query tile, key piece) tiles met and skipped.
struct RingTiles {
  int64_t tiles = 0, skipped = 0;
};

class RingRows {
 public:
  // Query rows per tile: a tile that no key of a piece is live for skips it.
  static constexpr int64_t kTile = 256;

  // spec checked by the caller (shapes, pieces inside [0, Q) and [0, K)).
  explicit RingRows(RingRowsSpec spec);

  // ---- Forward: add_block for every block, in a fixed order, then finish.
  // q: [B, Q_r, H*d], read by every add_block (the caller keeps it alive).
  void begin_forward(const float* q);
  void add_block(const float* k, const float* v, const std::vector<Piece>& k_pieces);
  // out: [B, Q_r, H*d], the normalised attention output (the heads' concatenation).
  void finish(float* out);

  // ---- Backward, after finish: begin_backward, then every block again
  // (any order), then grad_q. out: what finish wrote; both kept alive by the
  // caller until the last backward_block.
  void begin_backward(const float* out, const float* grad_out);
  // Where the queries are now (the backward's q, the same values as the
  // forward's; the caller may hold them elsewhere between the passes).
  void set_queries(const float* q) { q_ = q; }
  // dk, dv: [B, K_b, H*d], overwritten with this rank's rows' share of the
  // block's key and value gradients.
  void backward_block(const float* k, const float* v, const std::vector<Piece>& k_pieces, float* dk, float* dv);
  // [B, Q_r, H*d]: the queries' gradient over every block given so far.
  // Taken by the caller (moved out).
  std::vector<float>& grad_q() { return dq_; }
  // [H]: this rank's rows' share of dL/d sink (zeros without sinks), after
  // begin_backward: -sum over rows of the sink's weight times dO . O, each
  // head's rows summed in a fixed order. The caller sums the ranks' shares.
  std::vector<double> sinks_grad_share() const;

  int64_t rows() const { return Qr_; }
  const RingTiles& tiles() const { return tiles_; }

 private:
  // One (batch row, query tile, key piece) of a block.
  struct Pair {
    int64_t b, q_row, x0, n;  // local first row, its global position, rows
    Piece kp;
    int64_t k_row, Kb;        // the piece's first row in the block, the block's rows
    int64_t piece;            // the piece's index in the block
  };
  template <class Each>
  void each_pair(const std::vector<Piece>& k_pieces, bool count, const Each& each);
  // [first, last] global keys query row i (local) of batch row b may see by
  // lengths, causal, window and documents (first > last: none).
  std::pair<int64_t, int64_t> live_range(int64_t b, int64_t i) const;
  // Kept keys of batch row b in [from, to] (all of them without a key padding mask).
  int64_t kept(int64_t b, int64_t from, int64_t to) const;
  bool skippable(const Pair& p) const;
  // The kernel's parameters for head h of the pair (per-query lengths and
  // the document mask in lens_buf_ / keep_buf_).
  kernels::AttentionForward pair_params(const Pair& p, int64_t h, const float* k, const float* v);
  void pair_masks(const Pair& p);  // fills lens_buf_, keep_buf_ for the pair

  RingRowsSpec s_;
  int64_t Qr_ = 0, Hd_ = 0;
  const float* q_ = nullptr;
  const float *out_ = nullptr, *grad_out_ = nullptr;
  std::vector<int64_t> position_;                 // [Q_r] global position of each local row
  std::vector<std::pair<int64_t, int64_t>> live_;  // [B * Q_r] live_range, once
  std::vector<uint8_t> nowhere_;                   // [B * Q_r] 1: no live key in any block
  std::vector<int64_t> kept_prefix_;               // [B, K + 1] with a key padding mask
  std::vector<float> acc_, row_max2_, row_sum_;    // [B,Q_r,H*d], [B,H,Q_r] each
  std::vector<float> block_out_, block_stats_, lens_buf_, d_live_, dq_, dq_pair_, dk_pair_, dv_pair_, w_pair_;
  std::vector<uint8_t> keep_buf_;
  bool pair_lens_ = false, pair_keep_ = false;
  // With weights: each key piece's statistics per row ([2, B*H*Q_r]), to
  // rescale its block-normalised weights in finish.
  std::vector<std::pair<Piece, std::vector<float>>> piece_stats_;
  RingTiles tiles_;
};

}  // namespace mha::nn
