// mha::dist::RingAttention (mha/dist/ring_attention.h): projections on each
// rank's own rows, attention over key/value blocks passed round a ring with
// online softmax, the output projection on each rank's own rows.
#include "mha/dist/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace

struct RingAttention::State {
  explicit State(Communicator c) : comm(std::move(c)) {}
  Communicator comm;
  int64_t num_hiddens = 0, num_heads = 0, head_dim = 0;
  bool bias = false;
  StateDict params, grads;

  // --- The last forward: what the backward needs ---
  bool have_call = false;
  int64_t B = 0, Qr = 0, Kr = 0, Q = 0, K = 0, q_begin = 0;
  std::vector<int64_t> k_sizes, k_begins;  // every rank's key block
  Tensor xq, xk, xv;                       // this rank's inputs
  std::vector<float> qp, kp, vp;           // their projections, [rows, H*d]
  std::vector<float> heads;                // normalised attention output, [B*Qr, H*d]
  std::vector<float> row_max, row_sum;     // [B,H,Qr]; sum 0: no live key
  ValidLens lens;
  Causal causal = Causal::None;
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;

  const Tensor& p(const std::string& name) const { return params.at(name); }
  Tensor bias_of(const std::string& layer) const {
    const auto it = params.find(layer + ".bias");
    return it == params.end() ? Tensor() : it->second;
  }

  // Scores of this rank's queries (row i) against key block `o` (keys j),
  // head h of batch row b, masked: S:[Qr, Ko]. Returns whether key j of row
  // i is masked in `masked` (same layout).
  void scores(int64_t b, int64_t h, const float* kblock, int64_t Ko, int64_t k_begin, std::vector<float>& S,
              std::vector<uint8_t>& masked) const {
    const int64_t Hd = num_heads * head_dim;
    S.assign(static_cast<size_t>(Qr * Ko), 0.0f);
    masked.assign(static_cast<size_t>(Qr * Ko), 0);
    if (Qr == 0 || Ko == 0) return;
    cpu::sgemm(false, true, Qr, Ko, head_dim, 1.0f, qp.data() + (b * Qr) * Hd + h * head_dim, Hd,
               kblock + (b * Ko) * Hd + h * head_dim, Hd, 0.0f, S.data(), Ko);
    const float divisor = std::sqrt(static_cast<float>(head_dim));
    for (int64_t i = 0; i < Qr; ++i) {
      const float length = lens.at(b, i);
      const int64_t qi = q_begin + i;
      const int64_t last = causal == Causal::TopLeft ? qi : causal == Causal::BottomRight ? qi + K - Q : K - 1;
      for (int64_t j = 0; j < Ko; ++j) {
        float& s = S[static_cast<size_t>(i * Ko + j)];
        s = s / divisor;  // as the chapter: scores / sqrt(d)
        const int64_t kj = k_begin + j;
        const bool out = static_cast<float>(kj) >= length || kj > last;
        if (out) {
          masked[static_cast<size_t>(i * Ko + j)] = 1;
          s = causal == Causal::None ? kFill : -kInf;
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
    : s_(std::make_unique<State>(std::move(comm))) {
  static const char* op = "dist.RingAttention";
  State& s = *s_;
  agree(s.comm, op, [&] {
    // The chapter's module checks the sizes and the state dict.
    const bool bias = state.count("W_q.bias") > 0;
    MultiHeadAttention m(num_hiddens, num_heads, 0.0f, bias);
    m.load_state_dict(state);
    s.num_hiddens = num_hiddens;
    s.num_heads = num_heads;
    s.head_dim = m.head_dim();
    s.bias = bias;
    s.params = m.state_dict();
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
  agree(c, op, [&] {
    for (int o = 0; o < P; ++o)
      if (batches[static_cast<size_t>(o)] != queries.size(0))
        fail(op, "queries: batch size ", batches[static_cast<size_t>(o)], " on rank ", o, ", ", queries.size(0),
             " on rank ", r, "; every rank holds blocks of the same batch rows");
    int64_t K = 0;
    for (int64_t n : s.k_sizes) K += n;
    if (K == 0) fail(op, "keys: no rank holds a key; a softmax over zero keys is undefined");
    return 0;
  });
  s.B = queries.size(0);
  s.Qr = queries.size(1);
  s.Kr = keys.size(1);
  s.Q = s.K = s.q_begin = 0;
  s.k_begins.assign(static_cast<size_t>(P), 0);
  for (int o = 0; o < P; ++o) {
    if (o < r) s.q_begin += q_sizes[static_cast<size_t>(o)];
    s.k_begins[static_cast<size_t>(o)] = s.K;
    s.Q += q_sizes[static_cast<size_t>(o)];
    s.K += s.k_sizes[static_cast<size_t>(o)];
  }
  s.lens = valid_lens;
  s.causal = causal;
  s.fully_masked = fully_masked;
  s.xq = queries;
  s.xk = keys;
  s.xv = values;
  const int64_t B = s.B, Qr = s.Qr, Kr = s.Kr;

  // This rank's projections; the key/value block that starts round the ring.
  s.qp.assign(static_cast<size_t>(B * Qr * Hd), 0.0f);
  project(queries.data(), B * Qr, queries.size(2), s.p("W_q.weight"), s.bias_of("W_q"), s.qp.data());
  std::vector<float> block(static_cast<size_t>(2 * B * Kr * Hd));
  project(keys.data(), B * Kr, keys.size(2), s.p("W_k.weight"), s.bias_of("W_k"), block.data());
  project(values.data(), B * Kr, values.size(2), s.p("W_v.weight"), s.bias_of("W_v"), block.data() + B * Kr * Hd);
  s.kp.assign(block.begin(), block.begin() + B * Kr * Hd);
  s.vp.assign(block.begin() + B * Kr * Hd, block.end());

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
    const int o = (r - step + P) % P;  // whose block this is
    const int64_t Ko = s.k_sizes[static_cast<size_t>(o)];
    Request in, out;
    if (step + 1 < P) {  // the next block arrives while this one is computed on
      const int64_t Kn = s.k_sizes[static_cast<size_t>((r - step - 1 + P) % P)];
      next.resize(static_cast<size_t>(2 * B * Kn * Hd));
      in = c.irecv(next.data(), static_cast<int64_t>(next.size()), prev, kTagKV + step);
      out = c.isend(block.data(), static_cast<int64_t>(block.size()), nxt, kTagKV + step);
    }
    const float* kb = block.data();
    const float* vb = block.data() + B * Ko * Hd;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < Ko; ++j)
        for (int64_t x = 0; x < Hd; ++x) value_sum[static_cast<size_t>(b * Hd + x)] += vb[(b * Ko + j) * Hd + x];
      for (int64_t h = 0; h < H; ++h) {
        s.scores(b, h, kb, Ko, s.k_begins[static_cast<size_t>(o)], S, masked);
        for (int64_t i = 0; i < Qr && Ko > 0; ++i) {
          float* srow = S.data() + i * Ko;
          const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
          const float m_old = s.row_max[st];
          const float m_new = std::max(m_old, *std::max_element(srow, srow + Ko));
          float* arow = acc.data() + (b * Qr + i) * Hd + h * d;
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
        // acc[b, :, h] += P V[b, :, h]
        if (Qr > 0 && Ko > 0)
          cpu::sgemm(false, false, Qr, d, Ko, 1.0f, S.data(), Ko, vb + (b * Ko) * Hd + h * d, Hd, 1.0f,
                     acc.data() + (b * Qr) * Hd + h * d, Hd);
      }
    }
    if (step + 1 < P) {
      in.wait();
      out.wait();
      block.swap(next);
    }
  }
  // Normalise; a row with no live key (only with causal masking) gets the policy.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Qr; ++i) {
        const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
        float* arow = acc.data() + (b * Qr + i) * Hd + h * d;
        if (s.row_sum[st] > 0.0f) {
          for (int64_t x = 0; x < d; ++x) arow[x] /= s.row_sum[st];
        } else {
          for (int64_t x = 0; x < d; ++x)
            arow[x] = fully_masked == FullyMaskedRows::Zeros
                          ? 0.0f
                          : value_sum[static_cast<size_t>(b * Hd + h * d + x)] / static_cast<float>(s.K);
        }
      }
  Tensor result({B, Qr, s.num_hiddens});
  project(acc.data(), B * Qr, Hd, s.p("W_o.weight"), s.bias_of("W_o"), result.data());
  s.have_call = true;
  return result;
}

MultiHeadAttention::InputGrads RingAttention::backward(const Tensor& grad_output) {
  static const char* op = "dist.RingAttention.backward";
  State& s = *s_;
  const Communicator& c = s.comm;
  const int P = c.size(), r = c.rank();
  agree(c, op, [&] {
    if (!s.have_call) fail(op, "no forward call to differentiate: call forward() before backward()");
    const Shape want{s.B, s.Qr, s.num_hiddens};
    if (grad_output.shape() != want)
      fail(op, "grad_output: shape ", shape_str(grad_output.shape()), " is not the output's ", shape_str(want));
    return 0;
  });
  const int64_t B = s.B, Qr = s.Qr, Kr = s.Kr, H = s.num_heads, d = s.head_dim, Hd = H * d;
  StateDict g;  // this rank's share of the weight gradients
  for (const auto& [name, t] : s.params) g[name] = Tensor(t.shape());
  auto bias_grad = [&](const std::string& layer) { return s.bias ? &g.at(layer + ".bias") : nullptr; };

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
  std::copy(s.kp.begin(), s.kp.end(), block.begin());
  std::copy(s.vp.begin(), s.vp.end(), block.begin() + B * Kr * Hd);
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
    for (int64_t b = 0; b < B && Ko > 0 && Qr > 0; ++b)
      for (int64_t h = 0; h < H; ++h) {
        s.scores(b, h, kb, Ko, s.k_begins[static_cast<size_t>(o)], S, masked);
        // P = softmax weights recomputed from the row statistics.
        for (int64_t i = 0; i < Qr; ++i) {
          const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
          float* prow = S.data() + i * Ko;
          for (int64_t j = 0; j < Ko; ++j) {
            if (s.row_sum[st] > 0.0f)
              prow[j] = std::exp(prow[j] - s.row_max[st]) / s.row_sum[st];
            else  // a fully masked row: the policy's constant weights
              prow[j] = s.fully_masked == FullyMaskedRows::Zeros ? 0.0f : 1.0f / static_cast<float>(s.K);
          }
        }
        // dV[b, :, h] += P^T dO
        cpu::sgemm(true, false, Ko, d, Qr, 1.0f, S.data(), Ko, dheads.data() + (b * Qr) * Hd + h * d, Hd, 1.0f,
                   dv + (b * Ko) * Hd + h * d, Hd);
        // dP = dO V^T; dS = P (dP - D), 0 where the score was masked (a constant)
        dP.assign(static_cast<size_t>(Qr * Ko), 0.0f);
        cpu::sgemm(false, true, Qr, Ko, d, 1.0f, dheads.data() + (b * Qr) * Hd + h * d, Hd,
                   vb + (b * Ko) * Hd + h * d, Hd, 0.0f, dP.data(), Ko);
        for (int64_t i = 0; i < Qr; ++i) {
          const size_t st = static_cast<size_t>((b * H + h) * Qr + i);
          for (int64_t j = 0; j < Ko; ++j) {
            const size_t e = static_cast<size_t>(i * Ko + j);
            dP[e] = (masked[e] || s.row_sum[st] <= 0.0f) ? 0.0f : S[e] * (dP[e] - D[st]) / divisor;
          }
        }
        // dq[b, :, h] += dS K;  dK[b, :, h] += dS^T q
        cpu::sgemm(false, false, Qr, d, Ko, 1.0f, dP.data(), Ko, kb + (b * Ko) * Hd + h * d, Hd, 1.0f,
                   dq.data() + (b * Qr) * Hd + h * d, Hd);
        cpu::sgemm(true, false, Ko, d, Qr, 1.0f, dP.data(), Ko, s.qp.data() + (b * Qr) * Hd + h * d, Hd, 1.0f,
                   dk + (b * Ko) * Hd + h * d, Hd);
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

const StateDict& RingAttention::state_dict() const { return s_->params; }
const StateDict& RingAttention::grads() const { return s_->grads; }
void RingAttention::zero_grad() {
  for (auto& [name, t] : s_->grads) std::fill(t.values().begin(), t.values().end(), 0.0f);
}
const Communicator& RingAttention::communicator() const { return s_->comm; }

}  // namespace mha::dist
