// mha::dist::GridAttention (mha/dist/grid_attention.h): a RingAttention over
// each head group's heads, summed over the head groups by all-reduces.
#include "mha/dist/grid_attention.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "dist/agree.h"
#include "dist/call_masks.h"
#include "dist/shards.h"
#include "mha/dist/head_parallel.h"
#include "mha/error.h"

namespace mha::dist {

struct GridAttention::State {
  State(Communicator all_ranks, int G) : all(std::move(all_ranks)), groups(G) {}
  Communicator all;
  int groups = 1, blocks = 1, group = 0, block = 0;
  int64_t num_hiddens = 0, num_heads = 0, head_dim = 0;
  std::vector<int64_t> heads;
  std::unique_ptr<Communicator> across_heads;  // the ranks of this sequence block, one per head group
  std::unique_ptr<RingAttention> ring;         // this head group's ring
  std::vector<float> sinks_grad;               // dL/d sinks of every head, summed over backward calls
};

GridAttention::GridAttention(Communicator comm, int head_groups, int64_t num_hiddens, int64_t num_heads,
                             const StateDict& state)
    : s_(std::make_unique<State>(std::move(comm), head_groups)) {
  static const char* op = "dist.GridAttention";
  State& s = *s_;
  const int P = s.all.size();
  agree(s.all, op, [&] {
    if (head_groups < 1 || P % head_groups != 0)
      fail(op, "head_groups: ", head_groups, " does not divide the ", P,
           " ranks; wanted a divisor G of P (G head groups x P/G sequence blocks)");
    if (head_groups > num_heads)
      fail(op, "head_groups: ", head_groups, " is more than the ", num_heads, " heads; wanted G <= num_heads");
    return 0;
  });
  s.num_hiddens = num_hiddens;
  s.num_heads = num_heads;
  s.head_dim = num_heads > 0 ? num_hiddens / num_heads : 0;  // the ring refuses sizes that do not divide
  s.blocks = P / head_groups;
  s.group = s.all.rank() / s.blocks;
  s.block = s.all.rank() % s.blocks;
  s.heads = HeadParallelAttention::heads_of(num_heads, head_groups, s.group);
  Communicator along = s.all.split(s.group, s.block);
  s.across_heads = std::make_unique<Communicator>(s.all.split(s.block, s.group));
  // The ring's own checks (sizes, state dict) fail on every rank of its
  // group; agree over all ranks makes that everyone's.
  s.ring = agree(s.all, op, [&] {
    return std::unique_ptr<RingAttention>(new RingAttention(std::move(along), num_hiddens, num_heads, state,
                                                            s.heads.front(), static_cast<int64_t>(s.heads.size()),
                                                            s.group == 0));
  });
}

GridAttention::~GridAttention() = default;
GridAttention::GridAttention(GridAttention&&) noexcept = default;
GridAttention& GridAttention::operator=(GridAttention&&) noexcept = default;

int GridAttention::head_group() const { return s_->group; }
int GridAttention::sequence_block() const { return s_->block; }
int GridAttention::head_groups() const { return s_->groups; }
int GridAttention::sequence_blocks() const { return s_->blocks; }
const std::vector<int64_t>& GridAttention::heads() const { return s_->heads; }
std::pair<int64_t, int64_t> GridAttention::query_block(int64_t length) const {
  return RingAttention::block_of(length, s_->blocks, s_->block);
}
std::pair<int64_t, int64_t> GridAttention::key_block(int64_t length) const {
  return RingAttention::block_of(length, s_->blocks, s_->block);
}

Tensor GridAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                              const ValidLens& valid_lens, Causal causal, FullyMaskedRows fully_masked) {
  return forward(queries, keys, values, valid_lens, causal_call_masks(causal, fully_masked));
}

Tensor GridAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                              const ValidLens& valid_lens, const CallMasks& masks) {
  return forward(queries, keys, values, valid_lens, masks, {});
}

Tensor GridAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                              const ValidLens& valid_lens, const CallMasks& masks, const std::vector<float>& sinks,
                              const std::vector<int64_t>& doc_offsets) {
  State& s = *s_;
  // Each ring fails or succeeds as a whole; agree tells the other rings.
  Tensor out = agree(s.all, "dist.GridAttention.forward",
                     [&] { return s.ring->forward(queries, keys, values, valid_lens, masks, sinks, doc_offsets); });
  s.across_heads->all_reduce_sum(out);
  return out;
}

MultiHeadAttention::InputGrads GridAttention::backward(const Tensor& grad_output) {
  State& s = *s_;
  MultiHeadAttention::InputGrads g =
      agree(s.all, "dist.GridAttention.backward", [&] { return s.ring->backward(grad_output); });
  s.across_heads->all_reduce_sum(g.queries);
  s.across_heads->all_reduce_sum(g.keys);
  s.across_heads->all_reduce_sum(g.values);
  // Each head's sink gradient comes from its group's ring alone (zeros in
  // the other groups' slots: the all-reduce adds exactly nothing to it).
  std::vector<float> sinks = s.ring->last_sinks_grad();
  s.across_heads->all_reduce_sum(sinks.data(), static_cast<int64_t>(sinks.size()));
  if (s.sinks_grad.size() != sinks.size()) s.sinks_grad.assign(sinks.size(), 0.0f);
  for (size_t h = 0; h < sinks.size(); ++h) s.sinks_grad[h] += sinks[h];
  return g;
}

StateDict GridAttention::gather_grads() const {
  const State& s = *s_;
  const StateDict& mine = s.ring->grads();  // this group's heads, the same on every rank of its ring
  // Block 0's rank of each group sends its group's tensors, in name order.
  if (s.all.rank() != 0) {
    if (s.block == 0) {
      int tag = 0;
      for (const auto& [name, t] : mine) s.all.send(t.data(), t.numel(), 0, tag++);
    }
    return {};
  }
  const int64_t N = s.num_hiddens, d = s.head_dim;
  StateDict full;
  // W_o's bias: group 0's (rank 0's).
  for (const auto& [name, t] : mine) full[name] = name == "W_o.bias" ? t : Tensor(shard_shape(name, t, N));
  for (int g = 0; g < s.groups; ++g) {
    const std::vector<int64_t> heads = HeadParallelAttention::heads_of(s.num_heads, s.groups, g);
    const int64_t r0 = heads.front() * d, n = static_cast<int64_t>(heads.size()) * d;
    int tag = 0;
    for (const auto& [name, t] : mine) {
      // Rank 0's (group 0's) tensor; group g's has its own heads' width.
      Tensor part = g == 0 ? t : Tensor(shard_shape(name, t, n));
      if (g != 0) s.all.recv(part.data(), part.numel(), g * s.blocks, tag);
      ++tag;
      place_shard(name, r0, n, part, full[name]);
    }
  }
  return full;
}

void GridAttention::zero_grad() {
  s_->ring->zero_grad();
  std::fill(s_->sinks_grad.begin(), s_->sinks_grad.end(), 0.0f);
}
const std::vector<float>& GridAttention::sinks_grad() const { return s_->sinks_grad; }

void GridAttention::train(bool on) { s_->ring->train(on); }
void GridAttention::set_precision(Precision p) { s_->ring->set_precision(p); }
void GridAttention::set_dropout(float p, uint64_t seed) { s_->ring->set_dropout(p, seed); }
void GridAttention::keep_attention_weights(bool on) { s_->ring->keep_attention_weights(on); }
const Tensor& GridAttention::attention_weights() const { return s_->ring->attention_weights(); }
const RingAttention& GridAttention::ring() const { return *s_->ring; }

}  // namespace mha::dist
