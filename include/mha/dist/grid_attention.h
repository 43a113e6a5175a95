// mha/dist/grid_attention.h: the d2l chapter's MultiHeadAttention split by
// heads and along the sequence at once, over a 2-D grid of ranks.
//
//   mha::dist::GridAttention attention(comm, 2, 100, 4, state);  // 2 head groups x P/2 sequence blocks
//   auto [q0, nq] = attention.query_block(Q);
//   auto [k0, nk] = attention.key_block(K);
//   mha::Tensor out = attention.forward(X_rows_q0_nq, Y_rows_k0_nk, Y_rows_k0_nk, lens);  // [B, nq, 100]
//
// P = G x S ranks: rank r is in head group g = r / S and holds sequence
// block j = r % S (RingAttention::block_of(L, S, j) of the queries and of
// the keys). Head group g owns heads HeadParallelAttention::heads_of(
// num_heads, G, g); its S ranks run a RingAttention over those heads only
// (their rows of W_q, W_k, W_v, their columns of W_o), so each rank computes
// its heads for its positions and the key/value blocks of its heads travel
// round its group's ring. The G ranks that hold block j then sum their
// heads' parts of the output with one all-reduce (W_o's bias is added by
// group 0): every rank of block j gets rows q0 .. q0+nq of the module's
// output. Backward: each ring's backward, then one all-reduce per input
// over the head groups; each rank's weight gradients are its head group's
// (ring().grads(), summed over the group's ring); gather_grads()
// assembles the full module's on rank 0.
//
// Masks as RingAttention takes them (lengths over global key positions,
// causal). G = 1 is RingAttention, G = P is HeadParallelAttention's split
// with the sequence whole. Calls are collective over all P ranks; a call
// that fails on one rank fails on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mha/dist/communicator.h"
#include "mha/dist/ring_attention.h"
#include "mha/masks.h"
#include "mha/multihead.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha::dist {

// MultiHeadAttention over a head groups x sequence blocks grid of ranks (see the file comment).
class GridAttention {
 public:
  // head_groups: G, which must divide comm.size() and be at most num_heads.
  // `state`: the full module's state dict, the same on every rank.
  // Throws mha::Error on every rank for a bad G or state dict. Collective.
  GridAttention(Communicator comm, int head_groups, int64_t num_hiddens, int64_t num_heads, const StateDict& state);
  ~GridAttention();
  // Moves the module; the moved-from one is unusable.
  GridAttention(GridAttention&&) noexcept;
  // Move assignment, as the move constructor.
  GridAttention& operator=(GridAttention&&) noexcept;

  // This rank's head group g, 0 .. head_groups()-1.
  int head_group() const;
  // This rank's sequence block j, 0 .. sequence_blocks()-1.
  int sequence_block() const;
  // G, the number of head groups.
  int head_groups() const;
  // S = P / G, the number of sequence blocks (the ranks of each group's ring).
  int sequence_blocks() const;
  // The heads of this rank's group (ascending, contiguous).
  const std::vector<int64_t>& heads() const;
  // (begin, count) of this rank's block of `length` query positions.
  std::pair<int64_t, int64_t> query_block(int64_t length) const;
  // (begin, count) of this rank's block of `length` key (and value) positions.
  std::pair<int64_t, int64_t> key_block(int64_t length) const;

  // queries:[B,Q_j,Dq] keys:[B,K_j,Dk] values:[B,K_j,Dv], this rank's
  // blocks (the same on every rank of block j); valid_lens none, (B,) or
  // (B,Q_j), over global key positions -> [B,Q_j,num_hiddens], the module's
  // rows of block j. Collective.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens = {},
                 Causal causal = Causal::None, FullyMaskedRows fully_masked = FullyMaskedRows::Uniform);
  // The same with causal, a sliding window over global positions and the
  // fully-masked policy from `masks` (as RingAttention takes them). Collective.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens,
                 const CallMasks& masks);
  // The same with attention sinks (here or as masks.scores.sinks, not both),
  // one logit per head of the module (every
  // rank the same; each group's ring takes its heads'), and a packed row of
  // documents over global positions, as RingAttention::forward takes them.
  // Collective.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens,
                 const CallMasks& masks, const std::vector<float>& sinks,
                 const std::vector<int64_t>& doc_offsets = {});
  // grad_output:[B,Q_j,num_hiddens] of the last forward -> the gradients of
  // block j's queries, keys and values (summed over the head groups).
  // Collective.
  MultiHeadAttention::InputGrads backward(const Tensor& grad_output);

  // Training mode (the default) or evaluation mode, as RingAttention::train.
  void train(bool on = true);
  // Evaluation mode.
  void eval() { train(false); }
  // The number format of the products and of q, k, v, as
  // RingAttention::set_precision; every rank alike.
  void set_precision(Precision p);
  // Dropout as RingAttention::set_dropout: the same masks as the
  // single-process module with this seed; every rank alike.
  void set_dropout(float p, uint64_t seed);

  // Whether forward() keeps attention_weights() (off by default).
  void keep_attention_weights(bool on);
  // [B, heads().size(), Q_j, K]: the last forward's weights of this group's
  // heads for block j's queries over every key; empty unless kept.
  const Tensor& attention_weights() const;
  // The full module's accumulated weight gradients (the names and shapes of
  // its state dict), assembled on rank 0 from each head group's; empty on
  // the other ranks. Collective.
  StateDict gather_grads() const;
  // dL/d sinks of every head of the module, accumulated by backward(), the
  // same bits on every rank (each head's from its group's ring); empty
  // before the first backward.
  const std::vector<float>& sinks_grad() const;
  // Sets this rank's accumulated gradients (sinks_grad() too) to zero.
  void zero_grad();

  // This rank's ring (its head group's heads over its group's ranks): stats(), grads().
  const RingAttention& ring() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace mha::dist
