// src/kernels/ring_rows.h: one rank's query rows of a sequence-parallel
// attention, attending over key/value blocks that arrive one at a time
// (ring attention's compute, without its transport).
//
// The caller moves the blocks (torch.distributed's point-to-point calls for
// mha.torch.distributed, python/ring_calls.cpp); this class runs the fused
// kernel on each (query piece, key piece) pair, merges the blocks' softmaxes
// into one over every key (kernels/softmax_merge.h, in the order the blocks
// are given) and, for the backward, runs the fused backward from the merged
// statistics block by block. A rank's rows and a block's keys are each one
// or more pieces of consecutive GLOBAL positions (two with the zigzag order:
// chunks r and 2P-1-r of 2P), so masks and dropout follow the whole
// attention's positions:
//   - lengths: per batch row over global key positions (key j is live iff
//     j < lens[b]);
//   - causal: top-left over global positions (key j <= query i; Q = K);
//   - key_keep: a [B, K] keep mask over global keys (1 = takes part);
//   - dropout: each weight's mask indexed in the whole (B, H, Q, K) tensor
//     (kernels::DropoutFrame), so every rank drops what one process does.
// A row with no live key anywhere gets `fully_masked` (uniform over all K
// keys, as the d2l chapter's -1e6 fill, or zeros), as one process's kernel
// gives it. The merged result is bitwise the same at any thread count.
//
// Shapes: q [B, Q_r, H*d] (this rank's rows, pieces in order), a block's
// k, v [B, K_b, H*d] (its pieces in order), out and grad_out [B, Q_r, H*d].
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/params.h"
#include "mha/masks.h"

namespace mha::kernels {

// Global positions [begin, begin + size), rows in this order.
struct Piece {
  int64_t begin = 0, size = 0;
};

struct RingRowsSpec {
  int64_t B = 0, H = 0, d = 0;  // batch rows, heads, head width (values as wide)
  int64_t Q = 0, K = 0;         // the whole attention's queries and keys
  std::vector<Piece> q_pieces;  // this rank's query rows
  std::vector<float> lens;      // [B] global key lengths, or empty
  bool causal = false;          // top left over global positions
  const uint8_t* key_keep = nullptr;  // [B, K] or null; outlives the calls
  MaskFill fill = MaskFill::Seed;
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;
  Dropout dropout;              // p and key; frames are set per call
  // These heads' place among the module's (head parallelism: a rank's
  // share of the heads), for the dropout frames; all_heads 0: H.
  int64_t first_head = 0, all_heads = 0;
  Precision precision = Precision::Float32;  // q, k, v hold bfloat16 values in BFloat16
  float scale_divisor = 1.0f;   // sqrt(d)
};

class RingRows {
 public:
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

  int64_t rows() const { return Qr_; }

 private:
  // Query i (row of this rank) -> its global position.
  int64_t position(int64_t i) const;
  // Whether the pair (query piece, key piece) can be skipped: no row in it
  // has a live key there (rows with no live key anywhere are never skipped).
  bool skippable(int64_t b, const Piece& qp, int64_t q_row, const Piece& kp) const;
  // Batch row b's per-query lengths over the pair's keys (lengths and the
  // causal limit over global positions), into lens_buf_.
  void pair_lengths(int64_t b, int64_t q_row, const Piece& qp, const Piece& kp);
  // The kernel's parameters for batch row b, head h of the pair.
  AttentionForward pair_params(int64_t b, int64_t h, int64_t q_row, const Piece& qp, const float* k,
                               const float* v, int64_t Kb, int64_t k_row, const Piece& kp);
  // The last global key of query at global position x by length and causal
  // limit (-1: none).
  int64_t last_key(int64_t b, int64_t x) const;
  bool masked_anywhere(int64_t b, int64_t x) const;  // no live key in any block

  RingRowsSpec s_;
  int64_t Qr_ = 0, Hd_ = 0;
  const float* q_ = nullptr;
  const float *out_ = nullptr, *grad_out_ = nullptr;
  std::vector<int64_t> first_kept_;              // [B] with key_keep: each row's first kept key (K: none)
  std::vector<float> acc_, row_max2_, row_sum_;  // [B,Q_r,H*d], [B,H,Q_r] each
  std::vector<float> block_out_, block_stats_, lens_buf_, d_live_, dq_, dq_pair_, dk_pair_, dv_pair_;
};

}  // namespace mha::kernels
