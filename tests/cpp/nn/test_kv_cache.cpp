// KVCache (mha/kv_cache.h) on both modules: cached decoding against the d2l
// chapter's decoder loop (every earlier input concatenated and projected
// again at each step), and the cache's own operations and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/gemm/packed_weight.h"
#include "mha/mha.h"
#include "test_util.h"

namespace {

using namespace mha;
using mha::test::random_tensor;
using mha::test::throws_with;

// max |a - b| / max |b|: the error relative to the output's scale.
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double diff = 0.0, scale = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a.data()[i]) - b.data()[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b.data()[i])));
  }
  return diff / scale;
}

// Rows [p0, p1) of batch row b of x:[B, L, D] -> [1, p1-p0, D].
Tensor rows_of(const Tensor& x, int64_t b, int64_t p0, int64_t p1) {
  const int64_t L = x.size(1), D = x.size(2);
  Tensor out({1, p1 - p0, D});
  std::copy(x.data() + (b * L + p0) * D, x.data() + (b * L + p1) * D, out.data());
  return out;
}

// The d2l chapter's decoder state of one batch row: its inputs so far.
struct RowState {
  std::vector<float> inputs;  // [length, D]
  int64_t length = 0;
  void push(const Tensor& x) {  // x:[1, n, D]
    inputs.insert(inputs.end(), x.data(), x.data() + x.numel());
    length += x.size(1);
  }
};

// Every row's state padded to the longest, [B, Lmax, D], and the lengths.
Tensor padded(const std::vector<RowState>& rows, int64_t D, std::vector<float>* lens) {
  int64_t L = 0;
  for (const RowState& r : rows) L = std::max(L, r.length);
  Tensor out({static_cast<int64_t>(rows.size()), L, D}, 0.0f);
  lens->clear();
  for (size_t b = 0; b < rows.size(); ++b) {
    std::copy(rows[b].inputs.begin(), rows[b].inputs.end(), out.data() + static_cast<int64_t>(b) * L * D);
    lens->push_back(static_cast<float>(rows[b].length));
  }
  return out;
}

// Ragged prompts ({5, 2, 7} positions, padded to 7) prefilled in one cached
// call, each row rewound to its own length, then `steps` steps of one new
// position per row. The chapter's way: each row's state holds its inputs
// so far, and a step runs the plain module over the whole padded state with
// valid_lens = the rows' lengths (every earlier position projected again).
// Returns the largest relative error over the steps.
double textbook_vs_cached(KVCacheDtype dtype, int steps) {
  const int64_t B = 3, P = 7, D = 32;
  const std::vector<int64_t> prompt_lens = {5, 2, 7};
  MultiHeadAttention m(D, 4, 0.0f, /*bias=*/true, /*seed=*/3);
  m.eval();
  Generator gen(11);
  const Tensor prompt = random_tensor({B, P, D}, gen);
  m.initialize(D, D, D);
  KVCache cache = m.kv_cache(B, P + steps, dtype);

  const Tensor pre = m.forward(prompt, prompt, prompt, cache);
  for (int64_t b = 0; b < B; ++b) cache.truncate(b, prompt_lens[static_cast<size_t>(b)]);
  // The prefill's real positions against the chapter's causal valid lengths.
  std::vector<float> causal;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < P; ++i) causal.push_back(static_cast<float>(i + 1));
  const Tensor pre_ref = m.forward(prompt, prompt, prompt, ValidLens::per_query(B, P, causal));
  double worst = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = prompt_lens[static_cast<size_t>(b)];
    worst = std::max(worst, rel_err(rows_of(pre, b, 0, len), rows_of(pre_ref, b, 0, len)));
  }

  std::vector<RowState> state(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) state[static_cast<size_t>(b)].push(rows_of(prompt, b, 0, prompt_lens[static_cast<size_t>(b)]));
  for (int t = 0; t < steps; ++t) {
    const Tensor x = random_tensor({B, 1, D}, gen);
    for (int64_t b = 0; b < B; ++b) state[static_cast<size_t>(b)].push(rows_of(x, b, 0, 1));
    std::vector<float> lens;
    const Tensor S = padded(state, D, &lens);
    const Tensor ref = m.forward(x, S, S, ValidLens::per_batch(lens));
    const Tensor got = m.forward(x, x, x, cache);
    worst = std::max(worst, rel_err(got, ref));
  }
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(cache.length(b), prompt_lens[static_cast<size_t>(b)] + steps);
  return worst;
}

TEST(KVCache, AOneRowStepReadsTheWeightsInPlaceAndPacksNothing) {
  // A float32 step of one row goes through the engine's projections as dot
  // products (cpu/gemm/few_rows.h): no layer packs its weight for it, and
  // the step equals the chapter's call over the cached positions.
  const int64_t D = 24;
  MultiHeadAttention m(D, 3, 0.0f, /*bias=*/true, /*seed=*/5);
  m.eval();
  Generator gen(13);
  m.initialize(D, D, D);
  KVCache cache = m.kv_cache(1, 4, KVCacheDtype::Float32);
  const Tensor x0 = random_tensor({1, 1, D}, gen), x1 = random_tensor({1, 1, D}, gen);
  const int64_t before = cpu::packed_weight_count();
  m.forward(x0, x0, x0, cache);
  const Tensor got = m.forward(x1, x1, x1, cache);
  EXPECT_EQ(cpu::packed_weight_count(), before) << "a one-row step packed a weight";
  Tensor both({1, 2, D});
  std::copy(x0.data(), x0.data() + D, both.data());
  std::copy(x1.data(), x1.data() + D, both.data() + D);
  EXPECT_LE(rel_err(got, m.forward(x1, both, both)), 1e-5);
}

TEST(KVCache, CachedDecodingIsTheChaptersLoopFloat32) {
  const double err = textbook_vs_cached(KVCacheDtype::Float32, 70);
  RecordProperty("max_relative_error", std::to_string(err));
  EXPECT_LE(err, 1e-5);
}

TEST(KVCache, CachedDecodingIsTheChaptersLoopBFloat16) {
  // Keys and values rounded to 8 mantissa bits (relative 2^-9 each).
  const double err = textbook_vs_cached(KVCacheDtype::BFloat16, 70);
  EXPECT_LE(err, 2e-2);
  EXPECT_GT(err, 0.0);  // the rounding is real: a bf16 cache is not the f32 one
}

// nn.MultiheadAttention's drop-in with grouped heads (4 query heads, 2
// key/value heads) in either layout: cached steps against the plain module
// over each row's concatenated inputs.
void drop_in_case(bool batch_first) {
  const int64_t E = 16, H = 4, Hkv = 2, Ekv = Hkv * E / H, B = 2, steps = 66;
  Generator gen(5);
  StateDict s = {{"in_proj_weight", random_tensor({E + 2 * Ekv, E}, gen)},
                 {"in_proj_bias", random_tensor({E + 2 * Ekv}, gen)},
                 {"out_proj.weight", random_tensor({E, E}, gen)},
                 {"out_proj.bias", random_tensor({E}, gen)}};
  TorchMhaOptions o = test::batch_first_options();
  o.num_kv_heads = Hkv;
  o.batch_first = batch_first;
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(s, H, o);
  m.eval();
  KVCache cache = m.kv_cache(B, 3 + steps);
  EXPECT_EQ(cache.num_kv_heads(), Hkv);
  // Ragged: row 0 starts with 3 positions, row 1 with 1.
  const std::vector<int64_t> starts = {3, 1};
  std::vector<RowState> state(static_cast<size_t>(B));
  // To the module's layout and back: x:[B, n, E] batch-major.
  auto to_layout = [&](const Tensor& x) {
    if (batch_first) return x;
    const int64_t n = x.size(1);
    Tensor y({n, B, E});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        std::copy(x.data() + (b * n + i) * E, x.data() + (b * n + i + 1) * E, y.data() + (i * B + b) * E);
    return y;
  };
  auto from_layout = [&](const Tensor& y) {
    if (batch_first) return y;
    const int64_t n = y.size(0);
    Tensor x({B, n, E});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        std::copy(y.data() + (i * B + b) * E, y.data() + (i * B + b + 1) * E, x.data() + (b * n + i) * E);
    return x;
  };
  const Tensor prompt = random_tensor({B, 3, E}, gen);
  m.forward(to_layout(prompt), to_layout(prompt), to_layout(prompt), cache);
  for (int64_t b = 0; b < B; ++b) {
    cache.truncate(b, starts[static_cast<size_t>(b)]);
    state[static_cast<size_t>(b)].push(rows_of(prompt, b, 0, starts[static_cast<size_t>(b)]));
  }
  TorchMhaOptions plain_o = o;
  plain_o.batch_first = true;
  TorchMultiheadAttention plain = TorchMultiheadAttention::from_state_dict(s, H, plain_o);
  plain.eval();
  double worst = 0.0;
  for (int64_t t = 0; t < steps; ++t) {
    const Tensor x = random_tensor({B, 1, E}, gen);
    const Tensor got = from_layout(m.forward(to_layout(x), to_layout(x), to_layout(x), cache));
    for (int64_t b = 0; b < B; ++b) {
      RowState& r = state[static_cast<size_t>(b)];
      const Tensor xb = rows_of(x, b, 0, 1);
      r.push(xb);
      const Tensor S({1, r.length, E}, r.inputs);
      const Tensor ref = plain(xb, S, S, {}, false).output;
      worst = std::max(worst, rel_err(rows_of(got, b, 0, 1), ref));
    }
  }
  EXPECT_LE(worst, 1e-5) << (batch_first ? "batch_first" : "sequence-first");
}

TEST(KVCache, DropInGroupedHeadsIsThePlainModuleBatchFirst) { drop_in_case(true); }
TEST(KVCache, DropInGroupedHeadsIsThePlainModuleSequenceFirst) { drop_in_case(false); }

// A module with keys already in a cache, and the inputs that made them.
struct Decoder {
  MultiHeadAttention m{16, 2, 0.0f, true, 1};
  Generator gen{2};
  Decoder() {
    m.eval();
    m.initialize(16, 16, 16);
  }
  Tensor step(KVCache& c, const Tensor& x) { return m.forward(x, x, x, c); }
};

TEST(KVCache, StoresTheProjectedKeysAndValues) {
  Decoder d;
  KVCache c = d.m.kv_cache(2, 8);
  const Tensor x = random_tensor({2, 3, 16}, d.gen);
  d.step(c, x);
  Generator unused(0);
  const Tensor k = d.m.W_k().forward(x, unused), v = d.m.W_v().forward(x, unused);  // [2, 3, 16]
  for (int64_t b = 0; b < 2; ++b) {
    const Tensor kc = c.keys(b), vc = c.values(b);  // [2 heads, 3, 8]
    ASSERT_EQ(kc.shape(), (Shape{2, 3, 8}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t x2 = 0; x2 < 8; ++x2) {
          EXPECT_NEAR(kc.at({h, i, x2}), k.at({b, i, h * 8 + x2}), 1e-5);
          EXPECT_NEAR(vc.at({h, i, x2}), v.at({b, i, h * 8 + x2}), 1e-5);
        }
  }
}

TEST(KVCache, TruncateForgetsWhatFollows) {
  Decoder d;
  KVCache a = d.m.kv_cache(2, 16), b = d.m.kv_cache(2, 16);
  const Tensor x0 = random_tensor({2, 4, 16}, d.gen), draft = random_tensor({2, 3, 16}, d.gen),
               x1 = random_tensor({2, 1, 16}, d.gen);
  d.step(a, x0);
  d.step(b, x0);
  d.step(a, draft);  // rejected: rewound
  a.truncate(0, 4);
  a.truncate(1, 4);
  EXPECT_EQ(a.lengths(), (std::vector<int64_t>{4, 4}));
  EXPECT_TRUE(mha::test::all_close(d.step(a, x1), d.step(b, x1), 0.0, 0.0));
}

TEST(KVCache, ResetStartsOver) {
  Decoder d;
  KVCache a = d.m.kv_cache(2, 8);
  const Tensor x0 = random_tensor({2, 5, 16}, d.gen), x1 = random_tensor({2, 2, 16}, d.gen);
  d.step(a, x0);
  a.reset();
  EXPECT_EQ(a.lengths(), (std::vector<int64_t>{0, 0}));
  KVCache fresh = d.m.kv_cache(2, 8);
  EXPECT_TRUE(mha::test::all_close(d.step(a, x1), d.step(fresh, x1), 0.0, 0.0));
}

TEST(KVCache, ReorderFollowsTheBeams) {
  Decoder d;
  KVCache c = d.m.kv_cache(3, 8, KVCacheDtype::BFloat16);
  c.reorder({0, 1, 2});
  d.step(c, random_tensor({3, 2, 16}, d.gen));
  c.truncate(2, 1);
  const Tensor k0 = c.keys(0), k2 = c.keys(2), v2 = c.values(2);
  c.reorder({2, 2, 0});
  EXPECT_EQ(c.lengths(), (std::vector<int64_t>{1, 1, 2}));
  EXPECT_TRUE(mha::test::all_close(c.keys(0), k2, 0.0, 0.0));
  EXPECT_TRUE(mha::test::all_close(c.keys(1), k2, 0.0, 0.0));
  EXPECT_TRUE(mha::test::all_close(c.values(1), v2, 0.0, 0.0));
  EXPECT_TRUE(mha::test::all_close(c.keys(2), k0, 0.0, 0.0));
}

TEST(KVCache, AppendIsWhatACachedCallWrites) {
  Decoder d;
  KVCache a = d.m.kv_cache(2, 8), b = d.m.kv_cache(2, 8);
  const Tensor x = random_tensor({2, 3, 16}, d.gen), x1 = random_tensor({2, 1, 16}, d.gen);
  d.step(a, x);
  Generator unused(0);
  b.append(d.m.W_k().forward(x, unused), d.m.W_v().forward(x, unused));
  EXPECT_EQ(b.lengths(), a.lengths());
  EXPECT_TRUE(mha::test::all_close(d.step(b, x1), d.step(a, x1), 1e-6, 1e-6));
}

TEST(KVCache, MisuseIsRefused) {
  Decoder d;
  KVCache c = d.m.kv_cache(2, 4);
  const Tensor x3 = random_tensor({2, 3, 16}, d.gen);
  d.step(c, x3);
  // A refused call changes nothing.
  EXPECT_TRUE(throws_with([&] { d.step(c, x3); }, "3 new positions do not fit row 0 (length 3, capacity 4)"));
  EXPECT_EQ(c.lengths(), (std::vector<int64_t>{3, 3}));
  EXPECT_TRUE(throws_with([&] { d.step(c, random_tensor({3, 1, 16}, d.gen)); }, "cache: batch size 2; the call has 3"));
  EXPECT_TRUE(throws_with([&] { d.m.forward(x3, x3, random_tensor({2, 2, 16}, d.gen), c); }, "values: shape (2, 2, 16) has 2 positions"));
  EXPECT_TRUE(throws_with([&] { d.step(c, random_tensor({2, 1, 15}, d.gen)); }, "differs from W_q's input width 16"));
  MultiHeadAttention other(16, 2, 0.0f, true, 1);
  other.eval();
  EXPECT_TRUE(throws_with([&] { other.forward(x3, x3, x3, c); }, "made by another MultiHeadAttention object"));
  KVCache empty;
  EXPECT_TRUE(throws_with([&] { d.step(empty, x3); }, "an empty cache"));
  d.m.train();
  EXPECT_TRUE(throws_with([&] { d.step(c, x3); }, "evaluation mode only"));
  d.m.eval();
  EXPECT_TRUE(throws_with([&] { c.truncate(0, 4); }, "length: 4 for row 0 of length 3"));
  EXPECT_TRUE(throws_with([&] { c.truncate(2, 0); }, "row: 2 is not a batch row"));
  EXPECT_TRUE(throws_with([&] { c.reorder({0}); }, "rows: 1 entries; wanted one per batch row of the cache (2)"));
  EXPECT_TRUE(throws_with([&] { c.reorder({0, 2}); }, "rows: entry 1 is 2"));
  EXPECT_TRUE(throws_with([&] { c.append(Tensor({2, 1, 15}), Tensor({2, 1, 16})); }, "keys: shape (2, 1, 15); wanted (2, n, 16)"));
  EXPECT_TRUE(throws_with([&] { d.m.kv_cache(0, 4); }, "batch_size: 0 is not positive"));
  EXPECT_TRUE(throws_with([&] { d.m.kv_cache(2, -1); }, "max_len: -1 is not positive"));
  // Pruned heads: the cache's heads are the module's no longer.
  d.m.prune_heads({1});
  EXPECT_TRUE(throws_with([&] { d.step(c, random_tensor({2, 1, 16}, d.gen)); }, "2 key/value heads of width 8; the module now has 1"));
}

TEST(KVCache, MemoryLimitIsCheckedBeforeAllocating) {
  MultiHeadAttention m(64, 4);
  set_memory_limit(1 << 20);
  // 2 (keys, values) * 4 rows * 4096 positions * 64 floats * 4 bytes = 8 MiB.
  EXPECT_TRUE(throws_with([&] { m.kv_cache(4, 4096); }, "above the memory limit"));
  EXPECT_NO_THROW(m.kv_cache(4, 256));                              // 512 KiB
  EXPECT_NO_THROW(m.kv_cache(4, 512, KVCacheDtype::BFloat16));      // 512 KiB in bfloat16
  set_memory_limit(0);
  // Sizes whose bytes overflow 64 bits are refused, not wrapped.
  EXPECT_TRUE(throws_with([&] { m.kv_cache(int64_t{1} << 40, int64_t{1} << 40); }, "kv_cache"));
}

TEST(KVCache, DropInRefusesAppendedKeys) {
  Generator gen(1);
  StateDict s = {{"in_proj_weight", random_tensor({12, 4}, gen)}, {"out_proj.weight", random_tensor({4, 4}, gen)},
                 {"bias_k", random_tensor({1, 1, 4}, gen)}, {"bias_v", random_tensor({1, 1, 4}, gen)}};
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(s, 2, test::batch_first_options());
  m.eval();
  KVCache c = m.kv_cache(1, 4);
  const Tensor x({1, 1, 4}, 1.0f);
  EXPECT_TRUE(throws_with([&] { m.forward(x, x, x, c); }, "add_bias_kv or add_zero_attn"));
  EXPECT_EQ(c.length(0), 0);
}

}  // namespace

namespace {

// An unbatched drop-in call, query (n, E), is batch row 0 of a batched one.
TEST(KVCache, DropInUnbatchedIsOneBatchRow) {
  Generator gen(9);
  StateDict s = {{"in_proj_weight", random_tensor({12, 4}, gen)}, {"out_proj.weight", random_tensor({4, 4}, gen)}};
  TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(s, 2, test::batch_first_options());
  m.eval();
  KVCache a = m.kv_cache(1, 8), b = m.kv_cache(1, 8);
  for (int64_t n : {3, 1, 2}) {
    const Tensor x = random_tensor({n, 4}, gen);
    const Tensor xb({1, n, 4}, x.values());
    const Tensor got = m.forward(x, x, x, a);
    ASSERT_EQ(got.shape(), (Shape{n, 4}));
    EXPECT_TRUE(mha::test::all_close(got.reshape({1, n, 4}), m.forward(xb, xb, xb, b), 0.0, 0.0));
  }
  EXPECT_EQ(a.length(0), 6);
}

}  // namespace

namespace {

// Rows [p0, p1) of every batch row of x:[B, L, D], batch row b only when b >= 0.
Tensor batch_row(const Tensor& x, int64_t b) { return rows_of(x, b, 0, x.size(1)); }

// valid_lens inside cached calls: the chapter's module over each row's whole
// state (its inputs so far, projected again), one row at a time, with the
// per-query lengths min(length, causal limit), for (B,) and (B, n) lengths
// (0, fractional, past the keys) and steps of 1 to 4 new positions.
TEST(KVCache, ValidLensAreTheChaptersLoop) {
  const int64_t B = 3, D = 24, H = 3;
  MultiHeadAttention m(D, H, 0.0f, /*bias=*/true, /*seed=*/7);
  m.eval();
  m.initialize(D, D, D);
  Generator gen(13);
  KVCache cache = m.kv_cache(B, 64);
  std::vector<RowState> state(static_cast<size_t>(B));
  double worst = 0.0;
  const int64_t steps[] = {5, 1, 3, 1, 4, 1, 2, 1};
  for (int t = 0; t < 8; ++t) {
    const int64_t n = steps[t];
    const Tensor x = random_tensor({B, n, D}, gen);
    for (int64_t b = 0; b < B; ++b) state[static_cast<size_t>(b)].push(rows_of(x, b, 0, n));
    const bool per_query = t % 2 == 1;
    std::vector<float> lens;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < (per_query ? n : 1); ++i) {
        const float K = static_cast<float>(state[static_cast<size_t>(b)].length);
        const float choices[] = {0.0f, 0.5f, K - 1.5f, K / 2, K + 3, static_cast<float>(1 + gen.next() % 8)};
        lens.push_back(std::max(0.0f, choices[gen.next() % 6]));
      }
    const ValidLens vl = per_query ? ValidLens::per_query(B, n, lens) : ValidLens::per_batch(lens);
    const Tensor got = m.forward(x, x, x, vl, cache);
    for (int64_t b = 0; b < B; ++b) {
      const RowState& r = state[static_cast<size_t>(b)];
      std::vector<float> row_lens;
      for (int64_t i = 0; i < n; ++i)
        row_lens.push_back(std::min(vl.at(b, i), static_cast<float>(r.length - n + i + 1)));
      const Tensor S({1, r.length, D}, r.inputs);
      const Tensor ref = m.forward(batch_row(x, b), S, S, ValidLens::per_query(1, n, row_lens));
      worst = std::max(worst, rel_err(batch_row(got, b), ref));
    }
  }
  EXPECT_LE(worst, 1e-5);
  // Misshapen lengths are refused before the cache changes.
  const std::vector<int64_t> before = cache.lengths();
  const Tensor x = random_tensor({B, 2, D}, gen);
  EXPECT_TRUE(throws_with([&] { m.forward(x, x, x, ValidLens::per_query(B, 3, std::vector<float>(9, 1.0f)), cache); },
                          "valid_lens"));
  EXPECT_EQ(cache.lengths(), before);
}

// key_padding_mask inside the drop-in's cached calls (grouped heads,
// boolean and additive, either policy): the plain call over each row's
// state with the row's mask columns and Causal::BottomRight.
TEST(KVCache, DropInKeyPaddingMaskIsThePlainCall) {
  const int64_t E = 16, H = 4, Hkv = 2, Ekv = Hkv * E / H, B = 2;
  Generator gen(17);
  StateDict s = {{"in_proj_weight", random_tensor({E + 2 * Ekv, E}, gen)},
                 {"in_proj_bias", random_tensor({E + 2 * Ekv}, gen)},
                 {"out_proj.weight", random_tensor({E, E}, gen)},
                 {"out_proj.bias", random_tensor({E}, gen)}};
  TorchMhaOptions o = test::batch_first_options();
  o.num_kv_heads = Hkv;
  for (FullyMaskedRows policy : {FullyMaskedRows::Zeros, FullyMaskedRows::Uniform})
    for (bool additive : {false, true}) {
      o.fully_masked_rows = policy;
      TorchMultiheadAttention m = TorchMultiheadAttention::from_state_dict(s, H, o);
      m.eval();
      KVCache cache = m.kv_cache(B, 32);
      std::vector<RowState> state(static_cast<size_t>(B));
      double worst = 0.0;
      for (int64_t n : {4, 1, 3, 1, 2}) {
        const Tensor x = random_tensor({B, n, E}, gen);
        for (int64_t b = 0; b < B; ++b) state[static_cast<size_t>(b)].push(rows_of(x, b, 0, n));
        const int64_t S = state[0].length;  // equal rows
        std::vector<uint8_t> keep(static_cast<size_t>(B * S));
        Tensor bias({B, S});
        for (int64_t j = 0; j < B * S; ++j) {
          keep[static_cast<size_t>(j)] = gen.uniform() < 0.6f;
          bias.data()[j] = keep[static_cast<size_t>(j)] ? gen.uniform(-2.0f, 2.0f) : -INFINITY;
        }
        keep[0] = 0;  // row 0's first key is padding, so early queries may have none left
        bias.data()[0] = -INFINITY;
        const Mask mask = additive ? Mask::additive(bias) : Mask::keep({B, S}, keep);
        const Tensor got = m.forward(x, x, x, cache, mask);
        for (int64_t b = 0; b < B; ++b) {
          const RowState& r = state[static_cast<size_t>(b)];
          const Tensor St({1, r.length, E}, r.inputs);
          TorchMhaCall call;
          call.need_weights = false;
          call.causal = Causal::BottomRight;
          if (additive) {
            Tensor row({1, S});
            std::copy(bias.data() + b * S, bias.data() + (b + 1) * S, row.data());
            call.key_padding_mask = Mask::additive(row);
          } else {
            call.key_padding_mask = Mask::keep({1, S}, std::vector<uint8_t>(keep.begin() + b * S, keep.begin() + (b + 1) * S));
          }
          const Tensor ref = m.forward(batch_row(x, b), St, St, call).output;
          worst = std::max(worst, rel_err(batch_row(got, b), ref));
        }
      }
      EXPECT_LE(worst, 1e-5) << (additive ? "additive" : "boolean") << " policy "
                             << (policy == FullyMaskedRows::Zeros ? "zeros" : "uniform");
    }
}

}  // namespace
