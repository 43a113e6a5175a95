// mha::dist::RingAttention (mha/dist/ring_attention.h): projections on each
// rank's own rows, attention over key/value blocks passed round a ring with
// online softmax, the output projection on each rank's own rows.
#include "mha/dist/ring_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.h"
#include "cpu/blas.h"
#include "dist/agree.h"
#include "mha/error.h"

namespace mha::dist {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFill = -1e6f;  // the d2l chapter's masked_softmax fill
// Message tags: a block's keys and values at ring step s, its gradients.
constexpr int kTagKV = 1000, kTagGrad = 2000000;

// y:[rows, out] = x:[rows, in] W^T (W:[out, in]) + b.
void project(const float* x, int64_t rows, int64_t in, const Tensor& W, const Tensor& b, float* y) {
  const int64_t out = W.size(0);
  if (rows == 0) return;
  cpu::sgemm(false, true, rows, out, in, 1.0f, x, in, W.data(), in, 0.0f, y, out);
  if (!b.empty())
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += b.data()[o];
}

// The gradients of y = x W^T + b from dy:[rows, out]: dW += dy^T x, db +=
// column sums of dy, dx = dy W (dx null: not wanted).
void project_backward(const float* dy, const float* x, int64_t rows, int64_t in, const Tensor& W, Tensor& dW,
                      Tensor* db, float* dx) {
  const int64_t out = W.size(0);
  if (rows == 0) return;
  cpu::sgemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dW.data(), in);
  if (db)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) db->data()[o] += dy[r * out + o];
  if (dx) cpu::sgemm(false, false, rows, in, out, 1.0f, dy, out, W.data(), in, 0.0f, dx, in);
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
  RingStats stats;

  // --- The last forward: what the backward needs ---
  bool have_call = false;
  int64_t B = 0, Qr = 0, Kr = 0, Q = 0, K = 0, q_begin = 0;
  std::vector<int64_t> k_sizes, k_begins;  // every rank's key block
  Tensor xq, xk, xv;                       // this rank's inputs
  std::vector<float> qp;                   // the queries' projections, [rows, H*d] (keys' and
                                           // values' are projected again by the backward)
  std::vector<float> heads;                // normalised attention output, [B*Qr, H*d]
  std::vector<float> row_max, row_sum;     // [B,H,Qr]; sum 0: no live key
  Tensor weights;                          // [B,H,Qr,K] when kept
  ValidLens lens;
  Causal causal = Causal::None;
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

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
  bool key_masked(int64_t b, int64_t i, int64_t kj) const {
    return static_cast<float>(kj) >= lens.at(b, i) || kj > last_key(i);
  }
  // Whether the tile of rows [i0, i0 + n) of batch row b can skip the key
  // block starting at k_begin: every row has a live key somewhere (key 0:
  // lengths and causal limits mask a suffix) and none in this block (the
  // block's first key masked masks the rest).
  bool skippable(int64_t b, int64_t i0, int64_t n, int64_t k_begin) const {
    for (int64_t i = i0; i < i0 + n; ++i)
      if (key_masked(b, i, 0) || !key_masked(b, i, k_begin)) return false;
    return true;
  }
  float fill() const { return causal == Causal::None ? kFill : -kInf; }

  // Scores of this rank's queries [i0, i0 + n) against key block `kblock`
  // (Ko keys from global position k_begin), head h of batch row b, scaled and
  // masked: S:[n, Ko]; masked:[n, Ko] says which were masked.
  void scores(int64_t b, int64_t h, int64_t i0, int64_t n, const float* kblock, int64_t Ko, int64_t k_begin,
              std::vector<float>& S, std::vector<uint8_t>& masked) const {
    const int64_t Hd = num_heads * head_dim;
    S.assign(static_cast<size_t>(n * Ko), 0.0f);
    masked.assign(static_cast<size_t>(n * Ko), 0);
    if (n == 0 || Ko == 0) return;
    cpu::sgemm(false, true, n, Ko, head_dim, 1.0f, qp.data() + (b * Qr + i0) * Hd + h * head_dim, Hd,
               kblock + (b * Ko) * Hd + h * head_dim, Hd, 0.0f, S.data(), Ko);
    const float divisor = std::sqrt(static_cast<float>(head_dim));
    for (int64_t i = 0; i < n; ++i) {
      const float length = lens.at(b, i0 + i);
      const int64_t last = last_key(i0 + i);
      for (int64_t j = 0; j < Ko; ++j) {
        float& s = S[static_cast<size_t>(i * Ko + j)];
        s = s / divisor;  // as the chapter: scores / sqrt(d)
        const int64_t kj = k_begin + j;
        if (static_cast<float>(kj) >= length || kj > last) {
          masked[static_cast<size_t>(i * Ko + j)] = 1;
          s = fill();
        }
      }
    }
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
  static const char* op = "dist.RingAttention.forward";
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
    return 0;
  });
  // Every rank's block sizes, and one batch size for all.
  const std::vector<int64_t> batches = c.all_gather(queries.size(0));
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
    // What this rank allocates, before it does: a sequence whose share per
    // rank fits the limit runs, however long the whole.
    core::MemoryPlan plan(op);
    if (s.training)
      plan.add("inputs, kept for the backward", {B * (Qr * queries.size(2) + Kr * (keys.size(2) + values.size(2)))});
    plan.add("query projections", {B, Qr, Hd});
    plan.add("key/value blocks (the one computed on, the one arriving)", {2, 2, B, Kmax, Hd});
    plan.add("attention output before W_o", {B, Qr, Hd});
    plan.add("softmax statistics and value sums", {2 * B * H * Qr + B * Hd});
    plan.add("scores of one tile", {std::min(Qr, kTile), Kmax});
    plan.add("masks of one tile", {std::min(Qr, kTile), Kmax}, 1);
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
  s.causal = causal;
  s.fully_masked = fully_masked;
  // The inputs, for the backward's projections (training mode only).
  s.xq = s.training ? queries : Tensor();
  s.xk = s.training ? keys : Tensor();
  s.xv = s.training ? values : Tensor();

  // This rank's projections; the key/value block that starts round the ring.
  s.qp.assign(static_cast<size_t>(B * Qr * Hd), 0.0f);
  project(queries.data(), B * Qr, queries.size(2), s.p("W_q.weight"), s.bias_of("W_q"), s.qp.data());
  std::vector<float> block(static_cast<size_t>(2 * B * Kr * Hd));
  project(keys.data(), B * Kr, keys.size(2), s.p("W_k.weight"), s.bias_of("W_k"), block.data());
  project(values.data(), B * Kr, values.size(2), s.p("W_v.weight"), s.bias_of("W_v"), block.data() + B * Kr * Hd);
  // Raw (scaled, masked) scores while the ring runs, weights at the end.
  if (s.keep_weights) s.weights = Tensor({B, H, Qr, K});

  // Online softmax state per (b, h, i), the unnormalised outputs in the
  // heads' concatenation layout, and the sum of every value row (the
  // uniform weights of a fully masked row).
  s.row_max.assign(static_cast<size_t>(B * H * Qr), -kInf);
  s.row_sum.assign(static_cast<size_t>(B * H * Qr), 0.0f);
  std::vector<float>& acc = s.heads;
  acc.assign(static_cast<size_t>(B * Qr * Hd), 0.0f);
  std::vector<float> value_sum(static_cast<size_t>(B * Hd), 0.0f);
  std::vector<float> S, next;
  std::vector<uint8_t> masked;
  const int prev = (r + P - 1) % P, nxt = (r + 1) % P;
  for (int step = 0; step < P; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    const int o = (r - step + P) % P;  // whose block this is
    const int64_t Ko = s.k_sizes[static_cast<size_t>(o)], k_begin = s.k_begins[static_cast<size_t>(o)];
    Request in, out;
    if (step + 1 < P) {  // the next block arrives while this one is computed on
      const int64_t Kn = s.k_sizes[static_cast<size_t>((r - step - 1 + P) % P)];
      next.resize(static_cast<size_t>(2 * B * Kn * Hd));
      in = c.irecv(next.data(), static_cast<int64_t>(next.size()), prev, kTagKV + step);
      out = c.isend(block.data(), static_cast<int64_t>(block.size()), nxt, kTagKV + step);
    }
    const auto compute_start = std::chrono::steady_clock::now();
    const float* kb = block.data();
    const float* vb = block.data() + B * Ko * Hd;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < Ko; ++j)
        for (int64_t x = 0; x < Hd; ++x) value_sum[static_cast<size_t>(b * Hd + x)] += vb[(b * Ko + j) * Hd + x];
      for (int64_t i0 = 0; i0 < Qr && Ko > 0; i0 += kTile) {
        const int64_t n = std::min(kTile, Qr - i0);
        ++s.stats.tiles;
        if (s.skippable(b, i0, n, k_begin)) {  // adds exactly nothing
          ++s.stats.tiles_skipped;
          if (s.keep_weights)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = i0; i < i0 + n; ++i) {
                float* w = s.weights.data() + ((b * H + h) * Qr + i) * K + k_begin;
                std::fill(w, w + Ko, s.fill());
              }
          continue;
        }
        for (int64_t h = 0; h < H; ++h) {
          s.scores(b, h, i0, n, kb, Ko, k_begin, S, masked);
          for (int64_t i = 0; i < n; ++i) {
            float* srow = S.data() + i * Ko;
            if (s.keep_weights)
              std::copy(srow, srow + Ko, s.weights.data() + ((b * H + h) * Qr + i0 + i) * K + k_begin);
            const size_t st = static_cast<size_t>((b * H + h) * Qr + i0 + i);
            const float m_old = s.row_max[st];
            const float m_new = std::max(m_old, *std::max_element(srow, srow + Ko));
            float* arow = acc.data() + (b * Qr + i0 + i) * Hd + h * d;
            if (m_new == -kInf) {  // no live key yet: nothing to add
              std::fill(srow, srow + Ko, 0.0f);
              continue;
            }
            const float rescale = std::exp(m_old - m_new);  // 0 when m_old = -inf
            float sum = 0.0f;
            for (int64_t j = 0; j < Ko; ++j) sum += (srow[j] = std::exp(srow[j] - m_new));
            s.row_sum[st] = s.row_sum[st] * rescale + sum;
            s.row_max[st] = m_new;
            for (int64_t x = 0; x < d; ++x) arow[x] *= rescale;
          }
          // acc[b, i0:i0+n, h] += P V[b, :, h]
          cpu::sgemm(false, false, n, d, Ko, 1.0f, S.data(), Ko, vb + (b * Ko) * Hd + h * d, Hd, 1.0f,
                     acc.data() + (b * Qr + i0) * Hd + h * d, Hd);
        }
      }
    }
    s.stats.compute_seconds += seconds_since(compute_start);
    if (step + 1 < P) {
      in.wait();
      out.wait();
      block.swap(next);
    }
    s.stats.step_seconds += seconds_since(step_start);
  }
  // Normalise; a row with no live key (only with causal masking) gets the policy.
  const float uniform = fully_masked == FullyMaskedRows::Zeros ? 0.0f : 1.0f / static_cast<float>(K);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Qr; ++i) {
        const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
        float* arow = acc.data() + (b * Qr + i) * Hd + h * d;
        const bool live = s.row_sum[st] > 0.0f;
        if (live) {
          for (int64_t x = 0; x < d; ++x) arow[x] /= s.row_sum[st];
        } else {
          for (int64_t x = 0; x < d; ++x)
            arow[x] = fully_masked == FullyMaskedRows::Zeros
                          ? 0.0f
                          : value_sum[static_cast<size_t>(b * Hd + h * d + x)] / static_cast<float>(K);
        }
        if (s.keep_weights) {
          float* w = s.weights.data() + st * static_cast<size_t>(K);
          for (int64_t j = 0; j < K; ++j) w[j] = live ? std::exp(w[j] - s.row_max[st]) / s.row_sum[st] : uniform;
        }
      }
  Tensor result({B, Qr, s.num_hiddens});
  project(acc.data(), B * Qr, Hd, s.p("W_o.weight"), s.bias_of("W_o"), result.data());
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
  std::vector<float> dheads(static_cast<size_t>(B * Qr * Hd));
  project_backward(grad_output.data(), s.heads.data(), B * Qr, Hd, s.p("W_o.weight"), g.at("W_o.weight"),
                   bias_grad("W_o"), dheads.data());
  // D = rowsum(dO * O) per (b, h, i): the softmax backward's correction.
  std::vector<float> D(static_cast<size_t>(B * H * Qr), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Qr; ++i) {
        float sum = 0.0f;
        for (int64_t x = 0; x < d; ++x) {
          const size_t e = static_cast<size_t>((b * Qr + i) * Hd + h * d + x);
          sum += dheads[e] * s.heads[e];
        }
        D[static_cast<size_t>((b * H + h) * Qr + i)] = sum;
      }

  // Blocks travel as in the forward; their gradients dK, dV follow, each
  // rank adding its part, and reach their owner after the last step.
  std::vector<float> dq(static_cast<size_t>(B * Qr * Hd), 0.0f);
  std::vector<float> block(static_cast<size_t>(2 * B * Kr * Hd)), next, grad_in, sending, mine;
  // The previous step's gradients on their way to rank r + 1. Waited for
  // only after this step's receives are posted: waiting at the end of a step
  // would have every rank wait for its successor to start the next step,
  // round the whole ring (a deadlock once messages are too large to be sent
  // eagerly).
  Request g_out;
  // This rank's keys and values projected again (not kept by the forward:
  // two fewer [B, K_r, H*d] buffers per rank between the calls).
  project(s.xk.data(), B * Kr, s.xk.size(2), s.p("W_k.weight"), s.bias_of("W_k"), block.data());
  project(s.xv.data(), B * Kr, s.xv.size(2), s.p("W_v.weight"), s.bias_of("W_v"), block.data() + B * Kr * Hd);
  std::vector<float> S, dP;
  std::vector<uint8_t> masked;
  const float divisor = std::sqrt(static_cast<float>(d));
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
    std::vector<float> local(static_cast<size_t>(2 * B * Ko * Hd), 0.0f);  // dK | dV of this rank's queries
    const float* kb = block.data();
    const float* vb = block.data() + B * Ko * Hd;
    float* dk = local.data();
    float* dv = local.data() + B * Ko * Hd;
    const int64_t k_begin = s.k_begins[static_cast<size_t>(o)];
    for (int64_t b = 0; b < B && Ko > 0; ++b)
      for (int64_t i0 = 0; i0 < Qr; i0 += kTile) {
        const int64_t n = std::min(kTile, Qr - i0);
        if (s.skippable(b, i0, n, k_begin)) continue;  // weights 0 there: adds nothing
        for (int64_t h = 0; h < H; ++h) {
          s.scores(b, h, i0, n, kb, Ko, k_begin, S, masked);
          // P = softmax weights recomputed from the row statistics.
          for (int64_t i = 0; i < n; ++i) {
            const size_t st = static_cast<size_t>((b * H + h) * Qr + i0 + i);
            float* prow = S.data() + i * Ko;
            for (int64_t j = 0; j < Ko; ++j) {
              if (s.row_sum[st] > 0.0f)
                prow[j] = std::exp(prow[j] - s.row_max[st]) / s.row_sum[st];
              else  // a fully masked row: the policy's constant weights
                prow[j] = s.fully_masked == FullyMaskedRows::Zeros ? 0.0f : 1.0f / static_cast<float>(s.K);
            }
          }
          const float* dO = dheads.data() + (b * Qr + i0) * Hd + h * d;
          // dV[b, :, h] += P^T dO
          cpu::sgemm(true, false, Ko, d, n, 1.0f, S.data(), Ko, dO, Hd, 1.0f, dv + (b * Ko) * Hd + h * d, Hd);
          // dP = dO V^T; dS = P (dP - D), 0 where the score was masked (a constant)
          dP.assign(static_cast<size_t>(n * Ko), 0.0f);
          cpu::sgemm(false, true, n, Ko, d, 1.0f, dO, Hd, vb + (b * Ko) * Hd + h * d, Hd, 0.0f, dP.data(), Ko);
          for (int64_t i = 0; i < n; ++i) {
            const size_t st = static_cast<size_t>((b * H + h) * Qr + i0 + i);
            for (int64_t j = 0; j < Ko; ++j) {
              const size_t e = static_cast<size_t>(i * Ko + j);
              dP[e] = (masked[e] || s.row_sum[st] <= 0.0f) ? 0.0f : S[e] * (dP[e] - D[st]) / divisor;
            }
          }
          // dq[b, i0:i0+n, h] += dS K;  dK[b, :, h] += dS^T q
          cpu::sgemm(false, false, n, d, Ko, 1.0f, dP.data(), Ko, kb + (b * Ko) * Hd + h * d, Hd, 1.0f,
                     dq.data() + (b * Qr + i0) * Hd + h * d, Hd);
          cpu::sgemm(true, false, Ko, d, n, 1.0f, dP.data(), Ko, s.qp.data() + (b * Qr + i0) * Hd + h * d, Hd, 1.0f,
                     dk + (b * Ko) * Hd + h * d, Hd);
        }
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

  // The projections' backward on this rank's rows.
  MultiHeadAttention::InputGrads grads{Tensor(s.xq.shape()), Tensor(s.xk.shape()), Tensor(s.xv.shape())};
  project_backward(dq.data(), s.xq.data(), B * Qr, s.xq.size(2), s.p("W_q.weight"), g.at("W_q.weight"),
                   bias_grad("W_q"), grads.queries.data());
  project_backward(mine.data(), s.xk.data(), B * Kr, s.xk.size(2), s.p("W_k.weight"), g.at("W_k.weight"),
                   bias_grad("W_k"), grads.keys.data());
  project_backward(mine.data() + B * Kr * Hd, s.xv.data(), B * Kr, s.xv.size(2), s.p("W_v.weight"),
                   g.at("W_v.weight"), bias_grad("W_v"), grads.values.data());
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
void RingAttention::train(bool on) { s_->training = on; }
const Tensor& RingAttention::attention_weights() const { return s_->weights; }
const RingStats& RingAttention::stats() const { return s_->stats; }
const StateDict& RingAttention::state_dict() const { return s_->params; }
const StateDict& RingAttention::grads() const { return s_->grads; }
void RingAttention::zero_grad() {
  for (auto& [name, t] : s_->grads) std::fill(t.values().begin(), t.values().end(), 0.0f);
}
const Communicator& RingAttention::communicator() const { return s_->comm; }

}  // namespace mha::dist
