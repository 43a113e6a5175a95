// mha::dist::RingAttention (mha/dist/ring_attention.h): projections on each
// rank's own rows, attention over key/value blocks passed round a ring with
// online softmax, the output projection on each rank's own rows.
#include "mha/dist/ring_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dist/agree.h"
#include "dist/call_masks.h"
#include "dist/ring_projections.h"
#include "dist/ring_checks.h"
#include "dist/shards.h"
#include "mha/detail/published.h"
#include "mha/error.h"
#include "nn/projections.h"
#include "nn/ring_rows.h"

namespace mha::dist {

namespace {

// Message tags: a block's keys and values at ring step s, its gradients.
constexpr int kTagKV = 1000, kTagGrad = 2000000;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct RingAttention::State {
  explicit State(Communicator c) : comm(std::move(c)) {}
  Communicator comm;
  int64_t num_hiddens = 0, num_heads = 0, head_dim = 0;  // num_heads: this ring's heads
  bool bias = false;
  bool output_bias = true;  // W_o's bias is added here (and its gradient kept)
  bool keep_weights = false;
  bool training = true;  // forward keeps what backward needs (its inputs)
  StateDict params, grads;
  // Dropout on the weights in training mode, keyed as MultiHeadAttention's
  // with the same seed: a key per call from the same stream (the compute,
  // nn/ring_rows.h, frames each block in the whole (B, H, Q, K) tensor).
  float dropout_p = 0.0f;
  detail::KeyStream dropout_keys{0};
  int64_t first_head = 0, module_heads = 0;  // this ring's heads among the module's
  // The products' number format (mha/precision.h), and W_q, W_k, W_v, W_o
  // packed once per format for them (the ring's weights never change).
  Precision precision = Precision::Float32;
  Precision call_precision = Precision::Float32;  // the last forward's, which its backward keeps
  std::map<std::pair<std::string, Precision>, std::shared_ptr<const cpu::PackedWeight>> packs;
  const cpu::PackedWeight& packed(const std::string& layer) {
    std::shared_ptr<const cpu::PackedWeight>& w = packs[{layer, call_precision}];
    if (!w || !w->current()) {
      const Tensor& W = p(layer + ".weight");
      w = cpu::pack_weight(W.data(), W.size(0), W.size(1), call_precision);
    }
    return *w;
  }
  RingStats stats;

  // --- The last forward: what the backward needs ---
  bool have_call = false;
  int64_t B = 0, Qr = 0, Kr = 0, K = 0;
  std::vector<int64_t> k_sizes, k_begins;  // every rank's key block
  Tensor xq, xk, xv;                       // this rank's inputs
  std::vector<float> qp;                   // the queries' projections, [rows, H*d] (keys' and
                                           // values' are projected again by the backward)
  std::vector<float> heads;                // normalised attention output, [B*Qr, H*d]
  std::unique_ptr<nn::RingRows> rows;      // the compute, with the merged softmax statistics
  // Buffers kept from call to call: fresh pages cost a fault each (an 8 MiB
  // block took 23 ms to allocate per call on a 2-core VM, ~15% of a
  // forward), reused ones nothing. What a call writes before reading.
  std::vector<float> block, next, dheads, grad_in, sending, local, mine;
  Tensor weights;  // [B,H,Qr,K] when kept
  bool have_sinks = false;  // the last forward's
  // dL/d sinks over the module's heads (zero outside this ring's): the last
  // backward's, summed over the ranks, and the sum over backward calls.
  std::vector<float> call_sinks_grad, sinks_grad;

  const Tensor& p(const std::string& name) const { return params.at(name); }
  Tensor bias_of(const std::string& layer) const {
    const auto it = params.find(layer + ".bias");
    return it == params.end() ? Tensor() : it->second;
  }
  // The block rank o holds, as the compute's one piece of global keys.
  std::vector<nn::Piece> block_of(int o) const {
    return {{k_begins[static_cast<size_t>(o)], k_sizes[static_cast<size_t>(o)]}};
  }
};

std::pair<int64_t, int64_t> RingAttention::block_of(int64_t length, int size, int rank) {
  if (size <= 0 || rank < 0 || rank >= size || length < 0) return {0, 0};
  const int64_t base = length / size, extra = length % size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

RingAttention::RingAttention(Communicator comm, int64_t num_hiddens, int64_t num_heads, const StateDict& state)
    : RingAttention(std::move(comm), num_hiddens, num_heads, state, 0, num_heads, true) {}

RingAttention::RingAttention(Communicator comm, int64_t num_hiddens, int64_t num_heads, const StateDict& state,
                             int64_t first_head, int64_t head_count, bool output_bias)
    : s_(std::make_unique<State>(std::move(comm))) {
  static const char* op = "dist.RingAttention";
  State& s = *s_;
  agree(s.comm, op, [&] {
    // The chapter's module checks the sizes and the state dict.
    const bool bias = state.count("W_q.bias") > 0;
    MultiHeadAttention m(num_hiddens, num_heads, 0.0f, bias);
    m.load_state_dict(state);
    s.num_hiddens = num_hiddens;
    s.num_heads = head_count;
    s.first_head = first_head;
    s.module_heads = num_heads;
    s.head_dim = m.head_dim();
    s.bias = bias;
    s.output_bias = output_bias;
    s.params = head_count == num_heads && output_bias ? m.state_dict()
                                                       : slice_heads(m.state_dict(), first_head, head_count,
                                                                     s.head_dim, output_bias);
    for (const auto& [name, t] : s.params) s.grads[name] = Tensor(t.shape());
    return 0;
  });
}

RingAttention::~RingAttention() = default;
RingAttention::RingAttention(RingAttention&&) noexcept = default;
RingAttention& RingAttention::operator=(RingAttention&&) noexcept = default;

Tensor RingAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                              const ValidLens& valid_lens, Causal causal, FullyMaskedRows fully_masked) {
  return forward(queries, keys, values, valid_lens, causal_call_masks(causal, fully_masked));
}

Tensor RingAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                              const ValidLens& valid_lens, const CallMasks& masks) {
  return forward(queries, keys, values, valid_lens, masks, {});
}

Tensor RingAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                              const ValidLens& valid_lens, const CallMasks& masks,
                              const std::vector<float>& given_sinks, const std::vector<int64_t>& doc_offsets) {
  static const char* op = "dist.RingAttention.forward";
  // The sinks come as the modules take them (masks.scores.sinks) or as the
  // argument; one place, not both.
  const std::vector<float>& sinks = given_sinks.empty() ? masks.scores.sinks : given_sinks;
  const Causal causal = masks.causal;
  const FullyMaskedRows fully_masked = masks.fully_masked_rows;
  State& s = *s_;
  const Communicator& c = s.comm;
  const int P = c.size(), r = c.rank();
  const int64_t H = s.num_heads, d = s.head_dim, Hd = H * d;
  s.have_call = false;
  s.stats = RingStats();
  s.weights = Tensor();
  const RingLayout layout = check_ring_forward(
      c, op, {&s.params, s.module_heads, H, d, s.num_hiddens, s.training, s.keep_weights},
      {&queries, &keys, &values, &valid_lens, &masks, &given_sinks, &doc_offsets}, &s.stats.planned_bytes);
  const std::vector<int64_t>& q_sizes = layout.q_sizes;
  s.k_sizes = layout.k_sizes;
  const int64_t B = queries.size(0), Qr = queries.size(1), Kr = keys.size(1), K = layout.K;
  s.B = B, s.Qr = Qr, s.Kr = Kr, s.K = K;
  nn::RingRowsSpec spec;
  spec.B = B, spec.H = H, spec.d = d, spec.K = K;
  s.k_begins.assign(static_cast<size_t>(P), 0);
  int64_t q_begin = 0, k0 = 0;
  for (int o = 0; o < P; ++o) {
    const size_t at = static_cast<size_t>(o);
    if (o < r) q_begin += q_sizes[at];
    spec.Q += q_sizes[at];
    s.k_begins[at] = k0;
    k0 += s.k_sizes[at];
  }
  spec.q_pieces = {{q_begin, Qr}};
  spec.lens = valid_lens;
  // Without causal masking, a window or documents the chapter's
  // masked_softmax (-1e6); with them, the drop-in's -inf and fully-masked
  // policy (mha/dist/ring_attention.h).
  spec.masks = masks;
  spec.masks.scores.sinks = sinks;
  const bool masked_call = causal != Causal::None || masks.window.any() || !doc_offsets.empty();
  spec.fill = masked_call ? kernels::MaskFill::NegInf : kernels::MaskFill::Seed;
  spec.masks.fully_masked_rows = masked_call ? fully_masked : FullyMaskedRows::Uniform;
  spec.doc_offsets = doc_offsets;
  s.call_precision = spec.precision = s.precision;  // q, k, v hold bfloat16 values in that mode
  if (s.training && s.dropout_p > 0.0f) spec.dropout = {s.dropout_p, s.dropout_keys.next()};
  spec.first_head = s.first_head, spec.all_heads = s.module_heads;
  spec.scale_divisor = std::sqrt(static_cast<float>(d));
  if (s.keep_weights) s.weights = Tensor({B, H, Qr, K}), spec.weights = s.weights.data();
  // MPI's progress between the kernel calls, so that the next block's
  // transfer (a rendezvous, which moves only inside MPI calls) overlaps
  // this block's compute.
  spec.progress = [&c] { c.progress(); };
  s.have_sinks = !sinks.empty();
  s.rows = std::make_unique<nn::RingRows>(std::move(spec));
  // The inputs, for the backward's projections (training mode only).
  s.xq = s.training ? queries : Tensor();
  s.xk = s.training ? keys : Tensor();
  s.xv = s.training ? values : Tensor();

  // This rank's projections; the key/value block that starts round the ring.
  s.qp.resize(static_cast<size_t>(B * Qr * Hd));
  project(queries.data(), B * Qr, s.packed("W_q"), s.bias_of("W_q"), s.qp.data());
  std::vector<float>&block = s.block, &next = s.next;
  block.resize(static_cast<size_t>(2 * B * Kr * Hd));
  project(keys.data(), B * Kr, s.packed("W_k"), s.bias_of("W_k"), block.data());
  project(values.data(), B * Kr, s.packed("W_v"), s.bias_of("W_v"), block.data() + B * Kr * Hd);

  // Each block runs the fused kernel (nn/ring_rows.h), and the blocks merge
  // into one softmax over every key in the ring's fixed order.
  s.rows->begin_forward(s.qp.data());
  const int prev = (r + P - 1) % P, nxt = (r + 1) % P;
  for (int step = 0; step < P; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    const int o = (r - step + P) % P;  // whose block this is
    const int64_t Ko = s.k_sizes[static_cast<size_t>(o)];
    Request in, out_req;
    if (step + 1 < P) {  // the next block arrives while this one is computed on
      const int64_t Kn = s.k_sizes[static_cast<size_t>((r - step - 1 + P) % P)];
      next.resize(static_cast<size_t>(2 * B * Kn * Hd));
      in = c.irecv(next.data(), static_cast<int64_t>(next.size()), prev, kTagKV + step);
      out_req = c.isend(block.data(), static_cast<int64_t>(block.size()), nxt, kTagKV + step);
    }
    const auto compute_start = std::chrono::steady_clock::now();
    s.rows->add_block(block.data(), block.data() + B * Ko * Hd, s.block_of(o));
    s.stats.compute_seconds += seconds_since(compute_start);
    if (step + 1 < P) {
      in.wait();
      out_req.wait();
      block.swap(next);
    }
    s.stats.step_seconds += seconds_since(step_start);
  }
  s.heads.resize(static_cast<size_t>(B * Qr * Hd));
  s.rows->finish(s.heads.data());
  s.stats.tiles = s.rows->tiles().tiles, s.stats.tiles_skipped = s.rows->tiles().skipped;
  Tensor result({B, Qr, s.num_hiddens});
  project(s.heads.data(), B * Qr, s.packed("W_o"), s.bias_of("W_o"), result.data(), /*round_output=*/false);
  s.have_call = s.training;
  if (!s.training) s.rows.reset();
  return result;
}

MultiHeadAttention::InputGrads RingAttention::backward(const Tensor& grad_output) {
  static const char* op = "dist.RingAttention.backward";
  State& s = *s_;
  const Communicator& c = s.comm;
  const int P = c.size(), r = c.rank();
  agree(c, op, [&] {
    if (!s.have_call)
      fail(op, "no forward call in training mode to differentiate: call forward() (in training mode, the default) "
               "before backward()");
    const Shape want{s.B, s.Qr, s.num_hiddens};
    if (grad_output.shape() != want)
      fail(op, "grad_output: shape ", shape_str(grad_output.shape()), " is not the output's ", shape_str(want));
    return 0;
  });
  const int64_t B = s.B, Qr = s.Qr, Kr = s.Kr, H = s.num_heads, d = s.head_dim, Hd = H * d;
  StateDict g;  // this rank's share of the weight gradients
  for (const auto& [name, t] : s.params) g[name] = Tensor(t.shape());
  // W_o's bias gets a gradient only where it is added (GridAttention's first head group).
  auto bias_grad = [&](const std::string& layer) {
    return s.bias && (layer != "W_o" || s.output_bias) ? &g.at(layer + ".bias") : nullptr;
  };

  // Output projection, then the gradient of the heads' concatenation.
  std::vector<float>& dheads = s.dheads;
  dheads.resize(static_cast<size_t>(B * Qr * Hd));
  project_backward(grad_output.data(), s.heads.data(), B * Qr, s.p("W_o.weight"), g.at("W_o.weight"),
                   bias_grad("W_o"), dheads.data(), s.call_precision);
  // Blocks travel as in the forward; their gradients dK, dV follow, each
  // rank adding its part, and reach their owner after the last step. Each
  // block runs the fused backward from the statistics over every key and
  // the whole output (nn/ring_rows.h).
  nn::RingRows& rows = *s.rows;
  rows.set_queries(s.qp.data());
  rows.begin_backward(s.heads.data(), dheads.data());
  std::vector<float>&block = s.block, &next = s.next, &grad_in = s.grad_in, &sending = s.sending, &mine = s.mine;
  block.resize(static_cast<size_t>(2 * B * Kr * Hd));
  // The previous step's gradients on their way to rank r + 1. Waited for
  // only after this step's receives are posted: waiting at the end of a step
  // would have every rank wait for its successor to start the next step,
  // round the whole ring (a deadlock once messages are too large to be sent
  // eagerly).
  Request g_out;
  // This rank's keys and values projected again (not kept by the forward:
  // two fewer [B, K_r, H*d] buffers per rank between the calls).
  project(s.xk.data(), B * Kr, s.packed("W_k"), s.bias_of("W_k"), block.data());
  project(s.xv.data(), B * Kr, s.packed("W_v"), s.bias_of("W_v"), block.data() + B * Kr * Hd);
  const int prev = (r + P - 1) % P, nxt = (r + 1) % P;
  for (int step = 0; step < P; ++step) {
    const int o = (r - step + P) % P;
    const int64_t Ko = s.k_sizes[static_cast<size_t>(o)];
    Request kv_in, kv_out, g_in;
    if (step + 1 < P) {
      const int64_t Kn = s.k_sizes[static_cast<size_t>((r - step - 1 + P) % P)];
      next.resize(static_cast<size_t>(2 * B * Kn * Hd));
      kv_in = c.irecv(next.data(), static_cast<int64_t>(next.size()), prev, kTagKV + step);
      kv_out = c.isend(block.data(), static_cast<int64_t>(block.size()), nxt, kTagKV + step);
    }
    // This block's gradients so far, from the ranks that had it before.
    grad_in.assign(static_cast<size_t>(2 * B * Ko * Hd), 0.0f);
    if (step > 0) g_in = c.irecv(grad_in.data(), static_cast<int64_t>(grad_in.size()), prev, kTagGrad + step);
    g_out.wait();  // `sending` is free again
    std::vector<float>& local = s.local;  // dK | dV of this rank's queries
    local.resize(static_cast<size_t>(2 * B * Ko * Hd));
    rows.backward_block(block.data(), block.data() + B * Ko * Hd, s.block_of(o), local.data(),
                        local.data() + B * Ko * Hd);
    if (step > 0) g_in.wait();
    for (size_t e = 0; e < local.size(); ++e) local[e] += grad_in[e];
    // Pass the block's gradients on; after the last step they go home (to
    // rank r + 1, whose block this is).
    sending.swap(local);
    if (P > 1) g_out = c.isend(sending.data(), static_cast<int64_t>(sending.size()), nxt, kTagGrad + step + 1);
    if (step + 1 < P) {
      kv_in.wait();
      kv_out.wait();
      block.swap(next);
    }
    if (P == 1) mine = sending;
    if (P > 1 && step + 1 == P) {  // this rank's own block comes back from rank r - 1
      mine.assign(static_cast<size_t>(2 * B * Kr * Hd), 0.0f);
      c.recv(mine.data(), static_cast<int64_t>(mine.size()), prev, kTagGrad + P);
    }
  }
  g_out.wait();

  // The sinks' gradient: each rank's rows in a fixed order
  // (RingRows::sinks_grad_share), then every rank's share in its own slot of
  // one all-reduce (slots of zeros elsewhere: exact in any order), added in
  // rank order: the same bits on every rank and every run.
  s.call_sinks_grad.assign(static_cast<size_t>(s.module_heads), 0.0f);
  if (s.have_sinks) {
    const size_t M = static_cast<size_t>(s.module_heads);
    std::vector<float> shares(static_cast<size_t>(P) * M, 0.0f);
    const std::vector<double> share = rows.sinks_grad_share();
    for (int64_t h = 0; h < H; ++h)
      shares[static_cast<size_t>(r) * M + static_cast<size_t>(s.first_head + h)] = static_cast<float>(share[static_cast<size_t>(h)]);
    c.all_reduce_sum(shares.data(), static_cast<int64_t>(shares.size()));
    for (size_t h = 0; h < M; ++h) {
      double sum = 0.0;
      for (int o = 0; o < P; ++o) sum += shares[static_cast<size_t>(o) * M + h];
      s.call_sinks_grad[h] = static_cast<float>(sum);
    }
  }
  if (s.sinks_grad.size() != s.call_sinks_grad.size()) s.sinks_grad.assign(s.call_sinks_grad.size(), 0.0f);
  for (size_t h = 0; h < s.sinks_grad.size(); ++h) s.sinks_grad[h] += s.call_sinks_grad[h];

  // The projections' backward on this rank's rows.
  MultiHeadAttention::InputGrads grads{Tensor(s.xq.shape()), Tensor(s.xk.shape()), Tensor(s.xv.shape())};
  project_backward(rows.grad_q().data(), s.xq.data(), B * Qr, s.p("W_q.weight"), g.at("W_q.weight"),
                   bias_grad("W_q"), grads.queries.data(), s.call_precision);
  project_backward(mine.data(), s.xk.data(), B * Kr, s.p("W_k.weight"), g.at("W_k.weight"),
                   bias_grad("W_k"), grads.keys.data(), s.call_precision);
  project_backward(mine.data() + B * Kr * Hd, s.xv.data(), B * Kr, s.p("W_v.weight"),
                   g.at("W_v.weight"), bias_grad("W_v"), grads.values.data(), s.call_precision);
  // The weights' gradients: every rank's rows, summed in one all-reduce.
  std::vector<float> flat;
  for (const auto& [name, t] : g) flat.insert(flat.end(), t.values().begin(), t.values().end());
  c.all_reduce_sum(flat.data(), static_cast<int64_t>(flat.size()));
  size_t at = 0;
  for (auto& [name, t] : s.grads) {
    for (float& x : t.values()) x += flat[at++];
  }
  return grads;
}

void RingAttention::keep_attention_weights(bool on) { s_->keep_weights = on; }
void RingAttention::set_precision(Precision p) { s_->precision = p; }
void RingAttention::set_dropout(float p, uint64_t seed) {
  if (!(p >= 0.0f && p <= 1.0f)) fail("dist.RingAttention.set_dropout", "p: ", p, "; wanted a probability in [0, 1]");
  s_->dropout_p = p;
  s_->dropout_keys.seed(seed);
}
float RingAttention::dropout() const { return s_->dropout_p; }
Precision RingAttention::precision() const { return s_->precision; }
void RingAttention::train(bool on) { s_->training = on; }
const Tensor& RingAttention::attention_weights() const { return s_->weights; }
const RingStats& RingAttention::stats() const { return s_->stats; }
const StateDict& RingAttention::state_dict() const { return s_->params; }
const StateDict& RingAttention::grads() const { return s_->grads; }
void RingAttention::zero_grad() {
  for (auto& [name, t] : s_->grads) std::fill(t.values().begin(), t.values().end(), 0.0f);
  std::fill(s_->sinks_grad.begin(), s_->sinks_grad.end(), 0.0f);
}
const std::vector<float>& RingAttention::sinks_grad() const { return s_->sinks_grad; }
const std::vector<float>& RingAttention::last_sinks_grad() const { return s_->call_sinks_grad; }
const Communicator& RingAttention::communicator() const { return s_->comm; }

}  // namespace mha::dist
