// mha/dist/head_parallel.h: the d2l chapter's MultiHeadAttention with its
// heads spread over the ranks (Megatron-style tensor parallelism).
//
//   mha::dist::Environment mpi(argc, argv);
//   mha::dist::Communicator comm = mha::dist::Communicator::world();
//   mha::StateDict state = trained.state_dict();        // the same on every rank
//   mha::dist::HeadParallelAttention attention(comm, 100, 5, state);
//   mha::Tensor out = attention.forward(X, Y, Y, lens);  // [B,Q,100] on every rank
//   auto g = attention.backward(grad_out);               // input grads on every rank
//   mha::StateDict grads = attention.gather_grads();     // full, on rank 0
//
// Rank r of P owns a contiguous range of heads (heads_of: the first
// num_heads % P ranks one more than the others, so counts differ by at most
// one; a rank may own none when P > num_heads): its heads' rows of W_q, W_k,
// W_v (and their biases) and the matching columns of W_o. Each rank
// computes its heads' attention and their part of the output projection,
//   out_r = concat(heads of r) W_o[:, cols of r]^T   (+ b_o on rank 0 only),
// and one all-reduce sums the parts: out = sum_r out_r, the module's output.
// Every rank passes the whole inputs and gets the whole output. The backward
// mirrors it: each rank's input gradients are summed by one all-reduce; each
// rank keeps its shard's weight gradients (gather_grads() assembles them).
//
// A rank's shard is an ordinary MultiHeadAttention: the full module with the
// other heads removed by prune_heads, whose output keeps num_hiddens
// columns. Calls are collective: every rank calls forward() and backward()
// in the same order with the same arguments. A call that fails on one rank
// fails on every rank (the others say which rank failed), so that no rank is
// left waiting in a collective. Dropout draws each shard's masks from its own
// generator: in training mode with dropout the result is a valid dropout
// sample, not the single-process module's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mha/dist/communicator.h"
#include "mha/masks.h"
#include "mha/multihead.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha::dist {

// MultiHeadAttention split by heads over a communicator's ranks (see the file comment).
class HeadParallelAttention {
 public:
  // `state`: the full module's state dict (W_q/W_k/W_v (num_hiddens, in),
  // W_o (num_hiddens, num_hiddens), biases all or none), the same on every
  // rank. Throws mha::Error on every rank for bad sizes or a state dict the
  // d2l chapter's module (num_hiddens, num_heads) would refuse. Rank r's
  // shard draws its dropout masks from generator seed + r. Collective.
  HeadParallelAttention(Communicator comm, int64_t num_hiddens, int64_t num_heads, const StateDict& state,
                        float dropout = 0.0f, uint64_t seed = 0);
  ~HeadParallelAttention();
  // Moves the module (its communicator, weights and last call); the moved-from one is unusable.
  HeadParallelAttention(HeadParallelAttention&&) noexcept;
  // Move assignment, as the move constructor.
  HeadParallelAttention& operator=(HeadParallelAttention&&) noexcept;

  // The heads rank `rank` of `size` owns: a contiguous, ascending range,
  // empty when size > num_heads and rank >= num_heads.
  static std::vector<int64_t> heads_of(int64_t num_heads, int size, int rank);

  // queries:[B,Q,Dq] keys:[B,K,Dk] values:[B,K,Dv], valid_lens and masks as
  // MultiHeadAttention::forward takes them (attn_mask (Q, K) only, not per
  // head) -> [B,Q,num_hiddens], the whole output on every rank. Collective.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens = {},
                 const CallMasks& masks = {});
  // grad_output:[B,Q,num_hiddens] of the last forward (training mode) -> the
  // inputs' gradients, whole on every rank; adds this rank's weight
  // gradients into shard()'s grads(). Collective.
  MultiHeadAttention::InputGrads backward(const Tensor& grad_output);

  // The full state dict, assembled from the shards on rank 0 (every rank's
  // W_o.bias is rank 0's); empty on the other ranks. Collective.
  StateDict gather_state_dict() const;
  // The full module's accumulated gradients (names and shapes of
  // state_dict()) on rank 0; empty on the other ranks. Collective.
  StateDict gather_grads();
  // Zeroes this rank's accumulated gradients.
  void zero_grad();

  // Training mode (dropout on) when `on`, else evaluation mode; every rank alike.
  void train(bool on = true);
  // Evaluation mode: dropout off.
  void eval() { train(false); }
  // The number format of the shard's products and of its q, k, v
  // (MultiHeadAttention::set_precision); every rank alike.
  void set_precision(Precision p);

  // This rank's heads (heads_of(num_heads(), size, rank)).
  const std::vector<int64_t>& heads() const;
  // This rank's shard: the module with only heads() (null when it owns no
  // head). Its W_o.bias is zero except on rank 0, and stays so: backward()
  // zeroes its gradient there, so an optimiser leaves it at zero.
  MultiHeadAttention* shard();
  // The communicator the calls run over.
  const Communicator& communicator() const;
  // The output width (the full module's num_hiddens).
  int64_t num_hiddens() const;
  // The full module's head count.
  int64_t num_heads() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace mha::dist
