// mha/dist/ring_attention.h: the d2l chapter's MultiHeadAttention with the
// sequence split over the ranks (ring attention).
//
//   mha::dist::RingAttention attention(comm, 100, 5, state);   // every rank
//   auto [begin, n] = mha::dist::RingAttention::block_of(Q, comm.size(), comm.rank());
//   mha::Tensor out = attention.forward(X_mine, Y_mine, Y_mine, lens);  // [B, n, 100]
//
// Rank r holds a consecutive block of the queries [B,Q_r,Dq] and of the
// keys and values [B,K_r,D] (in rank order: rank 0 the first positions; any
// sizes, 0 included), projects them with the full weights, and attends its
// queries to every key: the key/value blocks travel round the ring of ranks
// (each rank sends its current block to rank r+1 and receives the next from
// rank r-1 while it computes on the current one), and each query row keeps
// the running maximum and sum of its softmax (online softmax) so that the
// blocks' partial results merge into the exact softmax over all keys. The
// output is this rank's rows of the module's output.
//
// Masks are those of the whole sequence: valid lengths count global key
// positions (a rank whose keys all lie past a row's length contributes
// nothing to that row, or, with the chapter's -1e6 fill, exactly what the
// fill gives), and causal masking and a sliding window compare global
// positions. Without `causal`, a window or documents the chapter's masked_softmax
// applies (masked scores -1e6: a row of length 0 gets uniform weights over
// all keys); with them, as MultiHeadAttention with CallMasks: masked scores
// are -inf (lengths included) and a row with no live key gets `fully_masked`.
//
// The backward passes each key/value block round the ring again, with its
// gradients dK, dV accumulated by every rank and arriving back at their
// owner at the end; weight gradients are summed over the ranks by one
// all-reduce, so grads() is the same, whole, on every rank.
//
// Each block runs the fused kernel with its softmax statistics (one call per
// batch row and head, with MPI progress between them so that the next
// block's transfer overlaps), and the blocks merge into the softmax over
// every key (src/kernels/softmax_merge.h); the backward runs each block's
// fused backward from the merged statistics. A block that every query tile
// (256 rows) of every batch row is masked from (by the causal mask, the
// window or the valid lengths) is skipped, and still travels on (stats() counts the
// tiles). Skipping is exact: such a tile adds exactly zero (with the
// chapter's -1e6 fill, e^(-1e6 - m) is 0 in float next to any live score m
// > -999896). A tile holding a row with no live key at all is never
// skipped: that row's weights span every key. A rank's key block holds at
// most 2^24 keys (the fused kernel's key axis).
//
// Before it allocates, a forward adds up what it needs on this rank
// (projections, the two blocks in flight, a block's output and statistics,
// the output, the weights if kept) and checks it against mha::memory_limit(): a
// sequence too long for one process's limit runs when each rank's share
// fits (stats().planned_bytes).
//
// Calls are collective: every rank calls
// forward() and backward() in the same order; a call that fails on one rank
// fails on every rank. The same ranks, inputs and thread count give bitwise
// the same results on every run (fixed tiles, fixed order of the ring).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mha/dist/communicator.h"
#include "mha/masks.h"
#include "mha/multihead.h"
#include "mha/precision.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha::dist {

class GridAttention;

// What the last forward did on this rank (RingAttention::stats()).
struct RingStats {
  int64_t tiles = 0;           // (batch row, query tile, key block) tiles met
  int64_t tiles_skipped = 0;   // of those, skipped: every query masked from every key of the block
  uint64_t planned_bytes = 0;  // the bytes the call planned, checked against mha::memory_limit()
  double compute_seconds = 0;  // time in the steps' computation
  double step_seconds = 0;     // time from each step's start to the next block's arrival (compute + waits)
};

// MultiHeadAttention over a sequence split into the ranks' blocks (see the file comment).
class RingAttention {
 public:
  // `state`: the full module's state dict (as HeadParallelAttention takes
  // it), the same on every rank; checked as MultiHeadAttention::load_state_dict
  // checks it. Collective.
  RingAttention(Communicator comm, int64_t num_hiddens, int64_t num_heads, const StateDict& state);
  ~RingAttention();
  // Moves the module (its communicator, weights and last call); the moved-from one is unusable.
  RingAttention(RingAttention&&) noexcept;
  // Move assignment, as the move constructor.
  RingAttention& operator=(RingAttention&&) noexcept;

  // (begin, count): the block of `length` positions rank `rank` of `size`
  // holds when they are split as evenly as possible (the first length %
  // size ranks one more).
  static std::pair<int64_t, int64_t> block_of(int64_t length, int size, int rank);

  // queries:[B,Q_r,Dq] keys:[B,K_r,Dk] values:[B,K_r,Dv], this rank's
  // blocks; valid_lens none, (B,) or (B,Q_r) (this rank's queries), counting
  // keys of the whole sequence -> [B,Q_r,num_hiddens], this rank's rows of
  // the module's output. Collective.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens = {},
                 Causal causal = Causal::None, FullyMaskedRows fully_masked = FullyMaskedRows::Uniform);
  // The same with a sliding window over global positions (masks.window,
  // bottom right over the whole sequence, as MultiHeadAttention takes it),
  // causal, the fully-masked policy and the score options (softcap, ALiBi
  // slopes, one per head of the module, distances over global positions)
  // from `masks`; key_padding_mask and attn_mask are refused (valid lengths
  // cover padding). Collective.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens,
                 const CallMasks& masks);
  // The same with attention sinks (gpt-oss; FlashAttention's and ggml's
  // sinks), given here or as masks.scores.sinks (as the modules take them;
  // not both): sinks[h], one finite logit per head of the module (the same on
  // every rank) or empty (none), joins each query row's softmax denominator
  // once, with no value, after the key blocks merge; a row's weights then
  // sum to 1 - exp(sink - logsumexp), and no row is fully masked (under
  // causal masks or a window a row with no live key puts all its weight on
  // the sink: output 0). backward() adds their gradient into sinks_grad().
  // `doc_offsets`, when not empty: a packed row of documents
  // (FlashAttention's varlen cu_seqlens) over global positions, B = 1 and
  // Q = K, documents + 1 nondecreasing offsets from 0 to K; query i of
  // document [s, e) sees only keys in [s, e) (every other mask applying
  // within it, the -inf fill and the fully-masked policy as under causal
  // masks); a key block that lies wholly in other documents than all of a
  // tile's queries' is skipped. Collective.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens,
                 const CallMasks& masks, const std::vector<float>& sinks,
                 const std::vector<int64_t>& doc_offsets = {});
  // grad_output:[B,Q_r,num_hiddens] of the last forward -> the gradients of
  // this rank's queries, keys and values; adds the weights' gradients,
  // summed over the ranks, into grads(). Collective.
  MultiHeadAttention::InputGrads backward(const Tensor& grad_output);

  // Training mode (the default): forward() keeps its inputs for backward().
  // Evaluation mode: it keeps nothing for a backward, and plans less memory.
  void train(bool on = true);
  // Evaluation mode.
  void eval() { train(false); }

  // The number format of the products and of q, k, v (mha/precision.h; as
  // MultiHeadAttention::set_precision): in BFloat16 the projections (and
  // their backward) round both inputs to bfloat16 and sum in float32, and
  // the projected q, k, v are rounded to bfloat16; the softmax, its merge
  // over the blocks and the gradients stay float32. Every rank sets the
  // same; a call reads it when it starts.
  void set_precision(Precision p);
  // The number format set (set_precision; Float32 by default).
  Precision precision() const;

  // Dropout on the attention weights in training mode, as
  // MultiHeadAttention(num_hiddens, num_heads, p, bias, seed) draws it: a
  // key per forward from the stream `seed` starts, and the mask of weight
  // (b, h, q, k) keyed by its place in the whole sequence, so the ring
  // drops exactly what one process does (the same output, bit for bit up to
  // the order of float32 sums). Every rank sets the same; 0 (the default):
  // none.
  void set_dropout(float p, uint64_t seed);
  // The dropout probability set (set_dropout; 0 by default).
  float dropout() const;

  // Whether forward() keeps this rank's rows of the attention weights for
  // attention_weights() (off by default: they are [B,H,Q_r,K], the size the
  // ring otherwise avoids).
  void keep_attention_weights(bool on);
  // [B, num_heads, Q_r, K]: the last forward's softmax weights of this
  // rank's queries over every key (as MultiHeadAttention::attention_weights
  // gives them for these rows); empty unless keep_attention_weights(true).
  const Tensor& attention_weights() const;
  // What the last forward did on this rank: tiles computed and skipped,
  // bytes planned, time computing and stepping.
  const RingStats& stats() const;

  // The weights (the state dict given), by the chapter's names.
  const StateDict& state_dict() const;
  // Accumulated weight gradients by name, the same on every rank.
  const StateDict& grads() const;
  // dL/d sinks accumulated by backward() ([num_heads] of the module, the
  // same bits on every rank: each rank's rows summed in a fixed order, the
  // ranks' shares added in rank order); zeros after a backward of a call
  // without sinks, empty before the first backward.
  const std::vector<float>& sinks_grad() const;
  // Sets the accumulated gradients (sinks_grad() too) to zero.
  void zero_grad();
  // The communicator the calls run over.
  const Communicator& communicator() const;

 private:
  friend class GridAttention;
  // Only heads [first_head, first_head + head_count) of the module: their
  // rows of W_q, W_k, W_v and columns of W_o; W_o's bias only when
  // `output_bias` (GridAttention's head groups add it once).
  RingAttention(Communicator comm, int64_t num_hiddens, int64_t num_heads, const StateDict& state,
                int64_t first_head, int64_t head_count, bool output_bias);
  // The last backward's dL/d sinks over the module's heads, zero outside
  // this ring's (GridAttention sums its groups' by an all-reduce).
  const std::vector<float>& last_sinks_grad() const;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace mha::dist
