// tests/cpp/nn/test_rotary.cpp: apply_rotary (src/nn/rotary.h) against the
// plain one-row loop, bitwise at 1 and 2 threads, on strided head views;
// rotating back restores the rows; per-row first positions are honoured.
// A rotary module's cached decoding (ragged rows, token by token) against
// its uncached causal call over each row's whole sequence. GemmBatch's row
// epilogue sees every row once, finished; the projections' rotary epilogue
// equals the products without rotary rotated row by row by the reference, on
// odd shapes (rows not a multiple of the row block, partial rotation, both
// layouts, both row orders, padded rows, appended rows, cached positions,
// one-row decode steps, bfloat16 products), bitwise at 1 and 2 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <mutex>
#include <utility>

#include "cpu/gemm/packed_weight.h"
#include "cpu/gemm/parallel_gemm.h"
#include "mha/mha.h"
#include "mha/random.h"
#include "mha/threads.h"
#include "nn/layer_ref.h"
#include "nn/projections.h"
#include "nn/rotary.h"
#include "test_util.h"

namespace mha::nn {
namespace {

// A (B, heads, L, d) view into rows of width ld (heads*d <= ld), as the
// projections lay their buffers out.
TensorView view(std::vector<float>& buf, int64_t B, int64_t heads, int64_t L, int64_t d, int64_t ld) {
  TensorView v;
  v.data = buf.data();
  v.rank = 4;
  v.shape[0] = B, v.stride[0] = L * ld;
  v.shape[1] = heads, v.stride[1] = d;
  v.shape[2] = L, v.stride[2] = ld;
  v.shape[3] = d, v.stride[3] = 1;
  return v;
}

TEST(Rotary, MatchesTheRowLoopBitwiseAtOneAndTwoThreadsAndInvertsWithinRounding) {
  const int saved = num_threads();
  Generator gen(5);
  for (const auto layout : {Rotary::Layout::Half, Rotary::Layout::Interleaved})
    for (int64_t dims : {2, 6, 16}) {
      const int64_t B = 3, heads = 2, L = 37, d = 16, ld = heads * d + 3;
      const Rotary r{dims, 10000.0f, layout};
      std::vector<float> x(static_cast<size_t>(B * L * ld));
      for (float& v : x) v = gen.uniform(-1.0f, 1.0f);
      const std::vector<int64_t> first = {0, 5, 1000};
      std::vector<float> want = x;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < L; ++i)
            rotate_row_reference(want.data() + (b * L + i) * ld + h * d, first[static_cast<size_t>(b)] + i, r, false);
      std::vector<std::vector<float>> got;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<float> y = x;
        apply_rotary(view(y, B, heads, L, d, ld), L, r, first.data(), false);
        got.push_back(y);
      }
      EXPECT_EQ(got[0], want) << "dims " << dims;
      EXPECT_EQ(got[1], want) << "dims " << dims;
      // Entries past dims and the columns past heads*d are untouched.
      for (int64_t row = 0; row < B * L; ++row) {
        for (int64_t c = heads * d; c < ld; ++c) EXPECT_EQ(got[0][row * ld + c], x[row * ld + c]);
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = dims; c < d; ++c) EXPECT_EQ(got[0][row * ld + h * d + c], x[row * ld + h * d + c]);
      }
      std::vector<float> back = got[0];
      apply_rotary(view(back, B, heads, L, d, ld), L, r, first.data(), true);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-6f);
    }
  set_num_threads(saved);
}

TEST(Rotary, FrequenciesAreRoFormersInFloat32) {
  const Rotary r{8, 10000.0f};
  std::vector<float> theta(4);
  rotary_frequencies(r, theta.data());
  for (int m = 0; m < 4; ++m)
    EXPECT_NEAR(theta[static_cast<size_t>(m)], std::pow(10000.0, -2.0 * m / 8.0), 1e-7 * std::pow(10000.0, -2.0 * m / 8.0));
  EXPECT_EQ(theta[0], 1.0f);
}

// Rows [p0, p1) of batch row b of x:[B, L, D] appended to out (a [1, n, D] row's data).
void append_rows(std::vector<float>& out, const Tensor& x, int64_t b, int64_t p0, int64_t p1) {
  const int64_t L = x.size(1), D = x.size(2);
  out.insert(out.end(), x.data() + (b * L + p0) * D, x.data() + (b * L + p1) * D);
}

// Prompts of {6, 3} positions prefilled in one cached call (each row rewound
// to its own length), then 4 steps of one position per row: every output
// row equals the same position of the uncached causal call (valid lengths
// i + 1) over that row's whole sequence, whose queries and keys sit at
// positions 0..n-1. Without rotary positions from the cache, row 1's steps
// would be rotated as positions 6.. instead of 3..
void cached_equals_uncached(const Rotary& r) {
  const int64_t B = 2, P = 6, D = 24, steps = 4;
  const std::vector<int64_t> lens = {6, 3};
  MultiHeadAttention m(D, 3, 0.0f, /*bias=*/true, /*seed=*/5);
  m.set_rotary(r);
  m.eval();
  m.initialize(D, D, D);
  Generator gen(17);
  const Tensor prompt = mha::test::random_tensor({B, P, D}, gen);
  KVCache cache = m.kv_cache(B, P + steps);
  const Tensor pre = m.forward(prompt, prompt, prompt, cache);
  for (int64_t b = 0; b < B; ++b) cache.truncate(b, lens[static_cast<size_t>(b)]);
  std::vector<std::vector<float>> seq(B), got(B);  // each row's inputs and cached outputs
  for (int64_t b = 0; b < B; ++b) {
    append_rows(seq[static_cast<size_t>(b)], prompt, b, 0, lens[static_cast<size_t>(b)]);
    append_rows(got[static_cast<size_t>(b)], pre, b, 0, lens[static_cast<size_t>(b)]);
  }
  for (int64_t t = 0; t < steps; ++t) {
    const Tensor x = mha::test::random_tensor({B, 1, D}, gen);
    const Tensor y = m.forward(x, x, x, cache);
    for (int64_t b = 0; b < B; ++b) {
      append_rows(seq[static_cast<size_t>(b)], x, b, 0, 1);
      append_rows(got[static_cast<size_t>(b)], y, b, 0, 1);
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<float>& s = seq[static_cast<size_t>(b)];
    const int64_t n = static_cast<int64_t>(s.size()) / D;
    Tensor X({1, n, D});
    std::copy(s.begin(), s.end(), X.data());
    std::vector<float> causal;
    for (int64_t i = 0; i < n; ++i) causal.push_back(static_cast<float>(i + 1));
    const Tensor want = m.forward(X, X, X, ValidLens::per_query(1, n, causal));
    const std::vector<float>& g = got[static_cast<size_t>(b)];
    ASSERT_EQ(static_cast<int64_t>(g.size()), want.numel());
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(g[static_cast<size_t>(i)]) - want.data()[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want.data()[i])));
    }
    EXPECT_LE(diff, 1e-5 * scale) << "row " << b << " dims " << r.dims;
  }
}

TEST(Rotary, CachedDecodingOfRaggedRowsEqualsTheUncachedCausalCall) {
  cached_equals_uncached(Rotary{8, 10000.0f, Rotary::Layout::Half});
  cached_equals_uncached(Rotary{4, 500.0f, Rotary::Layout::Interleaved});
  // The test can fail: the same cached outputs differ from a module without rotary.
  MultiHeadAttention a(8, 1, 0.0f, false, 1), b(8, 1, 0.0f, false, 1);
  a.set_rotary(Rotary{8});
  a.eval(), b.eval();
  Generator gen(3);
  const Tensor x = mha::test::random_tensor({1, 5, 8}, gen);
  const Tensor ya = a.forward(x, x, x), yb = b.forward(x, x, x);
  double diff = 0.0;
  for (int64_t i = 0; i < ya.numel(); ++i) diff = std::max(diff, std::fabs(static_cast<double>(ya.data()[i]) - yb.data()[i]));
  EXPECT_GT(diff, 1e-3);
}

// What an epilogue saw: (first row, rows) per call, and whether each block
// already held its finished values.
struct Seen {
  const std::vector<float>* want;  // the finished C
  int64_t N = 0;
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> blocks;
  bool finished = true;
  static void record(const void* ctx, float* C, int64_t ldc, int64_t r0, int64_t rows) {
    Seen& s = *const_cast<Seen*>(static_cast<const Seen*>(ctx));
    bool same = true;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < s.N; ++j) same = same && C[r * ldc + j] == (*s.want)[static_cast<size_t>((r0 + r) * s.N + j)];
    std::lock_guard<std::mutex> lock(s.mutex);
    s.blocks.emplace_back(r0, rows);
    s.finished = s.finished && same;
  }
};

TEST(RotaryEpilogue, GemmBatchRunsARowEpilogueOnceOnEveryFinishedRow) {
  const int saved = num_threads();
  Generator gen(8);
  const int64_t N = 40, K = 24;
  const Tensor W = mha::test::random_tensor({N, K}, gen), bias = mha::test::random_tensor({N}, gen);
  const auto packed = cpu::pack_weight(W.data(), N, K, Precision::Float32);
  for (int64_t M : {1, 5, 37, 193, 1300})  // dot products; one block; several, the last one short
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const Tensor A = mha::test::random_tensor({M, K}, gen);
      std::vector<float> want(static_cast<size_t>(M * N)), got(want.size());
      {
        cpu::GemmBatch plain;
        plain.add_packed(M, A.data(), K, *packed, bias.data(), want.data(), N);
        plain.run();
      }
      Seen seen;
      seen.want = &want, seen.N = N;
      cpu::GemmBatch batch;
      const cpu::RowEpilogue e{&Seen::record, &seen};
      if (M == 1) batch.add_dot_products(M, A.data(), K, W.data(), N, K, bias.data(), got.data(), N, e);
      else batch.add_packed(M, A.data(), K, *packed, bias.data(), got.data(), N, e);
      if (M == 1) {  // dot products have other bits than the packed product: compare with themselves
        cpu::GemmBatch dots;
        dots.add_dot_products(M, A.data(), K, W.data(), N, K, bias.data(), want.data(), N);
        dots.run();
      }
      batch.run();
      std::sort(seen.blocks.begin(), seen.blocks.end());
      int64_t next = 0;
      for (const auto& [r0, rows] : seen.blocks) {
        EXPECT_EQ(r0, next) << "M " << M;
        next = r0 + rows;
      }
      EXPECT_EQ(next, M);
      EXPECT_TRUE(seen.finished) << "M " << M << " threads " << threads;
      EXPECT_GT(static_cast<int64_t>(seen.blocks.size()), M > 1000 ? 1 : 0);
    }
  set_num_threads(saved);
}

struct ProjectionCase {
  int64_t B, Q, K, Kt, H, Hkv, d;
  bool seq_first, self, padded, cached, bf16;
  Rotary r;
};

// project_qkv with shape.rotary against project_qkv without, its q rows and
// its K given k rows then rotated by rotate_row_reference: bitwise, at 1
// and 2 threads.
void epilogue_equals_reference(const ProjectionCase& c) {
  const int saved = num_threads();
  Generator gen(static_cast<uint64_t>(c.B * 1000 + c.Q * 10 + c.d));
  const int64_t D = 20, E = c.H * c.d, Ekv = c.Hkv * c.d;
  const Tensor Wq = mha::test::random_tensor({E, D}, gen), bq = mha::test::random_tensor({E}, gen);
  const Tensor Wk = mha::test::random_tensor({Ekv, D}, gen), Wv = mha::test::random_tensor({Ekv, D}, gen);
  const LayerRef q(Wq.data(), bq.data(), E, D), k(Wk.data(), nullptr, Ekv, D), v(Wv.data(), nullptr, Ekv, D);
  const Tensor X = mha::test::random_tensor({c.B * c.Q, D}, gen);
  const Tensor other = mha::test::random_tensor({c.B * c.K, D}, gen);
  const Tensor& Y = c.self ? X : other;  // self: one tensor, one buffer [q | v | k]
  RowNeeds needs;
  if (c.padded)
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t vr = (b * 7 + 3) % (c.K + 1);
      needs.v_rows.push_back(vr);
      needs.k_rows.push_back(std::max<int64_t>(vr - 2, 0));
    }
  std::vector<int64_t> first;
  for (int64_t b = 0; b < c.B; ++b) first.push_back(c.cached ? 5 + 11 * b : 0);
  ProjectionShape shape{RowLayout{c.seq_first, c.B}, c.Q, c.K, c.Kt, c.H, c.Hkv, c.d,
                        c.bf16 ? Precision::BFloat16 : Precision::Float32};
  shape.few_rows_as_dots = c.cached;
  set_num_threads(1);
  const Projected plain = project_qkv(X, Y, Y, q, k, v, shape, needs);
  shape.rotary = c.r;
  if (c.cached) shape.rotary_first = first.data();
  // The reference: each head of each row rotated alone, in place of a copy.
  std::vector<std::vector<float>> want;
  for (const Tensor& t : plain.buffers) want.emplace_back(t.values().begin(), t.values().end());
  auto rotate_view = [&](const TensorView& view, int64_t rows) {
    for (size_t i = 0; i < plain.buffers.size(); ++i) {
      const float* base = plain.buffers[i].data();
      const int64_t n = plain.buffers[i].numel();
      if (view.data < base || view.data >= base + n) continue;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < view.shape[1]; ++h)
          for (int64_t p = 0; p < rows; ++p) {
            const int64_t at = view.ptr(b, h, p) - base;
            rotate_row_reference(want[i].data() + at, first[static_cast<size_t>(b)] + p, c.r, false);
          }
    }
  };
  rotate_view(plain.q, c.Q);
  rotate_view(plain.k, c.K);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const Projected got = project_qkv(X, Y, Y, q, k, v, shape, needs);
    ASSERT_EQ(got.buffers.size(), want.size());
    // The test can fail: rotary changes q.
    EXPECT_FALSE(std::equal(want[0].begin(), want[0].end(), plain.buffers[0].data()));
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(std::equal(want[i].begin(), want[i].end(), got.buffers[i].data()))
          << "buffer " << i << " threads " << threads << " B" << c.B << " Q" << c.Q << " K" << c.K << " dims "
          << c.r.dims << (c.seq_first ? " seq-first" : "") << (c.padded ? " padded" : "")
          << (c.cached ? " cached" : "") << (c.bf16 ? " bf16" : "");
  }
  set_num_threads(saved);
}

TEST(RotaryEpilogue, ProjectionsEqualTheRowReferenceOnOddShapes) {
  const Rotary half{6, 10000.0f, Rotary::Layout::Half}, inter{8, 500.0f, Rotary::Layout::Interleaved};
  const Rotary whole{12, 10000.0f, Rotary::Layout::Half}, whole_inter{12, 10000.0f, Rotary::Layout::Interleaved};
  for (const Rotary& r : {half, inter, whole, whole_inter}) {
    // B, Q, K, Kt, H, Hkv, d, seq_first, self, padded, cached, bf16
    // Self-attention, 3 x 3 x 301 rows: row blocks of 384, the last short.
    epilogue_equals_reference({3, 301, 301, 301, 3, 3, 12, false, true, false, false, false, r});
    // The same rows position-major; grouped heads from other keys.
    epilogue_equals_reference({3, 301, 301, 301, 3, 3, 12, true, true, false, false, false, r});
    epilogue_equals_reference({2, 157, 263, 263, 4, 2, 12, false, false, false, false, false, r});
    // Padded key rows (one product per batch row and need), an appended row.
    epilogue_equals_reference({5, 90, 211, 212, 2, 1, 12, false, false, true, false, false, r});
    epilogue_equals_reference({5, 211, 211, 211, 2, 2, 12, false, true, true, false, false, r});
    // Few rows in all (the toy call's shapes).
    epilogue_equals_reference({2, 3, 5, 5, 2, 2, 12, false, false, false, false, false, r});
    // Cached calls: ragged first positions; one-row steps (dot products)
    // in either row order; a prefill of several rows.
    epilogue_equals_reference({3, 1, 1, 1, 2, 1, 12, false, true, false, true, false, r});
    epilogue_equals_reference({3, 1, 1, 1, 2, 1, 12, true, true, false, true, false, r});
    epilogue_equals_reference({3, 77, 77, 77, 2, 2, 12, true, true, false, true, false, r});
    // bfloat16 products (rotated before the engine rounds them).
    epilogue_equals_reference({3, 301, 301, 301, 3, 3, 12, false, true, false, false, true, r});
    epilogue_equals_reference({3, 1, 1, 1, 2, 1, 12, false, true, false, true, true, r});
  }
}

}  // namespace
}  // namespace mha::nn
