// mha::dist::RingAttention (mha/dist/ring_attention.h): projections on each
// rank's own rows, attention over key/value blocks passed round a ring with
// online softmax, the output projection on each rank's own rows.
#include "mha/dist/ring_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/memory.h"
#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"
#include "dist/agree.h"
#include "dist/call_masks.h"
#include "kernels/dispatch.h"
#include "kernels/softmax_merge.h"
#include "mha/detail/published.h"
#include "mha/error.h"
#include "nn/call_masks.h"
#include "nn/layer_ref.h"
#include "nn/linear_backward.h"
#include "nn/projections.h"

namespace mha::dist {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// log2(e) in float, as the fused kernel scales natural logits (cpu/fused/limits.h).
constexpr float kLog2e = 1.4426950408889634f;
// Message tags: a block's keys and values at ring step s, its gradients.
constexpr int kTagKV = 1000, kTagGrad = 2000000;

// y:[rows, out] = x:[rows, in] W^T + b, W packed once (cpu/gemm/packed_weight.h),
// the bias added in the product's epilogue.
// In bfloat16 (mha/precision.h) the product rounds x and W to bfloat16 and
// sums in float32, and `round_output` rounds y too (the projected q, k, v).
void project(const float* x, int64_t rows, const cpu::PackedWeight& W, const Tensor& b, float* y,
             bool round_output = true) {
  if (rows == 0) return;
  cpu::GemmBatch batch(W.precision);
  batch.add_packed(rows, x, W.K, W, b.empty() ? nullptr : b.data(), y, W.N);
  batch.run();
  if (W.precision == Precision::BFloat16 && round_output)
    for (int64_t e = 0; e < rows * W.N; ++e) y[e] = core::round_to_bf16(y[e]);
}

// The gradients of y = x W^T + b from dy:[rows, out] (nn/linear_backward.h):
// dW += dy^T x, db += column sums of dy, dx = dy W (dx null: not wanted).
void project_backward(const float* dy, const float* x, int64_t rows, const Tensor& W, Tensor& dW, Tensor* db,
                      float* dx, Precision precision) {
  if (rows == 0) return;
  const nn::LayerRef layer(W.data(), nullptr, W.size(0), W.size(1));
  nn::linear_backward(layer, x, dy, rows, dx, dW, db, precision);
}

// v narrowed to batch row b and heads [h0, h0 + nh).
TensorView narrow(TensorView v, int64_t b, int64_t h0, int64_t nh) {
  v.data += b * v.stride[0] + h0 * v.stride[1];
  v.shape[0] = 1;
  v.shape[1] = nh;
  return v;
}

// The block's kernel calls: one per (batch row, head), with MPI's progress
// between them, so that the next block's transfer (a rendezvous, which
// moves only inside MPI calls) overlaps this block's compute.
template <class Each>
void per_row_and_head(const Communicator& c, int64_t B, int64_t H, const Each& each) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      each(b, h);
      c.progress();
    }
}

// A view of rows [B * L, H*d] (row stride H*d) as (B, H, L, d): the
// engine's batch-major row layout (nn/projections.h).
TensorView heads_view(const float* data, int64_t B, int64_t H, int64_t L, int64_t d) {
  return nn::RowLayout{false, B}.heads(const_cast<float*>(data), L, H, d, H * d);
}

// Query rows per tile: a tile's scores are [tile, K_o] floats, so this
// bounds the scores a rank holds at once (16 MiB at K_o = 16384) whatever
// its share of the sequence.
constexpr int64_t kTile = 256;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The state dict of heads [first, first + count) of a module whose heads are
// d wide: their rows of W_q, W_k, W_v (and biases), their columns of W_o;
// W_o's bias kept when `output_bias`, else zero.
StateDict slice_heads(const StateDict& full, int64_t first, int64_t count, int64_t d, bool output_bias) {
  StateDict part;
  const int64_t r0 = first * d, n = count * d;
  for (const auto& [name, t] : full) {
    if (name == "W_o.weight") {
      const int64_t rows = t.size(0), cols = t.size(1);
      Tensor w({rows, n});
      for (int64_t o = 0; o < rows; ++o) std::copy(t.data() + o * cols + r0, t.data() + o * cols + r0 + n, w.data() + o * n);
      part[name] = w;
    } else if (name == "W_o.bias") {
      part[name] = output_bias ? t : Tensor(t.shape());
    } else {  // a weight (rows x in) or a bias (rows)
      const int64_t width = t.dim() == 2 ? t.size(1) : 1;
      Shape shape = t.shape();
      shape[0] = n;
      Tensor w(shape);
      std::copy(t.data() + r0 * width, t.data() + (r0 + n) * width, w.data());
      part[name] = w;
    }
  }
  return part;
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
  // The products' number format (mha/precision.h), and W_q, W_k, W_v, W_o
  // packed once per format for them (the ring's weights never change).
  // Dropout on the weights in training mode, keyed as MultiHeadAttention's
  // with the same seed: a key per call from the same stream, and each
  // block's mask indexed in the whole (B, num_heads of the module, Q, K)
  // tensor (kernels::DropoutFrame), so the ring drops what one process does.
  float dropout_p = 0.0f;
  detail::KeyStream dropout_keys{0};
  kernels::Dropout call_dropout;  // the last forward's
  int64_t first_head = 0, module_heads = 0;  // this ring's heads among the module's
  void frame(kernels::Dropout& dr, int64_t b, int64_t h, int64_t k_begin, int64_t Ko) const {
    dr = call_dropout;
    if (!dr.active()) return;
    dr.frame = {1, Qr, Ko, b, first_head + h, q_begin, k_begin, module_heads, Q, K};
  }
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
  int64_t B = 0, Qr = 0, Kr = 0, Q = 0, K = 0, q_begin = 0;
  std::vector<int64_t> k_sizes, k_begins;  // every rank's key block
  Tensor xq, xk, xv;                       // this rank's inputs
  std::vector<float> qp;                   // the queries' projections, [rows, H*d] (keys' and
                                           // values' are projected again by the backward)
  std::vector<float> heads;                // normalised attention output, [B*Qr, H*d]
  // The softmax statistics over every key (kernels/softmax_merge.h), what
  // the fused backward reads block by block: [B,H,Qr] each; a row with no
  // live key has row_max2 -inf and row_sum 1 (kernels/params.h).
  std::vector<float> row_max2, row_sum;
  // Buffers kept from call to call: fresh pages cost a fault each (an 8 MiB
  // block took 23 ms to allocate per call on a 2-core VM, ~15% of a
  // forward), reused ones nothing. What a call writes before reading.
  std::vector<float> block, next, out, block_stats, lens_buf, dheads, d_live, dq, dq_block, grad_in, sending,
      local, mine;
  Tensor weights;                          // [B,H,Qr,K] when kept
  ValidLens lens;
  Causal causal = Causal::None;
  Window window;
  float softcap = 0.0f;               // ScoreOptions::softcap of the call
  std::vector<float> alibi_slopes;    // [num_heads] of this module's heads, or empty
  // Attention sinks of this ring's heads ([num_heads], or empty): joined to
  // each row's denominator once, after its blocks merge (merge_sink), never
  // by a block's kernel, which would count them once per block.
  std::vector<float> sinks;
  // dL/d sinks over the module's heads (zero outside this ring's): the last
  // backward's, summed over the ranks, and the sum over backward calls.
  std::vector<float> call_sinks_grad, sinks_grad;
  // A packed row of documents over global positions ([documents + 1]
  // offsets from 0 to Q = K, or empty): a query sees keys of its own
  // document only. A block that straddles a boundary of a query's document
  // gets a (Q_r, K_o) keep mask (`doc_keep`); blocks wholly inside every
  // query's document need none, and blocks wholly outside are skipped.
  std::vector<int64_t> docs;
  std::vector<uint8_t> doc_keep;
  // [first, end) of the document holding global position x.
  std::pair<int64_t, int64_t> document_of(int64_t x) const {
    const auto it = std::upper_bound(docs.begin(), docs.end(), x);  // the first offset above x
    return {*(it - 1), *it};
  }
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

  // Whether the call has masks beyond the chapter's lengths: then masked
  // scores are -inf and fully masked rows get `fully_masked`.
  bool masked_call() const { return causal != Causal::None || window.any() || !docs.empty(); }

  const Tensor& p(const std::string& name) const { return params.at(name); }
  Tensor bias_of(const std::string& layer) const {
    const auto it = params.find(layer + ".bias");
    return it == params.end() ? Tensor() : it->second;
  }

  // The last key (global position) query i of this rank may see by the causal mask.
  int64_t last_key(int64_t i) const {
    const int64_t qi = q_begin + i;
    return causal == Causal::TopLeft ? qi : causal == Causal::BottomRight ? qi + K - Q : K - 1;
  }
  // The global keys [first, last] query i of batch row b sees by its
  // length, the causal limit and the window (first > last: none).
  std::pair<int64_t, int64_t> live_keys(int64_t b, int64_t i) const {
    const int64_t diag = q_begin + i + K - Q;  // the window's diagonal, bottom right over the whole sequence
    int64_t first = 0, last = std::min(last_key(i), K - 1);
    if (window.left >= 0 && window.left < diag) first = diag - window.left;
    if (window.right >= 0 && window.right < K - diag) last = std::min(last, diag + window.right);
    const float n = lens.at(b, i);  // key j is live iff float(j) < n
    if (n < static_cast<float>(K)) last = std::min(last, static_cast<int64_t>(std::ceil(n)) - 1);
    if (!docs.empty()) {
      const auto [begin, end] = document_of(q_begin + i);
      first = std::max(first, begin);
      last = std::min(last, end - 1);
    }
    return {first, last};
  }
  // Whether the tile of rows [i0, i0 + n) of batch row b can skip the key
  // block [k_begin, k_begin + Ko): every row has a live key somewhere and
  // none in this block.
  bool skippable(int64_t b, int64_t i0, int64_t n, int64_t k_begin, int64_t Ko) const {
    for (int64_t i = i0; i < i0 + n; ++i) {
      const auto [first, last] = live_keys(b, i);
      if (first > last || (last >= k_begin && first < k_begin + Ko)) return false;
    }
    return true;
  }
  // Whether every query tile of every batch row can skip the block.
  bool block_skippable(int64_t k_begin, int64_t Ko) const {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i0 = 0; i0 < Qr; i0 += kTile)
        if (!skippable(b, i0, std::min(kTile, Qr - i0), k_begin, Ko)) return false;
    return true;
  }

  // The fused kernel's view of this rank's queries against a key block:
  // kb, vb:[B, Ko, H*d] from global key k_begin. Lengths and the causal
  // limit over global positions become per-query lengths over the block's
  // keys (L - k_begin is exact in float for L >= k_begin, and any L below
  // masks the whole block either way); `lens_buf` holds them.
  kernels::AttentionForward block_params(const float* kb, const float* vb, int64_t Ko, int64_t k_begin,
                                         std::vector<float>& lens_buf, std::vector<uint8_t>& keep_buf) const {
    kernels::AttentionForward p;
    p.q = heads_view(qp.data(), B, num_heads, Qr, head_dim);
    p.k = heads_view(kb, B, num_heads, Ko, head_dim);
    p.v = heads_view(vb, B, num_heads, Ko, head_dim);
    p.scale_divisor = std::sqrt(static_cast<float>(head_dim));
    p.precision = call_precision;  // q, k, v hold bfloat16 values in that mode
    if (!lens.is_none() || causal != Causal::None) {
      lens_buf.resize(static_cast<size_t>(B * Qr));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < Qr; ++i) {
          float n = lens.is_none() ? kInf : lens.at(b, i) - static_cast<float>(k_begin);
          if (causal != Causal::None) n = std::min(n, static_cast<float>(last_key(i) - k_begin + 1));
          lens_buf[static_cast<size_t>(b * Qr + i)] = n;
        }
      p.length_kind = kernels::LengthKind::PerQuery;
      p.lens = lens_buf.data();
    }
    // The window over global positions: the block's diagonal moved to where
    // the whole sequence's diagonal falls among its keys.
    p.masks.window_left = window.left, p.masks.window_right = window.right;
    p.masks.diagonal_shift = (q_begin + K - Q) - k_begin - (Ko - Qr);
    // Softcapping and ALiBi (distances over global positions, by the shift);
    // a call per head reads its own slope (alibi_slopes + h).
    p.masks.softcap = softcap;
    p.masks.alibi_slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.data();
    // Without causal masking or a window the chapter's masked_softmax (-1e6);
    // with them, the drop-in's -inf and fully-masked policy
    // (mha/dist/ring_attention.h).
    p.masks.fill = masked_call() ? kernels::MaskFill::NegInf : kernels::MaskFill::Seed;
    p.masks.fully_masked = masked_call() ? fully_masked : FullyMaskedRows::Uniform;
    // Documents: a (Q_r, K_o) mask, the same for every head (B = 1), only
    // where some query's document ends inside the block.
    bool straddles = false;
    for (int64_t i = 0; i < Qr && !docs.empty() && !straddles; ++i) {
      const auto [begin, end] = document_of(q_begin + i);
      straddles = k_begin < begin || k_begin + Ko > end;
    }
    if (straddles) {
      keep_buf.assign(static_cast<size_t>(Qr * Ko), 0);
      for (int64_t i = 0; i < Qr; ++i) {
        const auto [begin, end] = document_of(q_begin + i);
        for (int64_t j = std::max(begin, k_begin); j < std::min(end, k_begin + Ko); ++j)
          keep_buf[static_cast<size_t>(i * Ko + j - k_begin)] = 1;
      }
      p.masks.pair_keep = keep_buf.data();
      p.masks.pair_stride_b = p.masks.pair_stride_h = 0;
    }
    return p;
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
  agree(c, op, [&] {
    const char* names[] = {"queries", "keys", "values"};
    const char* wanted[] = {"(B, Q_r, Dq)", "(B, K_r, Dk)", "(B, K_r, Dv)"};
    const char* layer[] = {"W_q", "W_k", "W_v"};
    const Tensor* in[] = {&queries, &keys, &values};
    for (int i = 0; i < 3; ++i)
      if (in[i]->dim() != 3) fail(op, names[i], ": shape ", shape_str(in[i]->shape()), " is not ", wanted[i]);
    for (int i = 1; i < 3; ++i)
      if (in[i]->size(0) != queries.size(0))
        fail(op, names[i], ": batch size ", in[i]->size(0), " differs from queries' ", queries.size(0), " (",
             names[i], " ", shape_str(in[i]->shape()), ", queries ", shape_str(queries.shape()), ")");
    if (values.size(1) != keys.size(1))
      fail(op, "values: shape ", shape_str(values.shape()), " has ", values.size(1), " positions but keys ",
           shape_str(keys.shape()), " have ", keys.size(1));
    for (int i = 0; i < 3; ++i) {
      const int64_t want = s.p(std::string(layer[i]) + ".weight").size(1);
      if (in[i]->size(2) != want)
        fail(op, names[i], ": width ", in[i]->size(2), " (shape ", shape_str(in[i]->shape()), ") differs from ",
             layer[i], "'s input width ", want, " in the state dict");
    }
    valid_lens.check(op, queries.size(0), queries.size(1));
    if (!masks.key_padding_mask.is_none() || !masks.attn_mask.is_none())
      fail(op, !masks.key_padding_mask.is_none() ? "masks.key_padding_mask" : "masks.attn_mask",
           ": given; the ring takes valid lengths (global key positions), causal and window only");
    nn::check_window(op, masks.window);
    if (!given_sinks.empty() && !masks.scores.sinks.empty())
      fail(op, "sinks: ", given_sinks.size(), " logits given beside masks.scores.sinks (", masks.scores.sinks.size(),
           "); wanted the sinks in one of them");
    nn::AttentionMasks checked;  // the module's checks of softcap and the slopes (one per head of the module)
    nn::add_score_options(op, masks.scores, {true, queries.size(0), queries.size(1), keys.size(1), keys.size(1),
                                             s.module_heads}, checked);
    if (!sinks.empty() && static_cast<int64_t>(sinks.size()) != s.module_heads)
      fail(op, "sinks: ", sinks.size(), " logits for ", s.module_heads, " heads; wanted one per head of the module");
    for (size_t h = 0; h < sinks.size(); ++h)
      if (!std::isfinite(sinks[h])) fail(op, "sinks[", h, "]: ", sinks[h], "; wanted a finite logit per head");
    return 0;
  });
  // Every rank's block sizes, and one batch size for all.
  const std::vector<int64_t> batches = c.all_gather(queries.size(0));
  // The sinks and the documents, which every rank must pass alike: their
  // bytes hashed (FNV-1a), compared with rank 0's.
  uint64_t digest = 14695981039346656037ull;
  auto hash = [&digest](const void* data, size_t bytes) {
    for (size_t x = 0; x < bytes; ++x) digest = (digest ^ static_cast<const unsigned char*>(data)[x]) * 1099511628211ull;
  };
  hash(sinks.data(), sinks.size() * sizeof(float));
  hash(doc_offsets.data(), doc_offsets.size() * sizeof(int64_t));
  const std::vector<int64_t> digests = c.all_gather(static_cast<int64_t>(digest));
  const std::vector<int64_t> q_sizes = c.all_gather(queries.size(1));
  s.k_sizes = c.all_gather(keys.size(1));
  const int64_t B = queries.size(0), Qr = queries.size(1), Kr = keys.size(1);
  int64_t K = 0, Kmax = 0;
  for (int64_t n : s.k_sizes) K += n, Kmax = std::max(Kmax, n);
  agree(c, op, [&] {
    for (int o = 0; o < P; ++o)
      if (batches[static_cast<size_t>(o)] != queries.size(0))
        fail(op, "queries: batch size ", batches[static_cast<size_t>(o)], " on rank ", o, ", ", queries.size(0),
             " on rank ", r, "; every rank holds blocks of the same batch rows");
    if (K == 0) fail(op, "keys: no rank holds a key; a softmax over zero keys is undefined");
    for (int o = 1; o < P; ++o)
      if (digests[static_cast<size_t>(o)] != digests[0])
        fail(op, "sinks, doc_offsets: rank ", o, "'s differ from rank 0's; wanted the same on every rank");
    if (!kernels::runs_fused(AttentionKernel::Fused, Kmax))
      fail(op, "keys: a block of ", Kmax, " keys on one rank; wanted at most 2^24 per rank (the fused kernel's "
           "key axis): spread the sequence over more ranks");
    if (!doc_offsets.empty()) {
      int64_t Q = 0;
      for (int64_t n : q_sizes) Q += n;
      if (queries.size(0) != 1 || Q != K)
        fail(op, "doc_offsets: given for ", queries.size(0), " batch rows of ", Q, " queries and ", K,
             " keys; wanted one packed row of as many queries as keys");
      if (doc_offsets.size() < 2 || doc_offsets.front() != 0 || doc_offsets.back() != K ||
          !std::is_sorted(doc_offsets.begin(), doc_offsets.end()))
        fail(op, "doc_offsets: ", doc_offsets.size(), " offsets from ", doc_offsets.front(), " to ",
             doc_offsets.back(), "; wanted documents + 1 nondecreasing offsets from 0 to the sequence's ", K,
             " positions");
    }
    // What this rank allocates, before it does: a sequence whose share per
    // rank fits the limit runs, however long the whole.
    core::MemoryPlan plan(op);
    if (s.training)
      plan.add("inputs, kept for the backward", {B * (Qr * queries.size(2) + Kr * (keys.size(2) + values.size(2)))});
    plan.add("query projections", {B, Qr, Hd});
    plan.add("key/value blocks (the one computed on, the one arriving)", {2, 2, B, Kmax, Hd});
    plan.add("attention output before W_o", {B, Qr, Hd});
    plan.add("softmax statistics and value sums", {2 * B * H * Qr + B * Hd});
    plan.add("a block's attention output and statistics", {B * Qr * Hd + 2 * B * H * Qr});
    plan.add("per-query lengths over a block", {B * Qr});
    if (!doc_offsets.empty()) plan.add("a block's document mask", {Qr, Kmax}, 1);
    if (s.keep_weights) plan.add("a block's weights and every block's statistics", {B * H * Qr * (Kmax + 2 * P)});
    plan.add("output", {B, Qr, s.num_hiddens});
    if (s.keep_weights) plan.add("attention weights", {B, H, Qr, K});
    plan.check();
    s.stats.planned_bytes = plan.total();
    return 0;
  });
  s.B = B;
  s.Qr = Qr;
  s.Kr = Kr;
  s.K = K;
  s.Q = s.q_begin = 0;
  s.k_begins.assign(static_cast<size_t>(P), 0);
  int64_t k0 = 0;
  for (int o = 0; o < P; ++o) {
    if (o < r) s.q_begin += q_sizes[static_cast<size_t>(o)];
    s.k_begins[static_cast<size_t>(o)] = k0;
    s.Q += q_sizes[static_cast<size_t>(o)];
    k0 += s.k_sizes[static_cast<size_t>(o)];
  }
  s.lens = valid_lens;
  s.call_precision = s.precision;
  s.call_dropout = kernels::Dropout();
  if (s.training && s.dropout_p > 0.0f) {
    s.call_dropout.p = s.dropout_p;
    s.call_dropout.key = s.dropout_keys.next();
  }
  s.causal = causal;
  s.window = masks.window;
  s.softcap = masks.scores.softcap;
  s.alibi_slopes.clear();
  if (!masks.scores.alibi_slopes.empty())  // this module's heads of the whole module's slopes
    s.alibi_slopes.assign(masks.scores.alibi_slopes.begin() + s.first_head,
                          masks.scores.alibi_slopes.begin() + s.first_head + H);
  s.sinks.clear();
  if (!sinks.empty())  // this module's heads of the whole module's sinks
    s.sinks.assign(sinks.begin() + s.first_head, sinks.begin() + s.first_head + H);
  s.docs = doc_offsets;
  s.fully_masked = fully_masked;
  // The inputs, for the backward's projections (training mode only).
  s.xq = s.training ? queries : Tensor();
  s.xk = s.training ? keys : Tensor();
  s.xv = s.training ? values : Tensor();

  // This rank's projections; the key/value block that starts round the ring.
  s.qp.resize(static_cast<size_t>(B * Qr * Hd));
  project(queries.data(), B * Qr, s.packed("W_q"), s.bias_of("W_q"), s.qp.data());
  std::vector<float>& block = s.block;
  block.resize(static_cast<size_t>(2 * B * Kr * Hd));
  project(keys.data(), B * Kr, s.packed("W_k"), s.bias_of("W_k"), block.data());
  project(values.data(), B * Kr, s.packed("W_v"), s.bias_of("W_v"), block.data() + B * Kr * Hd);
  if (s.keep_weights) s.weights = Tensor({B, H, Qr, K});

  // Each block runs the fused kernel (its statistics kept), and the blocks
  // merge into one softmax over every key (kernels/softmax_merge.h), in the
  // ring's fixed order. A row with no live key so far sums its blocks'
  // outputs times their key counts instead (each block gives it the policy's
  // weights over its own keys, dropout included); the first block with a
  // live key replaces that sum (merge_block scales what is there by 0).
  const int64_t rows = B * H * Qr;
  s.row_max2.assign(static_cast<size_t>(rows), -kInf);
  s.row_sum.assign(static_cast<size_t>(rows), 0.0f);
  std::vector<float>& acc = s.heads;
  acc.assign(static_cast<size_t>(B * Qr * Hd), 0.0f);
  std::vector<float>&next = s.next, &out = s.out, &stats = s.block_stats, &lens_buf = s.lens_buf;
  out.resize(static_cast<size_t>(B * Qr * Hd));
  stats.resize(static_cast<size_t>(2 * rows));
  std::vector<float> block_w;  // [B,H,Qr,Ko] when weights are kept
  // Per block, per row: its own (m_b, s_b), to scale its weights at the end.
  std::vector<std::vector<float>> block_stats(s.keep_weights ? static_cast<size_t>(P) : 0);
  const int prev = (r + P - 1) % P, nxt = (r + 1) % P;
  for (int step = 0; step < P; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    const int o = (r - step + P) % P;  // whose block this is
    const int64_t Ko = s.k_sizes[static_cast<size_t>(o)], k_begin = s.k_begins[static_cast<size_t>(o)];
    Request in, out_req;
    if (step + 1 < P) {  // the next block arrives while this one is computed on
      const int64_t Kn = s.k_sizes[static_cast<size_t>((r - step - 1 + P) % P)];
      next.resize(static_cast<size_t>(2 * B * Kn * Hd));
      in = c.irecv(next.data(), static_cast<int64_t>(next.size()), prev, kTagKV + step);
      out_req = c.isend(block.data(), static_cast<int64_t>(block.size()), nxt, kTagKV + step);
    }
    const auto compute_start = std::chrono::steady_clock::now();
    const float* kb = block.data();
    const float* vb = block.data() + B * Ko * Hd;
    bool compute = false;
    for (int64_t b = 0; b < B && Ko > 0; ++b)
      for (int64_t i0 = 0; i0 < Qr; i0 += kTile) {
        ++s.stats.tiles;
        if (s.skippable(b, i0, std::min(kTile, Qr - i0), k_begin, Ko)) ++s.stats.tiles_skipped;  // adds exactly nothing
        else compute = true;
      }
    if (compute) {
      const kernels::AttentionForward all = s.block_params(kb, vb, Ko, k_begin, lens_buf, s.doc_keep);
      const TensorView out_all = heads_view(out.data(), B, H, Qr, d);
      if (s.keep_weights) block_w.assign(static_cast<size_t>(rows * Ko), 0.0f);
      per_row_and_head(c, B, H, [&](int64_t b, int64_t h) {
        kernels::AttentionForward p = all;
        p.q = narrow(all.q, b, h, 1), p.k = narrow(all.k, b, h, 1), p.v = narrow(all.v, b, h, 1);
        p.out = narrow(out_all, b, h, 1);
        if (p.lens) p.lens += b * Qr;
        if (p.masks.alibi_slopes) p.masks.alibi_slopes += h;
        s.frame(p.dropout, b, h, k_begin, Ko);
        const int64_t row = (b * H + h) * Qr;
        p.stats = {stats.data() + row, stats.data() + rows + row};
        if (s.keep_weights) p.weights = block_w.data() + row * Ko;
        (void)kernels::attention_forward(AttentionKernel::Fused, p);  // the fused kernel: Ko <= its limit (checked)
      });
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < Qr; ++i) {
            const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
            const int64_t at = (b * Qr + i) * Hd + h * d;
            if (stats[st] == -kInf && s.row_max2[st] == -kInf) {  // no live key yet: the policy's sum
              for (int64_t x = 0; x < d; ++x) acc[at + x] += static_cast<float>(Ko) * out[at + x];
              continue;
            }
            kernels::merge_block({acc.data() + at, s.row_max2[st], s.row_sum[st]}, out.data() + at, stats[st],
                                 stats[static_cast<size_t>(rows) + st], d);
          }
      if (s.keep_weights) {
        block_stats[static_cast<size_t>(o)] = stats;
        for (int64_t x = 0; x < rows; ++x)
          std::copy(block_w.data() + x * Ko, block_w.data() + (x + 1) * Ko, s.weights.data() + x * K + k_begin);
      }
    }
    s.stats.compute_seconds += seconds_since(compute_start);
    if (step + 1 < P) {
      in.wait();
      out_req.wait();
      block.swap(next);
    }
    s.stats.step_seconds += seconds_since(step_start);
  }
  // Each head's sink joins every row's denominator once, after the blocks
  // (as one process's kernel adds it after its keys). A row with no live key
  // anywhere (M = -inf: each block gave it the policy) then puts all its
  // weight on the sink: merge_sink zeroes its sum of the blocks' outputs.
  if (!s.sinks.empty())
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Qr; ++i) {
          const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
          kernels::merge_sink({acc.data() + (b * Qr + i) * Hd + h * d, s.row_max2[st], s.row_sum[st]},
                              s.sinks[static_cast<size_t>(h)] * kLog2e, d);
        }
  // Normalise; a row with no live key anywhere gets uniform weights over
  // every key (the chapter's -1e6 fill, or the policy) or zeros.
  const bool zeros = s.masked_call() && fully_masked == FullyMaskedRows::Zeros;
  const float uniform = zeros ? 0.0f : 1.0f / static_cast<float>(K);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Qr; ++i) {
        const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
        float* arow = acc.data() + (b * Qr + i) * Hd + h * d;
        const bool live = kernels::finish_row({arow, s.row_max2[st], s.row_sum[st]}, d);
        if (!live) {
          s.row_sum[st] = 1.0f;  // the statistics of a fully masked row
          for (int64_t x = 0; x < d; ++x)
            arow[x] = zeros ? 0.0f : arow[x] / static_cast<float>(K);
        }
        if (s.keep_weights) {
          float* w = s.weights.data() + st * static_cast<size_t>(K);
          if (!live) {
            std::fill(w, w + K, uniform);
            continue;
          }
          for (int o = 0; o < P; ++o) {  // block o's weights were normalised over its own keys
            const std::vector<float>& bs = block_stats[static_cast<size_t>(o)];
            const int64_t Ko = s.k_sizes[static_cast<size_t>(o)], k0 = s.k_begins[static_cast<size_t>(o)];
            const float m_b = bs.empty() ? -kInf : bs[st];
            const float scale = m_b == -kInf ? 0.0f : bs[static_cast<size_t>(rows) + st] *
                                                          std::exp2(m_b - s.row_max2[st]) / s.row_sum[st];
            for (int64_t j = 0; j < Ko; ++j) w[k0 + j] *= scale;
          }
        }
      }
  Tensor result({B, Qr, s.num_hiddens});
  project(acc.data(), B * Qr, s.packed("W_o"), s.bias_of("W_o"), result.data(), /*round_output=*/false);
  s.have_call = s.training;
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
  // Rows with no live key anywhere have constant scores: no gradient to q
  // or k, and each value gets the policy's weight (1/K, dropout's
  // multiplier) times their dO. A block's kernel weighs such a row 1/K_o
  // over its own keys, so it gets their dO scaled by K_o/K (fm_rows).
  std::vector<float>& d_live = s.d_live;
  d_live = dheads;
  std::vector<int64_t> fm_rows;  // (b * Qr + i) * Hd + h * d of each such row
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Qr; ++i)
        if (s.row_max2[static_cast<size_t>((b * H + h) * Qr + i)] == -kInf) fm_rows.push_back((b * Qr + i) * Hd + h * d);

  // Blocks travel as in the forward; their gradients dK, dV follow, each
  // rank adding its part, and reach their owner after the last step. Each
  // block runs the fused backward from the statistics over every key and
  // the whole output.
  std::vector<float>&dq = s.dq, &dq_block = s.dq_block, &lens_buf = s.lens_buf;
  dq.assign(static_cast<size_t>(B * Qr * Hd), 0.0f);
  dq_block.resize(dq.size());
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
    local.assign(static_cast<size_t>(2 * B * Ko * Hd), 0.0f);
    const float* kb = block.data();
    const float* vb = block.data() + B * Ko * Hd;
    float* dk = local.data();
    float* dv = local.data() + B * Ko * Hd;
    const int64_t k_begin = s.k_begins[static_cast<size_t>(o)];
    for (int64_t at : fm_rows)
      for (int64_t x = 0; x < d; ++x)
        d_live[static_cast<size_t>(at + x)] = dheads[static_cast<size_t>(at + x)] * static_cast<float>(Ko) /
                                              static_cast<float>(s.K);
    if (Ko > 0 && !s.block_skippable(k_begin, Ko)) {  // skipped: weights 0 there, adds nothing
      kernels::AttentionBackward all;
      all.fwd = s.block_params(kb, vb, Ko, k_begin, lens_buf, s.doc_keep);
      all.fwd.out = heads_view(s.heads.data(), B, H, Qr, d);
      all.stats_span_more_keys = true;
      all.grad_out = heads_view(d_live.data(), B, H, Qr, d);
      all.grad_q = heads_view(dq_block.data(), B, H, Qr, d);
      all.grad_k = heads_view(dk, B, H, Ko, d);
      all.grad_v = heads_view(dv, B, H, Ko, d);
      std::fill(dq_block.begin(), dq_block.end(), 0.0f);  // the kernel skips rows with no key in the block
      per_row_and_head(c, B, H, [&](int64_t b, int64_t h) {
        kernels::AttentionBackward p = all;
        p.fwd.q = narrow(all.fwd.q, b, h, 1), p.fwd.k = narrow(all.fwd.k, b, h, 1);
        p.fwd.v = narrow(all.fwd.v, b, h, 1), p.fwd.out = narrow(all.fwd.out, b, h, 1);
        if (p.fwd.lens) p.fwd.lens += b * Qr;
        if (p.fwd.masks.alibi_slopes) p.fwd.masks.alibi_slopes += h;
        s.frame(p.fwd.dropout, b, h, k_begin, Ko);
        const int64_t row = (b * H + h) * Qr;
        p.fwd.stats = {s.row_max2.data() + row, s.row_sum.data() + row};
        p.grad_out = narrow(all.grad_out, b, h, 1), p.grad_q = narrow(all.grad_q, b, h, 1);
        p.grad_k = narrow(all.grad_k, b, h, 1), p.grad_v = narrow(all.grad_v, b, h, 1);
        kernels::attention_backward(AttentionKernel::Fused, p);
      });
      for (size_t e = 0; e < dq.size(); ++e) dq[e] += dq_block[e];
    }
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

  // The sinks' gradient: dL/d sink_h = -sum over rows of the sink's weight
  // 2^(t - M) / S (the merged statistics hold it) times D = dO . O. Each
  // rank's rows in a fixed order, then every rank's share in its own slot
  // of one all-reduce (slots of zeros elsewhere: exact in any order), added
  // in rank order: the same bits on every rank and every run.
  s.call_sinks_grad.assign(static_cast<size_t>(s.module_heads), 0.0f);
  if (!s.sinks.empty()) {
    const size_t M = static_cast<size_t>(s.module_heads);
    std::vector<float> shares(static_cast<size_t>(P) * M, 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      const float t = s.sinks[static_cast<size_t>(h)] * kLog2e;
      double part = 0.0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < Qr; ++i) {
          const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
          const int64_t at = (b * Qr + i) * Hd + h * d;
          double D = 0.0;
          for (int64_t x = 0; x < d; ++x)
            D += static_cast<double>(dheads[static_cast<size_t>(at + x)]) * s.heads[static_cast<size_t>(at + x)];
          part -= static_cast<double>(std::exp2(t - s.row_max2[st]) / s.row_sum[st]) * D;
        }
      shares[static_cast<size_t>(r) * M + static_cast<size_t>(s.first_head + h)] = static_cast<float>(part);
    }
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
  project_backward(dq.data(), s.xq.data(), B * Qr, s.p("W_q.weight"), g.at("W_q.weight"),
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
