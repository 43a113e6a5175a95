// kernels::RingRows (src/kernels/ring_rows.h), the compute of
// mha.torch.distributed's ring: P "ranks" in one process, each its query
// rows (contiguous blocks, uneven, or zigzag pieces) over every rank's
// key/value block in ring order, forward then backward, against ONE fused
// kernel call over the whole sequence with the same masks (lengths over
// global keys, causal top left, a key keep mask, the chapter's -1e6 fill or
// -inf with zeros for fully masked rows, dropout keyed by global position):
// output, dQ, and dK, dV summed over the ranks, within 2e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "kernels/ring_rows.h"

namespace mha::kernels {
namespace {

struct RingCase {
  int64_t B, H, d, L;
  int P;
  bool zigzag, causal, lens, keep, seed_fill;
  float dropout;
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
    for (int64_t b = 0; b < B; ++b) lens.push_back(b == 0 ? 0.0f : static_cast<float>(len(gen)));  // row 0: none
  }
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
  if (c.lens) f.length_kind = LengthKind::PerBatch, f.lens = lens.data();
  f.masks.causal = c.causal ? Causal::TopLeft : Causal::None;
  if (c.keep) f.masks.key_keep = keep.data();
  f.masks.fill = fill;
  f.masks.fully_masked = fully;
  f.stats = {stats.data(), stats.data() + B * H * L};
  const SoftmaxStats kept = attention_forward(AttentionKernel::Fused, f);
  std::vector<float> gq(q.size()), gk(q.size()), gv(q.size());
  AttentionBackward bw;
  bw.fwd = f;
  bw.fwd.stats = kept;
  bw.grad_out = heads(gout, B, H, L, d);
  bw.grad_q = heads(gq, B, H, L, d), bw.grad_k = heads(gk, B, H, L, d), bw.grad_v = heads(gv, B, H, L, d);
  attention_backward(AttentionKernel::Fused, bw);

  // The ring.
  const std::vector<std::vector<Piece>> pieces = pieces_of(c);
  std::vector<float> ring_gk(q.size(), 0.0f), ring_gv(q.size(), 0.0f);
  for (int r = 0; r < c.P; ++r) {
    RingRowsSpec s;
    s.B = B, s.H = H, s.d = d, s.Q = L, s.K = L;
    s.q_pieces = pieces[static_cast<size_t>(r)];
    s.lens = lens;
    s.causal = c.causal;
    s.key_keep = c.keep ? keep.data() : nullptr;
    s.fill = fill;
    s.fully_masked = fully;
    s.dropout = dropout;
    s.scale_divisor = f.scale_divisor;
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
    const std::vector<float>& dq = rows.grad_q();
    for (size_t e = 0; e < dq.size(); ++e) ASSERT_NEAR(dq[e], want_dq[e], 2e-5f) << "dq, rank " << r << " at " << e;
  }
  for (size_t e = 0; e < gk.size(); ++e) {
    ASSERT_NEAR(ring_gk[e], gk[e], 2e-5f) << "dk at " << e;
    ASSERT_NEAR(ring_gv[e], gv[e], 2e-5f) << "dv at " << e;
  }
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

}  // namespace
}  // namespace mha::kernels
