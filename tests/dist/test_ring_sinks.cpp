// Attention sinks over ranks: RingAttention and GridAttention with sinks
// (one logit per head in every row's softmax denominator, no value) against
// one process: the module's weights, and the fused kernel on the whole
// sequence with the same masks and sinks (the kernels' own tests hold it
// to torch's ops). Forward, attention weights, every input and weight
// gradient, and the sinks' gradient, with causal masks, windows, ALiBi,
// softcap and the chapter's lengths, on uneven splits.
#include <cmath>
#include <vector>

#include "dist_test_util.h"
#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "mha/detail/published.h"

namespace mha::dist::test {
namespace {

constexpr double kTol = 1e-5;

// y:[B,L,Out] = x:[B,L,In] W^T + b (b may be empty), in double.
Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b) {
  const int64_t rows = x.size(0) * x.size(1), in = x.size(2), out = W.size(0);
  Tensor y({x.size(0), x.size(1), out});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b.data()[o];
      for (int64_t c = 0; c < in; ++c) acc += static_cast<double>(x.data()[r * in + c]) * W.data()[o * in + c];
      y.data()[r * out + o] = static_cast<float>(acc);
    }
  return y;
}

// The gradients of y = x W^T + b from dy: dx = dy W, dW = dy^T x, db = column sums of dy.
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& W, Tensor& dx, Tensor& dW, Tensor* db) {
  const int64_t rows = x.size(0) * x.size(1), in = x.size(2), out = W.size(0);
  dx = Tensor(x.shape());
  dW = Tensor(W.shape());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < in; ++c) {
      double acc = 0;
      for (int64_t o = 0; o < out; ++o) acc += static_cast<double>(dy.data()[r * out + o]) * W.data()[o * in + c];
      dx.data()[r * in + c] = static_cast<float>(acc);
    }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < in; ++c) {
      double acc = 0;
      for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(dy.data()[r * out + o]) * x.data()[r * in + c];
      dW.data()[o * in + c] = static_cast<float>(acc);
    }
  if (!db) return;
  *db = Tensor({out});
  for (int64_t o = 0; o < out; ++o) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += dy.data()[r * out + o];
    db->data()[o] = static_cast<float>(acc);
  }
}

struct Call {
  int64_t B, Q, K;
  ValidLens lens;
  CallMasks masks;
  std::vector<float> sinks = {};  // one per head, or empty
  std::vector<int64_t> docs = {};  // a packed row's document offsets, or empty
  float dropout = 0.0f;  // on the weights, keyed as the module's with seed 7
};

// One process: the module's projections, the fused kernel over the whole
// sequence, the output projection; and their backward.
struct OneProcess {
  Tensor out, weights;  // [B,Q,N], [B,H,Q,K]
  MultiHeadAttention::InputGrads inputs;
  StateDict grads;
  std::vector<float> sinks_grad;
  double sinks_scale = 0;  // max over heads of sum over rows |sink weight * dO . O|
};

OneProcess one_process(const StateDict& w, int64_t H, const Call& call, const Tensor& xq, const Tensor& xk,
                       const Tensor& xv, const Tensor& grad_out) {
  auto bias = [&](const std::string& layer) {
    const auto it = w.find(layer + ".bias");
    return it == w.end() ? Tensor() : it->second;
  };
  const Tensor qp = linear(xq, w.at("W_q.weight"), bias("W_q")), kp = linear(xk, w.at("W_k.weight"), bias("W_k")),
               vp = linear(xv, w.at("W_v.weight"), bias("W_v"));
  const int64_t B = call.B, Q = call.Q, K = call.K, N = qp.size(2), d = N / H;
  Tensor heads({B, Q, N});
  OneProcess r;
  r.weights = Tensor({B, H, Q, K});
  std::vector<float> row_max2(static_cast<size_t>(B * H * Q)), row_sum(row_max2.size()), lens = call.lens.values();
  kernels::AttentionForward p;
  p.q = qp.view().split_heads(H), p.k = kp.view().split_heads(H), p.v = vp.view().split_heads(H);
  p.out = heads.view().split_heads(H);
  p.weights = r.weights.data();
  p.stats = {row_max2.data(), row_sum.data()};
  p.scale_divisor = std::sqrt(static_cast<float>(d));
  if (!call.lens.is_none()) {
    p.length_kind = call.lens.kind() == ValidLens::Kind::PerBatch ? kernels::LengthKind::PerBatch
                                                                  : kernels::LengthKind::PerQuery;
    p.lens = lens.data();
  }
  const CallMasks& m = call.masks;
  p.masks.causal = m.causal;
  p.masks.window_left = m.window.left, p.masks.window_right = m.window.right;
  p.masks.softcap = m.scores.softcap;
  p.masks.alibi_slopes = m.scores.alibi_slopes.empty() ? nullptr : m.scores.alibi_slopes.data();
  p.masks.sinks = call.sinks.empty() ? nullptr : call.sinks.data();
  if (!call.docs.empty()) {
    p.masks.doc_offsets = call.docs.data();
    p.masks.documents = static_cast<int64_t>(call.docs.size()) - 1;
  }
  // As the module: -inf only under masks (documents are one).
  const bool masked = m.causal != Causal::None || m.window.any() || !call.docs.empty();
  p.masks.fill = masked ? kernels::MaskFill::NegInf : kernels::MaskFill::Seed;
  p.masks.fully_masked = masked ? m.fully_masked_rows : FullyMaskedRows::Uniform;
  if (call.dropout > 0.0f) {  // the first key of the stream of seed 7, as the ring's first call draws it
    p.dropout.p = call.dropout;
    p.dropout.key = detail::KeyStream(7).next();
  }
  const kernels::SoftmaxStats stats = kernels::attention_forward(AttentionKernel::Fused, p);
  r.out = linear(heads, w.at("W_o.weight"), bias("W_o"));

  Tensor dheads, dW, db;
  const bool has_bias = w.count("W_q.bias") > 0;
  linear_backward(grad_out, heads, w.at("W_o.weight"), dheads, dW, &db);
  r.grads["W_o.weight"] = dW;
  r.grads["W_o.bias"] = db;  // the chapter's module has W_o's bias always
  Tensor dq({B, Q, N}), dk({B, K, N}), dv({B, K, N});
  kernels::AttentionBackward g;
  g.fwd = p;
  g.fwd.weights = nullptr;
  g.fwd.stats = stats;
  g.grad_out = dheads.view().split_heads(H);
  g.grad_q = dq.view().split_heads(H), g.grad_k = dk.view().split_heads(H), g.grad_v = dv.view().split_heads(H);
  r.sinks_grad.assign(call.sinks.size(), 0.0f);
  if (!call.sinks.empty()) g.grad_sinks = r.sinks_grad.data();
  kernels::attention_backward(AttentionKernel::Fused, g);
  for (int64_t h = 0; h < H && !call.sinks.empty(); ++h) {
    double scale = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Q; ++i) {
        double kept = 0, D = 0;  // the sink's weight is what the keys leave
        for (int64_t j = 0; j < K; ++j) kept += r.weights.data()[((b * H + h) * Q + i) * K + j];
        for (int64_t x = 0; x < d; ++x)
          D += static_cast<double>(dheads.data()[(b * Q + i) * N + h * d + x]) * heads.data()[(b * Q + i) * N + h * d + x];
        scale += std::fabs((1.0 - kept) * D);
      }
    r.sinks_scale = std::max(r.sinks_scale, scale);
  }
  const char* layer[] = {"W_q", "W_k", "W_v"};
  const Tensor* dy[] = {&dq, &dk, &dv};
  const Tensor* x[] = {&xq, &xk, &xv};
  Tensor* dx[] = {&r.inputs.queries, &r.inputs.keys, &r.inputs.values};
  for (int i = 0; i < 3; ++i) {
    Tensor dWi, dbi;
    linear_backward(*dy[i], *x[i], w.at(std::string(layer[i]) + ".weight"), *dx[i], dWi, has_bias ? &dbi : nullptr);
    r.grads[std::string(layer[i]) + ".weight"] = dWi;
    if (has_bias) r.grads[std::string(layer[i]) + ".bias"] = dbi;
  }
  if (w.count("W_o.bias") == 0) r.grads.erase("W_o.bias");
  return r;
}

ValidLens local_lens(const ValidLens& lens, int64_t B, int64_t Q, int64_t begin, int64_t n) {
  if (lens.kind() != ValidLens::Kind::PerQuery) return lens;
  std::vector<float> mine;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) mine.push_back(lens.values()[static_cast<size_t>(b * Q + begin + i)]);
  return ValidLens::per_query(B, n, mine);
}

double largest_of(const StateDict& grads) {
  double largest = 0;
  for (const auto& [name, g] : grads)
    for (float x : g.values()) largest = std::max(largest, static_cast<double>(std::fabs(x)));
  return largest;
}

Tensor vec(const std::vector<float>& x) {
  Tensor t({static_cast<int64_t>(x.size())});
  std::copy(x.begin(), x.end(), t.data());
  return t;
}

// The ring (groups 0) or the grid with `groups` head groups against one process.
void check(const Call& call, int64_t N, int64_t H, bool bias, uint64_t seed, int groups = 0) {
  const Communicator& c = world();
  auto ref = reference_module(N, H, bias, 7, 6, 5, seed);
  const Tensor q = randn({call.B, call.Q, 7}, seed + 1), k = randn({call.B, call.K, 6}, seed + 2),
               v = randn({call.B, call.K, 5}, seed + 3), g = randn({call.B, call.Q, N}, seed + 4);
  const OneProcess want = one_process(ref->state_dict(), H, call, q, k, v, g);
  std::unique_ptr<RingAttention> ring;
  std::unique_ptr<GridAttention> grid;
  std::pair<int64_t, int64_t> qb, kb;
  if (groups == 0) {
    ring = std::make_unique<RingAttention>(c, N, H, ref->state_dict());
    ring->keep_attention_weights(true);
    ring->set_dropout(call.dropout, 7);
    qb = RingAttention::block_of(call.Q, c.size(), c.rank());
    kb = RingAttention::block_of(call.K, c.size(), c.rank());
  } else {
    grid = std::make_unique<GridAttention>(c, groups, N, H, ref->state_dict());
    grid->keep_attention_weights(true);
    grid->set_dropout(call.dropout, 7);
    qb = grid->query_block(call.Q);
    kb = grid->key_block(call.K);
  }
  const auto [q0, qn] = qb;
  const auto [k0, kn] = kb;
  const Tensor xq = rows(q, q0, qn), xk = rows(k, k0, kn), xv = rows(v, k0, kn);
  const ValidLens lens = local_lens(call.lens, call.B, call.Q, q0, qn);
  const std::string where = "groups " + std::to_string(groups) + ", rank " + std::to_string(c.rank()) + ", B" +
                            std::to_string(call.B) + " Q" + std::to_string(call.Q) + " K" + std::to_string(call.K);
  const Tensor got = ring ? ring->forward(xq, xk, xv, lens, call.masks, call.sinks, call.docs)
                          : grid->forward(xq, xk, xv, lens, call.masks, call.sinks, call.docs);
  EXPECT_LT(relative_error(got, rows(want.out, q0, qn)), kTol) << "output, " << where;
  const int64_t h0 = grid ? grid->heads().front() : 0, hn = grid ? static_cast<int64_t>(grid->heads().size()) : H;
  const Tensor& weights = ring ? ring->attention_weights() : grid->attention_weights();
  if (call.dropout == 0.0f) {
    EXPECT_LT(relative_error(weights, query_rows(head_slice(want.weights, h0, hn), q0, qn)), kTol)
        << "weights, " << where;
  }
  const auto gg = ring ? ring->backward(rows(g, q0, qn)) : grid->backward(rows(g, q0, qn));
  EXPECT_LT(relative_error(gg.queries, rows(want.inputs.queries, q0, qn)), kTol) << "dX_q, " << where;
  EXPECT_LT(relative_error(gg.keys, rows(want.inputs.keys, k0, kn)), kTol) << "dX_k, " << where;
  EXPECT_LT(relative_error(gg.values, rows(want.inputs.values, k0, kn)), kTol) << "dX_v, " << where;
  const std::vector<float>& sinks_grad = ring ? ring->sinks_grad() : grid->sinks_grad();
  if (!call.sinks.empty()) {
    // Relative to the sum of its terms' sizes: a head's terms of both signs may cancel.
    EXPECT_LT(relative_error(vec(sinks_grad), vec(want.sinks_grad), want.sinks_scale), kTol)
        << "sinks' gradient, " << where;
  } else {
    for (float x : sinks_grad) EXPECT_EQ(x, 0.0f) << where;
  }
  const StateDict grads = ring ? ring->grads() : grid->gather_grads();
  if (grads.empty()) return;  // the grid's gradients are assembled on rank 0
  ASSERT_EQ(grads.size(), want.grads.size());
  const double largest = largest_of(want.grads);  // W_k.bias's gradient is 0 up to rounding
  for (const auto& [name, t] : want.grads)
    EXPECT_LT(relative_error(grads.at(name), t, name == "W_k.bias" ? largest : 0.0), kTol) << name << ", " << where;
}

CallMasks call_masks(Causal causal, Window window, ScoreOptions scores,
                     FullyMaskedRows fully = FullyMaskedRows::Uniform) {
  CallMasks m;
  m.causal = causal;
  m.window = window;
  m.scores = std::move(scores);
  m.fully_masked_rows = fully;
  return m;
}

TEST(RingSinks, TheOneProcessReferenceIsTheModuleWithoutSinks) {
  // The harness below (projections, the fused kernel on the whole sequence,
  // their backward) against MultiHeadAttention itself, where both apply.
  auto ref = reference_module(12, 3, true, 7, 6, 5, 300);
  ref->train();
  const Call call{2, 7, 9, ValidLens::per_batch({6, 0}),
                  call_masks(Causal::BottomRight, {3, 1}, {2.0f, {0.3f, -0.2f, 0.1f}}), {}};
  const Tensor q = randn({2, 7, 7}, 301), k = randn({2, 9, 6}, 302), v = randn({2, 9, 5}, 303),
               g = randn({2, 7, 12}, 304);
  const OneProcess mine = one_process(ref->state_dict(), 3, call, q, k, v, g);
  EXPECT_LT(relative_error(mine.out, ref->forward(q, k, v, call.lens, call.masks)), kTol);
  const auto gw = ref->backward(g);
  EXPECT_LT(relative_error(mine.inputs.queries, gw.queries), kTol);
  EXPECT_LT(relative_error(mine.inputs.keys, gw.keys), kTol);
  EXPECT_LT(relative_error(mine.inputs.values, gw.values), kTol);
  const double largest = largest_of(ref->grads());
  ASSERT_EQ(mine.grads.size(), ref->grads().size());
  for (const auto& [name, t] : ref->grads())
    EXPECT_LT(relative_error(mine.grads.at(name), t, name == "W_k.bias" ? largest : 0.0), kTol) << name;
}

// Sinks in [-3, 3], dominating (+20) and negligible (-20).
const std::vector<float> kSinks3{0.7f, 20.0f, -20.0f}, kSinks4{-1.5f, 2.0f, 20.0f, -20.0f};

TEST(RingSinks, SinksAloneAndWithTheChaptersLengths) {
  const ValidLens none;
  check({2, 7, 9, none, CallMasks(), kSinks3}, 12, 3, true, 310);
  // Row 1 of length 0: every key at the chapter's -1e6, beside the sink.
  check({2, 7, 9, ValidLens::per_batch({4, 0}), CallMasks(), kSinks3}, 12, 3, true, 311);
  check({2, 5, 9, ValidLens::per_query(2, 5, {1, 9, 2.5f, 0, 7, 3, 3, 8, 1.5f, 4}), CallMasks(), {0.5f, -0.5f}}, 8,
        2, false, 312);
  // Tiny and uneven: under -np 4 a rank holds no query or no key.
  check({1, 3, 3, ValidLens::per_batch({2}), CallMasks(), {20.0f}}, 6, 1, true, 313);
  check({3, 1, 2, none, CallMasks(), {1.0f, -1.0f, 20.0f, -20.0f}}, 8, 4, false, 314);
}

TEST(RingSinks, SinksWithCausalWindowAlibiAndSoftcapCombined) {
  const ValidLens none;
  const ScoreOptions alibi{0.0f, {0.5f, -0.3f, 0.1f}}, both{0.8f, {-0.2f, 0.7f, 0.05f}};
  check({2, 9, 9, none, call_masks(Causal::TopLeft, {}, alibi), kSinks3}, 12, 3, true, 320);
  check({2, 8, 11, ValidLens::per_batch({9, 4}), call_masks(Causal::BottomRight, {3, 0}, both), kSinks3}, 12, 3,
        true, 321);
  check({2, 9, 9, none, call_masks(Causal::None, {2, 1}, {30.0f, {}}), kSinks3}, 12, 3, false, 322);
  // Rows with no live key (length 0 under causal, a window of width 0 past
  // the length): all their weight on the sink, under both policies.
  check({2, 7, 7, ValidLens::per_batch({0, 5}), call_masks(Causal::TopLeft, {}, both, FullyMaskedRows::Zeros), kSinks3},
        12, 3, true, 323);
  check({2, 7, 7, ValidLens::per_query(2, 7, {0, 1, 1, 5, 7, 7, 2, 7, 6, 5, 4, 3, 2, 1}),
         call_masks(Causal::None, {1, 0}, alibi, FullyMaskedRows::Uniform), kSinks3},
        12, 3, true, 324);
  // Long enough for several query tiles and blocks sent by rendezvous.
  check({1, 300, 260, ValidLens::per_batch({200}), call_masks(Causal::BottomRight, {40, 0}, both), kSinks3}, 12, 3,
        true, 325);
}

TEST(RingSinks, SinksWithDropoutDropWhatOneProcessDrops) {
  // The weights' masks keyed by their place in the whole sequence: the sink
  // takes part in the denominator, dropout scales the weights after it.
  const ScoreOptions alibi{0.0f, {0.5f, -0.3f, 0.1f}};
  check({2, 9, 7, ValidLens::per_batch({6, 0}), call_masks(Causal::BottomRight, {}, alibi), kSinks3, {}, 0.3f}, 12, 3,
        true, 326);
  check({2, 9, 9, ValidLens::per_batch({4, 9}), CallMasks(), kSinks3, {}, 0.5f}, 12, 3, true, 327);
  check({1, 17, 17, ValidLens(), call_masks(Causal::TopLeft, {}, alibi), kSinks3, {0, 3, 3, 10, 11, 17}, 0.3f}, 12, 3,
        true, 328);
  const Communicator& c = world();
  if (c.size() % 2 == 0)
    check({2, 9, 7, ValidLens(), call_masks(Causal::TopLeft, {}, {}), kSinks4, {}, 0.3f}, 16, 4, true, 329, 2);
}

TEST(RingSinks, TheGridTakesEachGroupsSinks) {
  const Communicator& c = world();
  const ScoreOptions alibi{0.5f, {0.5f, -0.3f, 0.1f, 0.2f}};
  for (int groups : {1, 2, 4}) {
    if (c.size() % groups != 0) continue;
    check({2, 9, 7, ValidLens::per_batch({6, 0}), call_masks(Causal::BottomRight, {2, 0}, alibi), kSinks4}, 16, 4, true,
          330, groups);
    check({2, 5, 8, ValidLens(), CallMasks(), kSinks4}, 16, 4, false, 331, groups);
  }
}

TEST(RingSinks, SinksGradientsAccumulateZeroAndRepeatBitwise) {
  const Communicator& c = world();
  auto ref = reference_module(12, 3, true, 7, 6, 5, 340);
  const auto [q0, qn] = RingAttention::block_of(600, c.size(), c.rank());
  const auto [k0, kn] = RingAttention::block_of(520, c.size(), c.rank());
  const Tensor q = rows(randn({2, 600, 7}, 341), q0, qn), k = rows(randn({2, 520, 6}, 342), k0, kn),
               v = rows(randn({2, 520, 5}, 343), k0, kn), g = rows(randn({2, 600, 12}, 344), q0, qn);
  const CallMasks masks = call_masks(Causal::TopLeft, {100, 0}, {1.5f, {0.02f, -0.01f, 0.03f}});
  std::vector<std::vector<float>> runs[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    RingAttention ring(c, 12, 3, ref->state_dict());
    std::vector<float> out = ring.forward(q, k, v, ValidLens::per_batch({300, 520}), masks, kSinks3).values();
    const auto grads = ring.backward(g);
    std::vector<std::vector<float>>& run = runs[threads - 1];
    run = {out, grads.queries.values(), grads.keys.values(), grads.values.values(), ring.sinks_grad()};
    for (const auto& [name, t] : ring.grads()) run.push_back(t.values());
    // The same on every rank.
    std::vector<float> mine = ring.sinks_grad(), rank0 = mine;
    c.broadcast(rank0.data(), static_cast<int64_t>(rank0.size()), 0);
    EXPECT_EQ(0, std::memcmp(mine.data(), rank0.data(), mine.size() * sizeof(float))) << "rank " << c.rank();
    // A second backward adds as much again; zero_grad clears them.
    const std::vector<float> once = ring.sinks_grad();
    ring.forward(q, k, v, ValidLens::per_batch({300, 520}), masks, kSinks3);
    ring.backward(g);
    for (size_t h = 0; h < once.size(); ++h) EXPECT_EQ(ring.sinks_grad()[h], once[h] + once[h]);
    ring.zero_grad();
    for (float x : ring.sinks_grad()) EXPECT_EQ(x, 0.0f);
  }
  // Packed documents (one row of 600) with sinks, at 1 and 2 threads too.
  const std::vector<int64_t> docs{0, 150, 151, 420, 600};
  const Tensor q1 = rows(randn({1, 600, 7}, 345), q0, qn), k1 = rows(randn({1, 600, 6}, 346), q0, qn),
               v1 = rows(randn({1, 600, 5}, 347), q0, qn), g1 = rows(randn({1, 600, 12}, 348), q0, qn);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    RingAttention ring(c, 12, 3, ref->state_dict());
    const Tensor out = ring.forward(q1, k1, v1, {}, masks, kSinks3, docs);
    const auto grads = ring.backward(g1);
    std::vector<std::vector<float>>& run = runs[threads - 1];
    for (const Tensor* t : {&out, &grads.queries, &grads.keys, &grads.values}) run.push_back(t->values());
    run.push_back(ring.sinks_grad());
    for (const auto& [name, t] : ring.grads()) run.push_back(t.values());
  }
  set_num_threads(1);
  for (size_t i = 0; i < runs[0].size(); ++i)
    EXPECT_EQ(0, std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * sizeof(float)))
        << "result " << i << " differs between 1 and 2 threads, rank " << c.rank();
}

TEST(RingDocuments, PackedDocumentsOverGlobalPositionsEqualOneProcess) {
  // Documents of lengths 3, 0, 7, 1 and 6 over 17 positions: boundaries
  // inside blocks, an empty document, a document of one position.
  const std::vector<int64_t> docs{0, 3, 3, 10, 11, 17};
  const ScoreOptions alibi{0.0f, {0.5f, -0.3f, 0.1f}}, both{0.8f, {-0.2f, 0.7f, 0.05f}};
  const ValidLens none;
  check({1, 17, 17, none, CallMasks(), {}, docs}, 12, 3, true, 360);
  check({1, 17, 17, none, call_masks(Causal::TopLeft, {}, alibi), {}, docs}, 12, 3, true, 361);
  check({1, 17, 17, none, call_masks(Causal::BottomRight, {2, 0}, both), kSinks3, docs}, 12, 3, true, 362);
  // Lengths over the packed row: the later documents' queries see no key
  // (the policy, or all weight on the sink).
  check({1, 17, 17, ValidLens::per_batch({9}), call_masks(Causal::None, {}, {}, FullyMaskedRows::Zeros), {}, docs},
        12, 3, false, 363);
  check({1, 17, 17, ValidLens::per_batch({9}), call_masks(Causal::None, {1, 1}, alibi), kSinks3, docs}, 12, 3, true,
        364);
  // One document, and one per position.
  check({1, 5, 5, none, CallMasks(), kSinks3, {0, 5}}, 12, 3, true, 365);
  check({1, 5, 5, none, CallMasks(), {}, {0, 1, 2, 3, 4, 5}}, 12, 3, true, 366);
  const Communicator& c = world();
  for (int groups : {1, 2, 4})
    if (c.size() % groups == 0)
      check({1, 17, 17, none, call_masks(Causal::TopLeft, {}, {0.5f, {0.5f, -0.3f, 0.1f, 0.2f}}), kSinks4, docs}, 16,
            4, true, 367, groups);
}

TEST(RingDocuments, BlocksOfOtherDocumentsAreSkipped) {
  // One document per rank's block: each rank computes on its own block only.
  const Communicator& c = world();
  auto ref = reference_module(12, 3, true, 7, 6, 5, 370);
  RingAttention ring(c, 12, 3, ref->state_dict());
  const int64_t L = 8 * c.size();
  std::vector<int64_t> docs;
  for (int o = 0; o <= c.size(); ++o) docs.push_back(8 * o);
  const auto [b0, n] = RingAttention::block_of(L, c.size(), c.rank());
  const Tensor q = rows(randn({1, L, 7}, 371), b0, n), k = rows(randn({1, L, 6}, 372), b0, n),
               v = rows(randn({1, L, 5}, 373), b0, n);
  ring.forward(q, k, v, {}, CallMasks(), {}, docs);
  EXPECT_EQ(ring.stats().tiles, c.size());
  EXPECT_EQ(ring.stats().tiles_skipped, c.size() - 1) << "rank " << c.rank();
}

TEST(RingDocuments, RefusesOffsetsThatDoNotCoverOnePackedRow) {
  const Communicator& c = world();
  auto ref = reference_module(12, 3, true, 7, 6, 5, 380);
  RingAttention ring(c, 12, 3, ref->state_dict());
  const auto [b0, n] = RingAttention::block_of(6, c.size(), c.rank());
  const Tensor q = rows(randn({2, 6, 7}, 381), b0, n), k = rows(randn({2, 6, 6}, 382), b0, n),
               v = rows(randn({2, 6, 5}, 383), b0, n);
  EXPECT_THROW(ring.forward(q, k, v, {}, CallMasks(), {}, {0, 6}), Error);  // two batch rows
  const Tensor q1({1, n, 7}, 0.5f), k1({1, n, 6}, 0.5f), v1({1, n, 5}, 0.5f);
  EXPECT_THROW(ring.forward(q1, k1, v1, {}, CallMasks(), {}, {0, 5}), Error);     // ends before K
  EXPECT_THROW(ring.forward(q1, k1, v1, {}, CallMasks(), {}, {0, 4, 2, 6}), Error);  // decreasing
  EXPECT_THROW(ring.forward(q1, k1, v1, {}, CallMasks(), {}, {6}), Error);         // no document
  EXPECT_NO_THROW(ring.forward(q1, k1, v1, {}, CallMasks(), {}, {0, 2, 6}));
}

TEST(RingSinks, RefusesSinksOfTheWrongCountOrNotFinite) {
  const Communicator& c = world();
  auto ref = reference_module(12, 3, true, 7, 6, 5, 350);
  RingAttention ring(c, 12, 3, ref->state_dict());
  const Tensor x = randn({1, 2, 7}, 351), y = randn({1, 2, 6}, 352), z = randn({1, 2, 5}, 353);
  EXPECT_THROW(ring.forward(x, y, z, {}, CallMasks(), {1.0f, 2.0f}), Error);
  EXPECT_THROW(ring.forward(x, y, z, {}, CallMasks(), {1.0f, NAN, 2.0f}), Error);
  EXPECT_THROW(ring.forward(x, y, z, {}, CallMasks(), {1.0f, 2.0f, INFINITY}), Error);
}

TEST(RingSinks, SinksInTheMasksScoreOptionsEqualTheArgument) {
  // masks.scores.sinks (as the modules take them) and the argument are one
  // path: the same bits forward and backward, the ring and the grid.
  const Communicator& c = world();
  auto ref = reference_module(12, 3, true, 7, 6, 5, 360);
  const auto [q0, qn] = RingAttention::block_of(33, c.size(), c.rank());
  const auto [k0, kn] = RingAttention::block_of(29, c.size(), c.rank());
  const Tensor q = rows(randn({2, 33, 7}, 361), q0, qn), k = rows(randn({2, 29, 6}, 362), k0, kn),
               v = rows(randn({2, 29, 5}, 363), k0, kn), g = rows(randn({2, 33, 12}, 364), q0, qn);
  const ValidLens lens = ValidLens::per_batch({20, 29});
  const CallMasks plain = call_masks(Causal::BottomRight, {6, 0}, {0.0f, {0.5f, -0.3f, 0.1f}});
  CallMasks with_sinks = plain;
  with_sinks.scores.sinks = kSinks3;
  for (bool grid : {false, true}) {
    std::vector<float> got[2];
    for (int way = 0; way < 2; ++way) {
      std::vector<float>& run = got[way];
      auto take = [&run](const Tensor& t) { run.insert(run.end(), t.values().begin(), t.values().end()); };
      auto call = [&](auto&& attention) {  // the sinks as the argument (way 0) or in the masks (way 1)
        take(way == 0 ? attention.forward(q, k, v, lens, plain, kSinks3) : attention.forward(q, k, v, lens, with_sinks));
        const auto grads = attention.backward(g);
        take(grads.queries), take(grads.keys), take(grads.values);
        run.insert(run.end(), attention.sinks_grad().begin(), attention.sinks_grad().end());
      };
      if (grid) call(GridAttention(c, 1, 12, 3, ref->state_dict()));
      else call(RingAttention(c, 12, 3, ref->state_dict()));
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float))) << (grid ? "grid" : "ring");
  }
  // Both at once is refused.
  RingAttention ring(c, 12, 3, ref->state_dict());
  EXPECT_THROW(ring.forward(q, k, v, lens, with_sinks, kSinks3), Error);
}

}  // namespace
}  // namespace mha::dist::test
