// mha::dist::HeadParallelAttention (mha/dist/head_parallel.h): each rank's
// heads as a pruned MultiHeadAttention, summed by all-reduces.
#include "mha/dist/head_parallel.h"

#include <algorithm>
#include <string>
#include <utility>

#include "dist/agree.h"
#include "dist/shards.h"
#include "mha/error.h"

namespace mha::dist {

namespace {

// State-dict names in the order shards travel to rank 0 (tags are indices).
const char* const kNames[] = {"W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias",
                              "W_v.weight", "W_v.bias", "W_o.weight", "W_o.bias"};

}  // namespace

struct HeadParallelAttention::State {
  explicit State(Communicator c) : comm(std::move(c)) {}
  Communicator comm;
  int64_t num_hiddens = 0, num_heads = 0, head_dim = 0;
  bool bias = false;
  std::vector<int64_t> heads;
  std::unique_ptr<MultiHeadAttention> shard;  // null: this rank owns no head
  // The last forward's input shapes: a rank without heads answers backward
  // with zeros of these shapes.
  Shape q_shape, k_shape, v_shape;

  // The full tensors of `local` (a shard's state_dict or grads) on rank 0.
  StateDict gather(const StateDict& local) const {
    StateDict full;
    if (comm.rank() != 0) {
      if (!shard) return full;
      for (size_t i = 0; i < std::size(kNames); ++i) {
        const auto it = local.find(kNames[i]);
        if (it == local.end() || std::string(kNames[i]) == "W_o.bias") continue;
        comm.send(it->second.data(), it->second.numel(), 0, static_cast<int>(i));
      }
      return full;
    }
    // Rank 0 always owns a head (heads_of gives the first ranks the extras).
    for (const auto& [name, t] : local) full[name] = name == "W_o.bias" ? t : Tensor(shard_shape(name, t, num_hiddens));
    for (int r = 0; r < comm.size(); ++r) {
      const std::vector<int64_t> h = heads_of(num_heads, comm.size(), r);
      if (h.empty()) continue;
      const int64_t first = h.front() * head_dim, width = static_cast<int64_t>(h.size()) * head_dim;
      for (size_t i = 0; i < std::size(kNames); ++i) {
        const auto it = local.find(kNames[i]);
        if (it == local.end() || std::string(kNames[i]) == "W_o.bias") continue;
        // Rank 0's tensor; rank r's has its own heads' width.
        Tensor part = r == 0 ? it->second : Tensor(shard_shape(it->first, it->second, width));
        if (r != 0) comm.recv(part.data(), part.numel(), r, static_cast<int>(i));
        place_shard(it->first, first, width, part, full[it->first]);
      }
    }
    return full;
  }
};

std::vector<int64_t> HeadParallelAttention::heads_of(int64_t num_heads, int size, int rank) {
  if (size <= 0 || rank < 0 || rank >= size) return {};
  const int64_t base = num_heads / size, extra = num_heads % size;
  const int64_t count = base + (rank < extra ? 1 : 0);
  const int64_t first = rank * base + std::min<int64_t>(rank, extra);
  std::vector<int64_t> heads(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) heads[static_cast<size_t>(i)] = first + i;
  return heads;
}

HeadParallelAttention::HeadParallelAttention(Communicator comm, int64_t num_hiddens, int64_t num_heads,
                                             const StateDict& state, float dropout, uint64_t seed)
    : s_(std::make_unique<State>(std::move(comm))) {
  static const char* op = "dist.HeadParallelAttention";
  s_->num_hiddens = num_hiddens;
  s_->num_heads = num_heads;
  s_->bias = state.count("W_q.bias") > 0;
  const Communicator& c = s_->comm;
  agree(c, op, [&] {
    // The full module checks the sizes and the state dict, on every rank
    // (a rank without heads too), then loses the other ranks' heads. Each
    // shard's dropout has its own generator.
    auto m = std::make_unique<MultiHeadAttention>(num_hiddens, num_heads, dropout, s_->bias,
                                                  seed + static_cast<uint64_t>(c.rank()));
    StateDict mine = state;
    // The output bias is added once, by rank 0: the all-reduce sums the ranks' parts.
    if (s_->bias && c.rank() != 0 && mine.count("W_o.bias")) mine["W_o.bias"] = Tensor(mine["W_o.bias"].shape());
    m->load_state_dict(mine);
    s_->head_dim = m->head_dim();
    s_->heads = heads_of(num_heads, c.size(), c.rank());
    if (!s_->heads.empty()) {
      std::vector<int64_t> others;
      for (int64_t h = 0; h < num_heads; ++h)
        if (!std::binary_search(s_->heads.begin(), s_->heads.end(), h)) others.push_back(h);
      if (!others.empty()) m->prune_heads(others);
      s_->shard = std::move(m);
    }
    return 0;
  });
}

HeadParallelAttention::~HeadParallelAttention() = default;
HeadParallelAttention::HeadParallelAttention(HeadParallelAttention&&) noexcept = default;
HeadParallelAttention& HeadParallelAttention::operator=(HeadParallelAttention&&) noexcept = default;

Tensor HeadParallelAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                      const ValidLens& valid_lens, const CallMasks& masks) {
  static const char* op = "dist.HeadParallelAttention.forward";
  State& s = *s_;
  Tensor out = agree(s.comm, op, [&] {
    if (masks.attn_mask.dim() == 3)
      fail(op, "attn_mask: shape ", shape_str(masks.attn_mask.shape()),
           " holds a mask per head; a head-parallel call takes (Q, K) masks, the same for every head");
    if (s.shard) return s.shard->forward(queries, keys, values, valid_lens, masks);
    // No heads here: this rank adds nothing to the sum (the others check the
    // arguments; agree() makes their errors everyone's).
    if (queries.dim() != 3) return Tensor();
    return Tensor({queries.size(0), queries.size(1), s.num_hiddens});
  });
  s.q_shape = queries.shape();
  s.k_shape = keys.shape();
  s.v_shape = values.shape();
  s.comm.all_reduce_sum(out);
  return out;
}

MultiHeadAttention::InputGrads HeadParallelAttention::backward(const Tensor& grad_output) {
  static const char* op = "dist.HeadParallelAttention.backward";
  State& s = *s_;
  MultiHeadAttention::InputGrads g = agree(s.comm, op, [&] {
    if (s.shard) return s.shard->backward(grad_output);
    return MultiHeadAttention::InputGrads{Tensor(s.q_shape), Tensor(s.k_shape), Tensor(s.v_shape)};
  });
  if (s.shard && s.bias && s.comm.rank() != 0) s.shard->set_grads({{"W_o.bias", Tensor({s.num_hiddens})}});
  // Each rank's projections of the whole inputs contribute to their gradients.
  s.comm.all_reduce_sum(g.queries);
  s.comm.all_reduce_sum(g.keys);
  s.comm.all_reduce_sum(g.values);
  return g;
}

StateDict HeadParallelAttention::gather_state_dict() const {
  return s_->gather(s_->shard ? s_->shard->state_dict() : StateDict{});
}

StateDict HeadParallelAttention::gather_grads() {
  return s_->gather(s_->shard ? s_->shard->grads() : StateDict{});
}

void HeadParallelAttention::zero_grad() {
  if (s_->shard) s_->shard->zero_grad();
}

void HeadParallelAttention::set_precision(Precision p) {
  if (s_->shard) s_->shard->set_precision(p);
}

void HeadParallelAttention::train(bool on) {
  if (s_->shard) s_->shard->train(on);
}

const std::vector<int64_t>& HeadParallelAttention::heads() const { return s_->heads; }
MultiHeadAttention* HeadParallelAttention::shard() { return s_->shard.get(); }
const Communicator& HeadParallelAttention::communicator() const { return s_->comm; }
int64_t HeadParallelAttention::num_hiddens() const { return s_->num_hiddens; }
int64_t HeadParallelAttention::num_heads() const { return s_->num_heads; }

}  // namespace mha::dist
