// nn::RingRows (src/nn/ring_rows.h), the compute of both rings (MPI's and
// mha.torch.distributed's): P "ranks" in one process, each its query rows
// (contiguous blocks, uneven, or zigzag pieces) over every rank's key/value
// block in ring order, forward then backward, against ONE fused kernel call
// over the whole sequence with the same masks and options (lengths per row
// or per query over global keys, causal top left, a key keep mask, a window,
// softcap, ALiBi, sinks, packed documents, the chapter's -1e6 fill or -inf
// with zeros for fully masked rows, dropout keyed by global position):
// output, weights, dQ, dK, dV and d sinks summed over the ranks, within 2e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "nn/ring_rows.h"

namespace mha::nn {
using namespace mha::kernels;
namespace {

struct RingCase {
  int64_t B, H, d, L;
  int P;
  bool zigzag, causal, lens, keep, seed_fill;
  float dropout;
  // Beyond the torch ring's first options (the MPI ring's): per-query
  // lengths, a window, softcap, ALiBi, sinks, documents (B = 1), weights.
  bool per_query = false;
  Window window = {};
  float softcap = 0.0f;
  bool alibi = false, sinks = false, docs = false, weights = false;
};

// rows [B, L, H*d] as (B, H, L, d)
TensorView heads(std::vector<float>& x, int64_t B, int64_t H, int64_t L, int64_t d) {
  TensorView v;
  v.data = x.data();
  v.rank = 4;
  v.shape[0] = B, v.shape[1] = H, v.shape[2] = L, v.shape[3] = d;
  v.stride[0] = L * H * d, v.stride[1] = d, v.stride[2] = H * d, v.stride[3] = 1;
  return v;
}

std::vector<std::vector<Piece>> pieces_of(const RingCase& c) {
  std::vector<std::vector<Piece>> out(static_cast<size_t>(c.P));
  if (c.zigzag) {
    const int64_t n = c.L / (2 * c.P);
    for (int r = 0; r < c.P; ++r) out[static_cast<size_t>(r)] = {{r * n, n}, {(2 * c.P - 1 - r) * n, n}};
    return out;
  }
  int64_t at = 0;
  for (int r = 0; r < c.P; ++r) {  // uneven: the first L % P ranks get one more
    const int64_t n = c.L / c.P + (r < c.L % c.P ? 1 : 0);
    out[static_cast<size_t>(r)] = {{at, n}};
    at += n;
  }
  return out;
}

// The rows of x [B, L, Hd] at the pieces' positions, [B, n, Hd].
std::vector<float> gather(const std::vector<float>& x, int64_t B, int64_t L, int64_t Hd,
                          const std::vector<Piece>& pieces) {
  int64_t n = 0;
  for (const Piece& p : pieces) n += p.size;
  std::vector<float> out(static_cast<size_t>(B * n * Hd));
  for (int64_t b = 0; b < B; ++b) {
    int64_t row = 0;
    for (const Piece& p : pieces)
      for (int64_t i = 0; i < p.size; ++i, ++row)
        std::copy_n(x.data() + (b * L + p.begin + i) * Hd, Hd, out.data() + (b * n + row) * Hd);
  }
  return out;
}

// Adds rows [B, n, Hd] back at the pieces' positions of x [B, L, Hd].
void scatter_add(std::vector<float>& x, const float* rows, int64_t B, int64_t L, int64_t Hd,
                 const std::vector<Piece>& pieces) {
  int64_t n = 0;
  for (const Piece& p : pieces) n += p.size;
  for (int64_t b = 0; b < B; ++b) {
    int64_t row = 0;
    for (const Piece& p : pieces)
      for (int64_t i = 0; i < p.size; ++i, ++row)
        for (int64_t x0 = 0; x0 < Hd; ++x0) x[(b * L + p.begin + i) * Hd + x0] += rows[(b * n + row) * Hd + x0];
  }
}

void run_case(const RingCase& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B" << c.B << " H" << c.H << " d" << c.d << " L" << c.L << " P" << c.P
                                    << " zigzag " << c.zigzag << " causal " << c.causal << " lens " << c.lens
                                    << " keep " << c.keep << " seed_fill " << c.seed_fill << " dropout "
                                    << c.dropout);
  const int64_t B = c.B, H = c.H, d = c.d, L = c.L, Hd = H * d;
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = normal(gen);
    return x;
  };
  std::vector<float> q = random(B * L * Hd), k = random(B * L * Hd), v = random(B * L * Hd);
  std::vector<float> gout = random(B * L * Hd);
  std::vector<float> lens;
  if (c.lens) {
    std::uniform_int_distribution<int64_t> len(0, L);
    for (int64_t b = 0; b < (c.per_query ? B * L : B); ++b)
      lens.push_back(b == 0 ? 0.0f : static_cast<float>(len(gen)));  // the first row (or query): none
  }
  std::vector<float> slopes, sinks;
  for (int64_t h = 0; h < H && c.alibi; ++h) slopes.push_back(0.5f / static_cast<float>(h + 1));
  for (int64_t h = 0; h < H && c.sinks; ++h) sinks.push_back(normal(gen));
  std::vector<int64_t> docs;
  if (c.docs) docs = {0, L / 3, L / 3, L / 2 + 1, L};  // an empty document too
  std::vector<uint8_t> keep;
  if (c.keep) {
    std::bernoulli_distribution on(0.7);
    for (int64_t e = 0; e < B * L; ++e) keep.push_back(on(gen) ? 1 : 0);
    std::fill(keep.begin() + (B - 1) * L, keep.end(), uint8_t{0});  // the last row: every key masked
  }
  const Dropout dropout{c.dropout, 0x5eedull};
  const FullyMaskedRows fully = c.seed_fill ? FullyMaskedRows::Uniform : FullyMaskedRows::Zeros;
  const MaskFill fill = c.seed_fill ? MaskFill::Seed : MaskFill::NegInf;

  // One call over the whole sequence.
  std::vector<float> out(q.size()), stats(static_cast<size_t>(2 * B * H * L));
  AttentionForward f;
  f.q = heads(q, B, H, L, d), f.k = heads(k, B, H, L, d), f.v = heads(v, B, H, L, d);
  f.out = heads(out, B, H, L, d);
  f.scale_divisor = std::sqrt(static_cast<float>(d));
  f.dropout = dropout;
  if (c.lens) f.length_kind = c.per_query ? LengthKind::PerQuery : LengthKind::PerBatch, f.lens = lens.data();
  f.masks.causal = c.causal ? Causal::TopLeft : Causal::None;
  if (c.keep) f.masks.key_keep = keep.data();
  f.masks.window_left = c.window.left, f.masks.window_right = c.window.right;
  f.masks.softcap = c.softcap;
  f.masks.alibi_slopes = c.alibi ? slopes.data() : nullptr;
  f.masks.sinks = c.sinks ? sinks.data() : nullptr;
  if (c.docs) f.masks.doc_offsets = docs.data(), f.masks.documents = static_cast<int64_t>(docs.size()) - 1;
  f.masks.fill = fill;
  f.masks.fully_masked = fully;
  f.stats = {stats.data(), stats.data() + B * H * L};
  std::vector<float> weights(c.weights ? static_cast<size_t>(B * H * L * L) : 0);
  f.weights = c.weights ? weights.data() : nullptr;
  const SoftmaxStats kept = attention_forward(AttentionKernel::Fused, f);
  f.weights = nullptr;
  std::vector<float> gq(q.size()), gk(q.size()), gv(q.size()), gsinks(static_cast<size_t>(H));
  AttentionBackward bw;
  bw.fwd = f;
  bw.fwd.stats = kept;
  bw.grad_out = heads(gout, B, H, L, d);
  bw.grad_q = heads(gq, B, H, L, d), bw.grad_k = heads(gk, B, H, L, d), bw.grad_v = heads(gv, B, H, L, d);
  if (c.sinks) bw.grad_sinks = gsinks.data();
  attention_backward(AttentionKernel::Fused, bw);
  std::vector<double> ring_gsinks(static_cast<size_t>(H), 0.0);

  // The ring.
  const std::vector<std::vector<Piece>> pieces = pieces_of(c);
  std::vector<float> ring_gk(q.size(), 0.0f), ring_gv(q.size(), 0.0f);
  for (int r = 0; r < c.P; ++r) {
    RingRowsSpec s;
    s.B = B, s.H = H, s.d = d, s.Q = L, s.K = L;
    s.q_pieces = pieces[static_cast<size_t>(r)];
    int64_t Qr = 0;
    for (const Piece& p : s.q_pieces) Qr += p.size;
    if (c.lens && c.per_query) {  // this rank's queries' lengths
      std::vector<float> mine;
      for (int64_t b = 0; b < B; ++b)
        for (const Piece& p : s.q_pieces) mine.insert(mine.end(), lens.begin() + b * L + p.begin, lens.begin() + b * L + p.begin + p.size);
      s.lens = ValidLens::per_query(B, Qr, mine);
    } else if (c.lens) {
      s.lens = ValidLens::per_batch(lens);
    }
    s.masks.causal = c.causal ? Causal::TopLeft : Causal::None;
    if (c.keep) s.masks.key_padding_mask = Mask::keep({B, L}, keep);
    s.masks.window = c.window;
    s.masks.scores = {c.softcap, slopes, sinks};
    s.masks.fully_masked_rows = fully;
    s.doc_offsets = docs;
    s.fill = fill;
    s.dropout = dropout;
    s.scale_divisor = f.scale_divisor;
    std::vector<float> ring_w(c.weights ? static_cast<size_t>(B * H * Qr * L) : 0, 0.0f);
    s.weights = c.weights ? ring_w.data() : nullptr;
    RingRows rows(s);
    const std::vector<float> qr = gather(q, B, L, Hd, s.q_pieces);
    rows.begin_forward(qr.data());
    for (int step = 0; step < c.P; ++step) {
      const std::vector<Piece>& kp = pieces[static_cast<size_t>((r - step + c.P) % c.P)];
      const std::vector<float> kb = gather(k, B, L, Hd, kp), vb = gather(v, B, L, Hd, kp);
      rows.add_block(kb.data(), vb.data(), kp);
    }
    std::vector<float> mine(qr.size());
    rows.finish(mine.data());
    const std::vector<float> want = gather(out, B, L, Hd, s.q_pieces);
    for (size_t e = 0; e < mine.size(); ++e) ASSERT_NEAR(mine[e], want[e], 2e-5f) << "output, rank " << r << " at " << e;
    for (int64_t bh = 0; bh < B * H && c.weights; ++bh) {  // this rank's rows of every (batch row, head)
      int64_t row = 0;
      for (const Piece& p : s.q_pieces)
        for (int64_t i = p.begin; i < p.begin + p.size; ++i, ++row)
          for (int64_t j = 0; j < L; ++j)
            ASSERT_NEAR(ring_w[static_cast<size_t>((bh * Qr + row) * L + j)],
                        weights[static_cast<size_t>((bh * L + i) * L + j)], 2e-5f)
                << "weights, rank " << r << " (b*H+h) " << bh << " query " << i << " key " << j;
    }

    const std::vector<float> gr = gather(gout, B, L, Hd, s.q_pieces);
    rows.begin_backward(mine.data(), gr.data());
    for (int step = 0; step < c.P; ++step) {
      const std::vector<Piece>& kp = pieces[static_cast<size_t>((r - step + c.P) % c.P)];
      const std::vector<float> kb = gather(k, B, L, Hd, kp), vb = gather(v, B, L, Hd, kp);
      std::vector<float> dk(kb.size()), dv(kb.size());
      rows.backward_block(kb.data(), vb.data(), kp, dk.data(), dv.data());
      scatter_add(ring_gk, dk.data(), B, L, Hd, kp);
      scatter_add(ring_gv, dv.data(), B, L, Hd, kp);
    }
    const std::vector<float> want_dq = gather(gq, B, L, Hd, s.q_pieces);
    const std::vector<double> share = rows.sinks_grad_share();
    for (int64_t h = 0; h < H; ++h) ring_gsinks[static_cast<size_t>(h)] += share[static_cast<size_t>(h)];
    const std::vector<float>& dq = rows.grad_q();
    for (size_t e = 0; e < dq.size(); ++e) ASSERT_NEAR(dq[e], want_dq[e], 2e-5f) << "dq, rank " << r << " at " << e;
  }
  for (size_t e = 0; e < gk.size(); ++e) {
    ASSERT_NEAR(ring_gk[e], gk[e], 2e-5f) << "dk at " << e;
    ASSERT_NEAR(ring_gv[e], gv[e], 2e-5f) << "dv at " << e;
  }
  for (int64_t h = 0; h < H; ++h)
    EXPECT_NEAR(ring_gsinks[static_cast<size_t>(h)], gsinks[static_cast<size_t>(h)], 1e-4) << "d sinks, head " << h;
}

TEST(RingRows, EqualsOneCallOverTheWholeSequence) {
  uint64_t seed = 1;
  for (int P : {1, 2, 3})
    for (bool zigzag : {false, true})
      for (bool causal : {false, true})
        for (bool seed_fill : {true, false}) {
          const int64_t L = zigzag ? 2 * P * 7 : 5 * P + 2;  // zigzag: 2P chunks of 7; else uneven blocks
          run_case({2, 3, 8, L, P, zigzag, causal, /*lens=*/seed_fill, /*keep=*/!seed_fill, seed_fill, 0.0f}, seed++);
          run_case({3, 2, 16, L, P, zigzag, causal, true, !seed_fill, seed_fill, 0.3f}, seed++);
        }
}

TEST(RingRows, LongerBlocksThanATile) {
  // Blocks of several of the fused kernel's tiles, causal and zigzag, with dropout.
  run_case({1, 2, 32, 4 * 160, 2, true, true, false, false, true, 0.1f}, 77);
  run_case({1, 2, 32, 3 * 170 + 1, 3, false, false, true, false, true, 0.0f}, 78);
}

TEST(RingRows, EveryScoreOptionOverGlobalPositions) {
  uint64_t seed = 100;
  for (int P : {1, 2, 3})
    for (bool zigzag : {false, true}) {
      const int64_t L = zigzag ? 2 * P * 6 : 7 * P + 1;
      RingCase c{2, 3, 8, L, P, zigzag, false, true, false, true, 0.0f};
      c.per_query = true, c.window = {3, 1}, c.weights = true;  // per-query lengths and a window, weights kept
      run_case(c, seed++);
      c = RingCase{2, 2, 8, L, P, zigzag, true, false, true, false, 0.2f};
      c.softcap = 2.5f, c.alibi = true, c.sinks = true;  // score options, causal, -inf, dropout
      run_case(c, seed++);
      c = RingCase{1, 2, 16, L, P, zigzag, false, true, false, false, 0.0f};
      c.docs = true, c.sinks = true, c.window = {4, 0}, c.weights = true;  // documents with sinks and a window
      run_case(c, seed++);
      c = RingCase{2, 2, 8, L, P, zigzag, true, true, true, true, 0.0f};
      c.window = {-1, 2}, c.softcap = 1.0f, c.alibi = true, c.weights = true;  // the chapter's fill with every mask
      run_case(c, seed++);
    }
}

}  // namespace
}  // namespace mha::nn
