// RingAttention against the single-process MultiHeadAttention: each rank's
// block of the output and of the input gradients, and the weight gradients,
// with the chapter's valid lengths (global key positions), causal masks, odd
// block sizes and ranks whose keys are all masked or that hold no position.
#include "dist_test_util.h"

namespace mha::dist::test {
namespace {

constexpr double kTol = 1e-5;

struct Split {
  int64_t q_begin, q_count, k_begin, k_count;
};
Split split(int64_t Q, int64_t K) {
  const Communicator& c = world();
  const auto [qb, qn] = RingAttention::block_of(Q, c.size(), c.rank());
  const auto [kb, kn] = RingAttention::block_of(K, c.size(), c.rank());
  return {qb, qn, kb, kn};
}

// This rank's slice of per-query lengths (B, Q), or the lengths as they are.
ValidLens local_lens(const ValidLens& lens, int64_t B, int64_t Q, const Split& s) {
  if (lens.kind() != ValidLens::Kind::PerQuery) return lens;
  std::vector<float> mine;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < s.q_count; ++i) mine.push_back(lens.values()[static_cast<size_t>(b * Q + s.q_begin + i)]);
  return ValidLens::per_query(B, s.q_count, mine);
}

struct Run {
  int64_t B, Q, K;
  ValidLens lens;
  Causal causal = Causal::None;
  FullyMaskedRows fully = FullyMaskedRows::Uniform;
  bool backward = false;
  Window window = {};
};

void check(const Run& run, int64_t num_hiddens, int64_t num_heads, bool bias, uint64_t seed) {
  const Communicator& c = world();
  auto ref = reference_module(num_hiddens, num_heads, bias, 7, 6, 5, seed);
  RingAttention ring(c, num_hiddens, num_heads, ref->state_dict());
  ring.keep_attention_weights(true);
  const Tensor q = randn({run.B, run.Q, 7}, seed + 1), k = randn({run.B, run.K, 6}, seed + 2),
               v = randn({run.B, run.K, 5}, seed + 3);
  CallMasks masks;
  masks.causal = run.causal;
  masks.fully_masked_rows = run.fully;
  masks.window = run.window;
  if (run.backward) ref->train();
  const bool masked = run.causal != Causal::None || run.window.any();
  const Tensor want = masked ? ref->forward(q, k, v, run.lens, masks) : ref->forward(q, k, v, run.lens);
  const Split s = split(run.Q, run.K);
  const Tensor xq = rows(q, s.q_begin, s.q_count), xk = rows(k, s.k_begin, s.k_count),
               xv = rows(v, s.k_begin, s.k_count);
  const ValidLens lens = local_lens(run.lens, run.B, run.Q, s);
  const Tensor got = run.window.any() ? ring.forward(xq, xk, xv, lens, masks)
                                      : ring.forward(xq, xk, xv, lens, run.causal, run.fully);
  EXPECT_LT(relative_error(got, rows(want, s.q_begin, s.q_count)), kTol)
      << "B" << run.B << " Q" << run.Q << " K" << run.K << " rank " << c.rank();
  EXPECT_LT(relative_error(ring.attention_weights(), query_rows(ref->attention_weights(), s.q_begin, s.q_count)), kTol)
      << "attention weights, rank " << c.rank();
  if (!run.backward) return;
  const Tensor grad_out = randn({run.B, run.Q, num_hiddens}, seed + 4);
  const auto gw = ref->backward(grad_out);
  const auto gg = ring.backward(rows(grad_out, s.q_begin, s.q_count));
  EXPECT_LT(relative_error(gg.queries, rows(gw.queries, s.q_begin, s.q_count)), kTol) << "dX_q rank " << c.rank();
  EXPECT_LT(relative_error(gg.keys, rows(gw.keys, s.k_begin, s.k_count)), kTol) << "dX_k rank " << c.rank();
  EXPECT_LT(relative_error(gg.values, rows(gw.values, s.k_begin, s.k_count)), kTol) << "dX_v rank " << c.rank();
  ASSERT_EQ(ring.grads().size(), ref->grads().size());
  // Relative to the largest gradient of the module: W_k.bias's is 0 up to rounding.
  double largest = 0;
  for (const auto& [name, g] : ref->grads())
    for (float x : g.values()) largest = std::max(largest, static_cast<double>(std::fabs(x)));
  for (const auto& [name, g] : ref->grads())
    EXPECT_LT(relative_error(ring.grads().at(name), g, name == "W_k.bias" ? largest : 0.0), kTol) << name;
}

TEST(RingAttention, BlockOfSplitsEveryPositionOnce) {
  for (int64_t n : {0, 1, 3, 7, 9})
    for (int size : {1, 2, 4, 5}) {
      int64_t next = 0;
      for (int r = 0; r < size; ++r) {
        const auto [begin, count] = RingAttention::block_of(n, size, r);
        EXPECT_EQ(begin, next);
        EXPECT_GE(count, n / size);
        EXPECT_LE(count, n / size + 1);
        next = begin + count;
      }
      EXPECT_EQ(next, n);
    }
}

TEST(RingAttention, ForwardEqualsTheModuleWithTheChaptersLengths) {
  // Row 0 sees 4 of 9 keys: the later ranks' keys are all masked for it
  // (-1e6); row 1 has length 0 (uniform weights over all 9 keys).
  check({2, 7, 9, ValidLens()}, 12, 3, true, 50);
  check({2, 7, 9, ValidLens::per_batch({4, 0})}, 12, 3, true, 51);
  check({2, 5, 9, ValidLens::per_query(2, 5, {1, 9, 2.5f, 0, 7, 3, 3, 8, 1.5f, 4})}, 8, 2, false, 52);
  // Odd and tiny: under -np 4 a rank holds no query and no key.
  check({1, 3, 3, ValidLens::per_batch({2})}, 6, 1, true, 53);
  check({3, 1, 2, ValidLens::per_batch({1, 0, 2})}, 8, 4, false, 54);
  // Per-query lengths with a rank that holds no query (its slice is (B, 0)).
  check({2, 3, 5, ValidLens::per_query(2, 3, {2, 0, 5, 1.5f, 4, 3})}, 8, 2, true, 55);
}

TEST(RingAttention, ForwardEqualsTheModuleWithCausalMasks) {
  check({2, 6, 6, ValidLens(), Causal::TopLeft}, 12, 3, true, 60);
  check({2, 4, 7, ValidLens::per_batch({5, 3}), Causal::BottomRight}, 12, 3, true, 61);
  // Length 0 under a causal mask: every key masked, the row gets the policy.
  check({2, 5, 5, ValidLens::per_batch({0, 3}), Causal::TopLeft, FullyMaskedRows::Uniform}, 8, 2, true, 62);
  check({2, 5, 5, ValidLens::per_batch({0, 3}), Causal::TopLeft, FullyMaskedRows::Zeros}, 8, 2, true, 63);
}

TEST(RingAttention, SlidingWindowsOverGlobalPositionsEqualTheModule) {
  // Windows narrower than a rank's block (whole blocks skipped), wider than
  // the sequence, of width 0, one-sided, with causal masks, lengths, Q != K
  // and fully masked rows; forward, weights and every gradient.
  const ValidLens none;
  check({2, 9, 9, none, Causal::None, FullyMaskedRows::Uniform, true, {2, 0}}, 12, 3, true, 80);
  check({2, 9, 9, none, Causal::BottomRight, FullyMaskedRows::Zeros, true, {1, 3}}, 12, 3, true, 81);
  check({2, 6, 11, ValidLens::per_batch({9, 4}), Causal::None, FullyMaskedRows::Zeros, true, {3, 1}}, 8, 2, true, 82);
  check({1, 11, 6, none, Causal::TopLeft, FullyMaskedRows::Uniform, true, {0, 0}}, 8, 2, false, 83);
  check({2, 8, 8, none, Causal::None, FullyMaskedRows::Uniform, true, {-1, 2}}, 12, 3, true, 84);
  check({2, 8, 8, none, Causal::None, FullyMaskedRows::Zeros, true, {50, 50}}, 12, 3, true, 85);
  // Lengths leave rows with no key inside their window: the policy's rows.
  check({2, 7, 7, ValidLens::per_query(2, 7, {0, 1, 1, 5, 7, 7, 2, 7, 6, 5, 4, 3, 2, 1}), Causal::None,
         FullyMaskedRows::Uniform, true, {1, 0}},
        8, 2, true, 86);
  check({2, 7, 7, ValidLens::per_batch({3, 7}), Causal::None, FullyMaskedRows::Zeros, true, {0, 0}}, 8, 2, true, 87);
}

TEST(RingAttention, WindowSkipsTheBlocksOutsideIt) {
  const Communicator& c = world();
  if (c.size() < 2) GTEST_SKIP() << "one rank holds the whole sequence";
  auto ref = reference_module(12, 3, true, 7, 6, 5, 88);
  RingAttention ring(c, 12, 3, ref->state_dict());
  const int64_t L = 16 * c.size();
  const Split s = split(L, L);
  const Tensor q = rows(randn({1, L, 7}, 89), s.q_begin, s.q_count), k = rows(randn({1, L, 6}, 90), s.k_begin, s.k_count),
               v = rows(randn({1, L, 5}, 91), s.k_begin, s.k_count);
  CallMasks masks;
  masks.window = {3, 0};  // each query sees its block and at most 3 keys of the one before
  ring.forward(q, k, v, {}, masks);
  EXPECT_EQ(ring.stats().tiles, c.size());
  EXPECT_EQ(ring.stats().tiles_skipped, c.size() - (c.rank() == 0 ? 1 : 2)) << "rank " << c.rank();
}

TEST(RingAttention, RefusesPairAndKeyMasks) {
  const Communicator& c = world();
  auto ref = reference_module(12, 3, true, 7, 6, 5, 92);
  RingAttention ring(c, 12, 3, ref->state_dict());
  const Tensor x = randn({1, 2, 7}, 93), y = randn({1, 2, 6}, 94), z = randn({1, 2, 5}, 95);
  CallMasks masks;
  masks.attn_mask = Mask::keep({2, 2}, {1, 1, 1, 1});
  EXPECT_THROW(ring.forward(x, y, z, {}, masks), Error);
  masks = CallMasks();
  masks.window = {-2, 0};
  EXPECT_THROW(ring.forward(x, y, z, {}, masks), Error);
}

TEST(RingAttention, BackwardEqualsTheModule) {
  check({2, 7, 9, ValidLens::per_batch({4, 0}), Causal::None, FullyMaskedRows::Uniform, true}, 12, 3, true, 70);
  check({2, 5, 6, ValidLens::per_query(2, 5, {1, 6, 2.5f, 0, 5, 3, 3, 6, 1.5f, 4}), Causal::None,
         FullyMaskedRows::Uniform, true},
        8, 2, false, 71);
  check({2, 6, 6, ValidLens::per_batch({0, 5}), Causal::TopLeft, FullyMaskedRows::Uniform, true}, 8, 2, true, 72);
  check({2, 4, 7, ValidLens(), Causal::BottomRight, FullyMaskedRows::Zeros, true}, 12, 3, true, 73);
  check({1, 3, 3, ValidLens::per_batch({2}), Causal::None, FullyMaskedRows::Uniform, true}, 6, 1, true, 74);
  // Blocks of one key (3 keys over 2 ranks): a block's single live key
  // carries only its share of the weight over every key.
  check({1, 3, 3, ValidLens(), Causal::None, FullyMaskedRows::Uniform, true}, 6, 1, true, 75);
  check({2, 5, 3, ValidLens::per_batch({3, 2.5f}), Causal::None, FullyMaskedRows::Uniform, true}, 8, 2, true, 76);
}

TEST(RingAttention, Bfloat16EqualsTheModulesBfloat16Mode) {
  // The same roundings as MultiHeadAttention::set_precision(BFloat16): the
  // products' inputs and the projected q, k, v; only float32 sums differ in
  // order (the blocks' merge), so the two agree far inside the mode's bound
  // (2e-3 of each tensor's scale, tests/python/test_bf16.py), and the
  // bfloat16 ring is really bfloat16 (far from the float32 module).
  const Communicator& c = world();
  auto ref = reference_module(16, 4, true, 7, 6, 5, 80);
  RingAttention ring(c, 16, 4, ref->state_dict());
  ring.set_precision(Precision::BFloat16);
  EXPECT_EQ(ring.precision(), Precision::BFloat16);
  const int64_t B = 2, Q = 9, K = 11;
  const Tensor q = randn({B, Q, 7}, 81), k = randn({B, K, 6}, 82), v = randn({B, K, 5}, 83);
  const ValidLens lens = ValidLens::per_batch({7, 11});
  ref->train();
  const Tensor f32 = ref->forward(q, k, v, lens);
  ref->set_precision(Precision::BFloat16);
  const Tensor want = ref->forward(q, k, v, lens);
  const Split s = split(Q, K);
  const Tensor got = ring.forward(rows(q, s.q_begin, s.q_count), rows(k, s.k_begin, s.k_count),
                                  rows(v, s.k_begin, s.k_count), lens);
  EXPECT_LT(relative_error(got, rows(want, s.q_begin, s.q_count)), 1e-4) << "rank " << c.rank();
  if (s.q_count > 0) {
    EXPECT_GT(relative_error(got, rows(f32, s.q_begin, s.q_count)), 1e-4);
  }
  const Tensor grad_out = randn({B, Q, 16}, 84);
  const auto gw = ref->backward(grad_out);
  const auto gg = ring.backward(rows(grad_out, s.q_begin, s.q_count));
  EXPECT_LT(relative_error(gg.queries, rows(gw.queries, s.q_begin, s.q_count)), 1e-3) << "rank " << c.rank();
  EXPECT_LT(relative_error(gg.keys, rows(gw.keys, s.k_begin, s.k_count)), 1e-3) << "rank " << c.rank();
  EXPECT_LT(relative_error(gg.values, rows(gw.values, s.k_begin, s.k_count)), 1e-3) << "rank " << c.rank();
  double largest = 0;  // W_k.bias's gradient is 0 up to rounding: measured against the largest
  for (const auto& [name, g] : ref->grads())
    for (float x : g.values()) largest = std::max(largest, static_cast<double>(std::fabs(x)));
  for (const auto& [name, g] : ref->grads())
    EXPECT_LT(relative_error(ring.grads().at(name), g, name == "W_k.bias" ? largest : 0.0), 1e-3) << name;
}

TEST(RingAttention, DropoutDropsWhatOneProcessDrops) {
  // MultiHeadAttention(16, 4, p, bias, seed) in training mode and a ring with
  // set_dropout(p, seed) draw the same key per call and key each weight's
  // mask by its place in the whole sequence: the same outputs and gradients
  // (to float32 sums), call after call; with lengths, causal masks and rows
  // with no live key (their uniform weights dropped too).
  const Communicator& c = world();
  for (const Causal causal : {Causal::None, Causal::BottomRight}) {
    auto base = reference_module(16, 4, true, 7, 6, 5, 90);
    MultiHeadAttention ref(16, 4, 0.3f, true, /*seed=*/91);
    ref.load_state_dict(base->state_dict());
    ref.train();
    RingAttention ring(c, 16, 4, ref.state_dict());
    ring.set_dropout(0.3f, 91);
    EXPECT_EQ(ring.dropout(), 0.3f);
    const int64_t B = 2, Q = 9, K = 7;
    const Tensor q = randn({B, Q, 7}, 92), k = randn({B, K, 6}, 93), v = randn({B, K, 5}, 94);
    const ValidLens lens = ValidLens::per_batch({5, 0});
    CallMasks masks;
    masks.causal = causal;
    const Split s = split(Q, K);
    Tensor dropped;
    for (int call = 0; call < 2; ++call) {  // the second call draws the stream's next key
      const Tensor want = causal == Causal::None ? ref.forward(q, k, v, lens) : ref.forward(q, k, v, lens, masks);
      const Tensor got = ring.forward(rows(q, s.q_begin, s.q_count), rows(k, s.k_begin, s.k_count),
                                      rows(v, s.k_begin, s.k_count), lens, causal);
      EXPECT_LT(relative_error(got, rows(want, s.q_begin, s.q_count)), kTol) << "call " << call << " rank " << c.rank();
      dropped = got;
      const Tensor grad_out = randn({B, Q, 16}, 95 + static_cast<uint64_t>(call));
      const auto gw = ref.backward(grad_out);
      const auto gg = ring.backward(rows(grad_out, s.q_begin, s.q_count));
      EXPECT_LT(relative_error(gg.queries, rows(gw.queries, s.q_begin, s.q_count)), kTol) << "rank " << c.rank();
      EXPECT_LT(relative_error(gg.keys, rows(gw.keys, s.k_begin, s.k_count)), kTol) << "rank " << c.rank();
      EXPECT_LT(relative_error(gg.values, rows(gw.values, s.k_begin, s.k_count)), kTol) << "rank " << c.rank();
    }
    double largest = 0;
    for (const auto& [name, g] : ref.grads())
      for (float x : g.values()) largest = std::max(largest, static_cast<double>(std::fabs(x)));
    for (const auto& [name, g] : ref.grads())
      EXPECT_LT(relative_error(ring.grads().at(name), g, name == "W_k.bias" ? largest : 0.0), kTol) << name;
    // Without dropout the outputs differ: the masks did something.
    ring.set_dropout(0.0f, 91);
    const Tensor plain = ring.forward(rows(q, s.q_begin, s.q_count), rows(k, s.k_begin, s.k_count),
                                      rows(v, s.k_begin, s.k_count), lens, causal);
    ring.eval();
    ring.set_dropout(0.3f, 91);
    const Tensor eval = ring.forward(rows(q, s.q_begin, s.q_count), rows(k, s.k_begin, s.k_count),
                                     rows(v, s.k_begin, s.k_count), lens, causal);
    EXPECT_EQ(relative_error(eval, plain), 0.0) << "evaluation mode drops nothing";
    if (s.q_count > 0) {
      EXPECT_GT(relative_error(dropped, plain), 1e-3) << "the masks dropped nothing";
    }
  }
}

TEST(RingAttention, BackwardWithBlocksTooLargeToSendEagerly) {
  // Blocks of 2 x 2 x 65 x 16 floats (16 KiB and more): MPI sends them by
  // rendezvous, so a send completes only once its receive is posted; a ring
  // that waits for its sends at the wrong moment deadlocks here (not with
  // the small blocks above).
  check({2, 130, 260, ValidLens::per_batch({200, 7}), Causal::None, FullyMaskedRows::Uniform, true}, 16, 2, true, 75);
}

TEST(RingAttention, GradientsAccumulateAndZero) {
  const Communicator& c = world();
  auto ref = reference_module(8, 2, true, 7, 6, 5, 80);
  RingAttention ring(c, 8, 2, ref->state_dict());
  const Split s = split(5, 5);
  const Tensor q = rows(randn({1, 5, 7}, 81), s.q_begin, s.q_count), k = rows(randn({1, 5, 6}, 82), s.k_begin, s.k_count),
               v = rows(randn({1, 5, 5}, 83), s.k_begin, s.k_count);
  const Tensor g = Tensor({1, s.q_count, 8}, 1.0f);
  ring.forward(q, k, v);
  ring.backward(g);
  const Tensor once = ring.grads().at("W_q.weight");
  ring.forward(q, k, v);
  ring.backward(g);
  const Tensor twice = ring.grads().at("W_q.weight");
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(twice.data()[i], 2 * once.data()[i], 1e-5f * (1 + std::fabs(once.data()[i])));
  ring.zero_grad();
  for (const auto& [name, t] : ring.grads())
    for (float x : t.values()) EXPECT_EQ(x, 0.0f) << name;
}

TEST(RingAttention, EvaluationModeKeepsNothingForABackward) {
  const Communicator& c = world();
  auto ref = reference_module(8, 2, true, 7, 6, 5, 85);
  RingAttention ring(c, 8, 2, ref->state_dict());
  const Split s = split(5, 5);
  const Tensor q = rows(randn({1, 5, 7}, 86), s.q_begin, s.q_count), k = rows(randn({1, 5, 6}, 87), s.k_begin, s.k_count),
               v = rows(randn({1, 5, 5}, 88), s.k_begin, s.k_count);
  const Tensor trained = ring.forward(q, k, v);
  const uint64_t training_bytes = ring.stats().planned_bytes;
  ring.eval();
  EXPECT_TRUE(bitwise_equal(ring.forward(q, k, v), trained));
  // The inputs are no longer kept: B * (Q_r * 7 + K_r * (6 + 5)) floats less.
  EXPECT_EQ(training_bytes - ring.stats().planned_bytes, static_cast<uint64_t>(4 * (s.q_count * 7 + s.k_count * 11)));
  EXPECT_THROW(ring.backward(Tensor({1, s.q_count, 8})), Error);
  ring.train();
  ring.forward(q, k, v);
  EXPECT_NO_THROW(ring.backward(Tensor({1, s.q_count, 8})));
}

// The tiles rank `rank` skips in one batch row: key blocks whose first key
// (global position) is masked for every query of the rank, when each query
// has key 0 live. One tile per block here (fewer than 256 queries per rank).
int64_t expected_skips(int64_t Q, int64_t K, float length, Causal causal) {
  const Communicator& c = world();
  const Split s = split(Q, K);
  if (s.q_count == 0 || !(length > 0)) return 0;
  int64_t skips = 0;
  for (int o = 0; o < c.size(); ++o) {
    const auto [k0, kn] = RingAttention::block_of(K, c.size(), o);
    if (kn == 0) continue;
    bool all = true;
    for (int64_t i = s.q_begin; i < s.q_begin + s.q_count; ++i) {
      const int64_t last = causal == Causal::TopLeft ? i : K - 1;
      all = all && (static_cast<float>(k0) >= length || k0 > last);
    }
    skips += all ? 1 : 0;
  }
  return skips;
}

TEST(RingAttention, SkipsMaskedBlocksWithTheSameResults) {
  const Communicator& c = world();
  // Causal over 8 positions: rank r's queries see no key of a later rank's block.
  check({2, 8, 8, ValidLens(), Causal::TopLeft}, 12, 3, true, 90);
  check({2, 8, 8, ValidLens(), Causal::TopLeft, FullyMaskedRows::Uniform, true}, 12, 3, true, 91);
  // Row 0 sees 3 keys of 8, row 1 all (the chapter's -1e6 fill, no causal mask).
  check({2, 8, 8, ValidLens::per_batch({3, 8}), Causal::None, FullyMaskedRows::Uniform, true}, 12, 3, true, 92);
  // Row 0 of length 0 sees every key (uniform): its blocks are never skipped.
  check({2, 8, 8, ValidLens::per_batch({0, 2}), Causal::None, FullyMaskedRows::Uniform, true}, 12, 3, true, 93);

  auto ref = reference_module(12, 3, true, 7, 6, 5, 94);
  RingAttention ring(c, 12, 3, ref->state_dict());
  const Split s = split(8, 8);
  const Tensor q = rows(randn({2, 8, 7}, 95), s.q_begin, s.q_count), k = rows(randn({2, 8, 6}, 96), s.k_begin, s.k_count),
               v = rows(randn({2, 8, 5}, 97), s.k_begin, s.k_count);
  const int64_t blocks = s.q_count > 0 ? 2 * c.size() : 0;  // a tile per (batch row, key block)
  ring.forward(q, k, v, {}, Causal::TopLeft);
  EXPECT_EQ(ring.stats().tiles, blocks);
  EXPECT_EQ(ring.stats().tiles_skipped, 2 * expected_skips(8, 8, INFINITY, Causal::TopLeft)) << "rank " << c.rank();
  if (c.size() > 1 && c.rank() == 0) {
    EXPECT_EQ(ring.stats().tiles_skipped, 2 * (c.size() - 1));
  }
  ring.forward(q, k, v, ValidLens::per_batch({3, 8}));
  EXPECT_EQ(ring.stats().tiles_skipped, expected_skips(8, 8, 3, Causal::None)) << "rank " << c.rank();
  ring.forward(q, k, v, ValidLens::per_batch({0, 2}));
  EXPECT_EQ(ring.stats().tiles_skipped, expected_skips(8, 8, 2, Causal::None)) << "rank " << c.rank();
  ring.forward(q, k, v);
  EXPECT_EQ(ring.stats().tiles_skipped, 0);
}

// Restores the memory limit when a test ends, even a failed one.
struct MemoryLimitGuard {
  uint64_t saved = memory_limit();
  ~MemoryLimitGuard() { set_memory_limit(saved); }
};

TEST(RingAttention, RunsASequenceTooLongForOneProcesssMemoryLimit) {
  const Communicator& c = world();
  if (c.size() < 2) GTEST_SKIP() << "needs 2 ranks or more";
  MemoryLimitGuard guard;
  const int64_t L = 512, D = 256, H = 4;
  auto ref = reference_module(D, H, false, 7, 6, 5, 100);
  RingAttention ring(c, D, H, ref->state_dict());
  ring.eval();  // as the module: nothing kept for a backward
  const Split s = split(L, L);
  const Tensor q = randn({1, L, 7}, 101), k = randn({1, L, 6}, 102), v = randn({1, L, 5}, 103);
  const Tensor qr = rows(q, s.q_begin, s.q_count), kr = rows(k, s.k_begin, s.k_count), vr = rows(v, s.k_begin, s.k_count);
  ring.forward(qr, kr, vr);
  // The limit: the most any rank's share plans (the same limit on every rank).
  const std::vector<int64_t> planned = c.all_gather(static_cast<int64_t>(ring.stats().planned_bytes));
  const uint64_t limit = static_cast<uint64_t>(*std::max_element(planned.begin(), planned.end()));
  const Tensor want = ref->forward(q, k, v);
  set_memory_limit(limit);
  try {
    ref->forward(q, k, v);
    ADD_FAILURE() << "the single-process module ran within " << limit << " bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("above the memory limit of " + std::to_string(limit)), std::string::npos)
        << e.what();
  }
  const Tensor got = ring.forward(qr, kr, vr);
  EXPECT_LT(relative_error(got, rows(want, s.q_begin, s.q_count)), kTol);
  // One byte less and the ring refuses too, on every rank (the others name the failing ones).
  set_memory_limit(limit - 1);
  EXPECT_THROW(ring.forward(qr, kr, vr), Error);
}

TEST(RingAttention, SameRanksGiveBitwiseTheSameResults) {
  const Communicator& c = world();
  auto ref = reference_module(12, 3, true, 7, 6, 5, 110);
  const Split s = split(600, 520);  // more than one tile of queries per rank under -np 2
  const Tensor q = rows(randn({2, 600, 7}, 111), s.q_begin, s.q_count),
               k = rows(randn({2, 520, 6}, 112), s.k_begin, s.k_count),
               v = rows(randn({2, 520, 5}, 113), s.k_begin, s.k_count),
               g = randn({2, s.q_count, 12}, 114 + static_cast<uint64_t>(c.rank()));
  const ValidLens lens = ValidLens::per_batch({300, 520});
  std::vector<Tensor> results[2];
  for (auto& result : results) {
    RingAttention ring(c, 12, 3, ref->state_dict());
    result.push_back(ring.forward(q, k, v, lens, Causal::TopLeft));
    const auto grads = ring.backward(g);
    result.push_back(grads.queries);
    result.push_back(grads.keys);
    result.push_back(grads.values);
    for (const auto& [name, t] : ring.grads()) result.push_back(t);
  }
  for (size_t i = 0; i < results[0].size(); ++i)
    EXPECT_TRUE(bitwise_equal(results[0][i], results[1][i])) << "result " << i << " rank " << c.rank();
}

}  // namespace
}  // namespace mha::dist::test
