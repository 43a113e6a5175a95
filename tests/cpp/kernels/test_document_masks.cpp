// Packed batches of documents (MaskOptions::doc_offsets, FlashAttention's
// varlen cu_seqlens: B = 1, Q = K packed rows, query i of document [s, e)
// sees only keys in [s, e), every other option applying within it):
// - the reference against the same documents written by this test as a
//   block-diagonal boolean pair mask, forward, weights and every gradient;
// - every kernel (BLAS, fused on each instruction set this CPU supports)
//   against the reference on random packed batches combined with every
//   other option (harness.h: forward, weights, weights from statistics,
//   every gradient);
// - a packed batch equal to its documents run one by one, forward and
//   gradients, on every kernel;
// - the fused kernel bitwise the same at one and two threads;
// - the fused kernel's query tiles (fused_query_tiles): every document cut
//   from its first row, no tile across a boundary, and its chunks' mapping
//   onto (head, tile) one to one; and, since a document's tiles then fall
//   as in a call on it alone, the fused kernel on a packed batch bitwise
//   its documents one by one (many documents shorter than a tile, documents
//   ending on tile boundaries, one long document);
// - the offsets checked (kernels/validate.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/blas/attention_blas.h"
#include "cpu/fused/attention_fused.h"
#include "cpu/reference/attention_backward_masked.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/case_data.h"
#include "kernels/cases.h"
#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "kernels/validate.h"

namespace mha::kernels {
namespace {

using test::kBackwardBound;
using test::kForwardBound;
using test::normalised_error;

struct RefResult {
  Tensor out, w, gq, gk, gv;
};

// The reference forward (out, weights) and backward of `f` on `data`.
RefResult reference(const CaseData& data, AttentionForward f) {
  const Case& c = data.c;
  RefResult r;
  r.out = data.new_out();
  r.w = data.new_weights();
  f.out = r.out.view().split_heads(c.H);
  f.weights = r.w.data();
  attention_forward_reference(f);
  r.gq = Tensor(data.q.shape(), NAN);
  r.gk = Tensor(data.k.shape(), NAN);
  r.gv = Tensor(data.v.shape(), NAN);
  f.weights = nullptr;
  std::vector<float> grad_sinks(static_cast<size_t>(c.H));  // written when the case has sinks
  attention_backward_masked_reference(f, data.grad_out.view().split_heads(c.H), r.gq.view().split_heads(c.H),
                                      r.gk.view().split_heads(c.Hkv), r.gv.view().split_heads(c.Hkv),
                                      f.masks.sinks ? grad_sinks.data() : nullptr);
  return r;
}

::testing::AssertionResult same_values(const char* what, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (int64_t x = 0; x < a.numel(); ++x)
    if (!(a.data()[x] == b.data()[x]))
      return ::testing::AssertionFailure() << what << " element " << x << ": " << a.data()[x] << " against "
                                           << b.data()[x];
  return ::testing::AssertionSuccess();
}

// The document of row i, as this test reads the offsets.
int64_t doc_of(const std::vector<int64_t>& o, int64_t i) {
  int64_t x = 0;
  while (!(o[static_cast<size_t>(x)] <= i && i < o[static_cast<size_t>(x + 1)])) ++x;
  return x;
}

TEST(DocumentMasks, TheReferenceAgreesWithTheBlocksAsABooleanPairMask) {
  int empty_docs = 0, single = 0;
  for (Case c : document_cases(41, 80)) {
    c.pair_keep = c.pair_bias = c.pair_per_head = false;
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    const AttentionForward with_docs = data.forward();
    AttentionForward with_pairs = with_docs;
    with_pairs.masks.doc_offsets = nullptr;
    with_pairs.masks.documents = 0;
    std::vector<uint8_t> blocks(static_cast<size_t>(c.Q * c.K));
    for (int64_t i = 0; i < c.Q; ++i)
      for (int64_t j = 0; j < c.K; ++j)
        blocks[static_cast<size_t>(i * c.K + j)] = doc_of(c.doc_offsets, i) == doc_of(c.doc_offsets, j);
    with_pairs.masks.pair_keep = blocks.data();
    for (size_t x = 1; x < c.doc_offsets.size(); ++x) {
      empty_docs += c.doc_offsets[x] == c.doc_offsets[x - 1];
      single += c.doc_offsets[x] == c.doc_offsets[x - 1] + 1;
    }
    const RefResult a = reference(data, with_docs), b = reference(data, with_pairs);
    EXPECT_TRUE(same_values("out", a.out, b.out));
    EXPECT_TRUE(same_values("weights", a.w, b.w));
    EXPECT_TRUE(same_values("grad_q", a.gq, b.gq));
    EXPECT_TRUE(same_values("grad_k", a.gk, b.gk));
    EXPECT_TRUE(same_values("grad_v", a.gv, b.gv));
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(empty_docs, 5);
  EXPECT_GT(single, 100);
}

// Every kernel and instruction set against the reference, in four parts.
class DocumentKernelCases : public ::testing::TestWithParam<int> {};

TEST_P(DocumentKernelCases, MatchTheReference) {
  const int part = GetParam();
  const std::vector<Case> cases = document_cases(0x646f6300u + static_cast<uint64_t>(part), 80);
  int one_doc = 0, unit_docs = 0, empty_docs = 0, windows = 0, causal = 0, other = 0, long_axes = 0;
  for (const Case& c : cases) {
    const auto& o = c.doc_offsets;
    one_doc += o.size() == 2;
    unit_docs += c.Q > 1 && static_cast<int64_t>(o.size()) >= c.Q + 1;
    for (size_t x = 1; x < o.size(); ++x) empty_docs += o[x] == o[x - 1];
    windows += c.window_left >= 0;
    causal += c.causal != Causal::None;
    other += c.key_keep || c.key_bias || c.pair_keep || c.pair_bias;
    long_axes += c.Q >= 150;
  }
  EXPECT_GT(one_doc, 3);
  EXPECT_GT(unit_docs, 3);
  EXPECT_GT(empty_docs, 3);
  EXPECT_GT(windows, 5);
  EXPECT_GT(causal, 10);
  EXPECT_GT(other, 10);
  EXPECT_GT(long_axes, 5);
  // Cases where no query keeps two live keys (documents of length 1, the one
  // batch row fully masked) have no score gradient: held apart as in the
  // window tests (test_window_masks.cpp).
  std::vector<Case> regular;
  int degenerate = 0;
  for (const Case& c : cases) {
    const CaseData data(c);
    const RefResult ref = reference(data, data.forward());
    const bool none = std::all_of(ref.gq.values().begin(), ref.gq.values().end(), [](float x) { return x == 0; }) &&
                      std::all_of(ref.gk.values().begin(), ref.gk.values().end(), [](float x) { return x == 0; });
    if (!none) {
      regular.push_back(c);
      continue;
    }
    ++degenerate;
    SCOPED_TRACE(c.name());
    for (const test::KernelUnderTest& k : test::kernels_under_test()) {
      ASSERT_TRUE(set_fused_isa(k.isa));
      Tensor out = data.new_out(), gq(data.q.shape(), NAN), gk(data.k.shape(), NAN), gv(data.v.shape(), NAN);
      std::vector<float> stats = data.new_stats();
      AttentionForward f = data.forward();
      f.out = out.view().split_heads(c.H);
      f.stats = {stats.data(), stats.data() + c.B * c.H * c.Q};
      AttentionBackward p;
      p.fwd = f;
      p.fwd.stats = attention_forward(k.kernel, f);
      p.grad_out = data.grad_out.view().split_heads(c.H);
      p.grad_q = gq.view().split_heads(c.H);
      p.grad_k = gk.view().split_heads(c.Hkv);
      p.grad_v = gv.view().split_heads(c.Hkv);
      std::vector<float> grad_sinks(static_cast<size_t>(c.H));
      if (f.masks.sinks) p.grad_sinks = grad_sinks.data();
      attention_backward(k.kernel, p);
      set_fused_isa(fused_best_isa());
      EXPECT_LE(normalised_error(out.data(), ref.out.data(), out.numel()), kForwardBound) << k.name;
      // No score gradient: zero, up to float32 rounding of a weight that the
      // reference holds at exactly 1 (a live key beside keys at -inf).
      double scale = 1e-6;
      for (float x : ref.gv.values()) scale = std::max(scale, static_cast<double>(std::fabs(x)));
      for (float x : gq.values()) ASSERT_LE(std::fabs(x), kBackwardBound * scale) << k.name << " grad_q";
      for (float x : gk.values()) ASSERT_LE(std::fabs(x), kBackwardBound * scale) << k.name << " grad_k";
      EXPECT_LE(normalised_error(gv.data(), ref.gv.data(), gv.numel(), 1e-30), 2e-5) << k.name << " grad_v";
    }
  }
  // (With one batch row, one fully masked draw (a zero length, no kept key,
  // a row of -inf) or documents of one row leave a whole case degenerate.)
  EXPECT_LT(degenerate, 45);
  EXPECT_GE(static_cast<int>(regular.size()), 35);
  const test::Tally t = test::run_cases(regular, ("documents part " + std::to_string(part)).c_str());
  EXPECT_EQ(t.cases + degenerate, 80);
}

INSTANTIATE_TEST_SUITE_P(Parts, DocumentKernelCases, ::testing::Values(0, 1, 2, 3));

// The forward and backward of `f` (masks already set) by `kernel`: out and
// the three gradients, in the module layout of `data`'s tensors.
struct KernelRun {
  Tensor out, gq, gk, gv;
};
KernelRun run_kernel(AttentionKernel kernel, AttentionForward f, const TensorView& grad_out, int64_t H, int64_t Hkv) {
  const int64_t Q = f.Q(), K = f.K(), d = f.d(), dv = f.dv();
  KernelRun r;
  r.out = Tensor({1, Q, H * dv});
  r.gq = Tensor({1, Q, H * d}, NAN);
  r.gk = Tensor({1, K, Hkv * d}, NAN);
  r.gv = Tensor({1, K, Hkv * dv}, NAN);
  std::vector<float> stats(static_cast<size_t>(2 * H * Q)), grad_sinks(static_cast<size_t>(H));
  f.out = r.out.view().split_heads(H);
  f.stats = {stats.data(), stats.data() + H * Q};
  AttentionBackward p;
  p.fwd = f;
  p.fwd.stats = attention_forward(kernel, f);
  p.grad_out = grad_out;
  p.grad_q = r.gq.view().split_heads(H);
  p.grad_k = r.gk.view().split_heads(Hkv);
  p.grad_v = r.gv.view().split_heads(Hkv);
  if (f.masks.sinks) p.grad_sinks = grad_sinks.data();
  attention_backward(kernel, p);
  return r;
}

// Rows [s, e) of a (B, L, H*d) view's heads: [B,H,e-s,d].
TensorView rows(TensorView t, int64_t s, int64_t e) {
  t.data = t.ptr(0, 0, s);
  t.shape[2] = e - s;
  return t;
}

// The -inf fill and zeros policy (FlashAttention's: a document is then
// exactly its own attention), with causal, windows and grouped heads; each
// document's rows of the packed results against the document run alone.
TEST(DocumentMasks, APackedBatchEqualsItsDocumentsOneByOne) {
  int compared = 0;
  for (Case c : document_cases(0x6f6e65u, 24)) {
    c.key_keep = c.key_bias = c.pair_keep = c.pair_bias = false;
    c.length_kind = LengthKind::None;
    c.dropout = 0.0f;
    c.fill = MaskFill::NegInf;
    c.fully_masked = FullyMaskedRows::Zeros;
    c.causal = c.causal == Causal::None ? Causal::None : Causal::BottomRight;
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    for (const test::KernelUnderTest& k : test::kernels_under_test()) {
      ASSERT_TRUE(set_fused_isa(k.isa));
      const KernelRun packed = run_kernel(k.kernel, data.forward(), data.grad_out.view().split_heads(c.H), c.H, c.Hkv);
      for (size_t x = 0; x + 1 < c.doc_offsets.size(); ++x) {
        const int64_t s = c.doc_offsets[x], e = c.doc_offsets[x + 1];
        if (s == e) continue;
        AttentionForward f = data.forward();
        f.masks.doc_offsets = nullptr;
        f.masks.documents = 0;
        f.q = rows(f.q, s, e), f.k = rows(f.k, s, e), f.v = rows(f.v, s, e);
        const KernelRun alone = run_kernel(k.kernel, f, rows(data.grad_out.view().split_heads(c.H), s, e), c.H, c.Hkv);
        // The packed results' rows of this document, contiguous in (1, T, H*d).
        auto slice = [&](const Tensor& t) { return t.data() + s * (t.numel() / c.Q); };
        EXPECT_LE(normalised_error(slice(packed.out), alone.out.data(), alone.out.numel()), kForwardBound) << k.name;
        const double floor = 1e-6;
        EXPECT_LE(normalised_error(slice(packed.gq), alone.gq.data(), alone.gq.numel(), floor), kBackwardBound) << k.name;
        EXPECT_LE(normalised_error(slice(packed.gk), alone.gk.data(), alone.gk.numel(), floor), kBackwardBound) << k.name;
        EXPECT_LE(normalised_error(slice(packed.gv), alone.gv.data(), alone.gv.numel(), floor), kBackwardBound) << k.name;
        ++compared;
      }
      set_fused_isa(fused_best_isa());
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(compared, 100);
}

TEST(DocumentMasks, TheFusedKernelIsBitwiseTheSameAtOneAndTwoThreads) {
  const int saved = omp_get_max_threads();
  for (const Case& c : document_cases(77, 12)) {
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    omp_set_num_threads(1);
    const KernelRun one = run_kernel(AttentionKernel::Fused, data.forward(), data.grad_out.view().split_heads(c.H), c.H, c.Hkv);
    omp_set_num_threads(2);
    const KernelRun two = run_kernel(AttentionKernel::Fused, data.forward(), data.grad_out.view().split_heads(c.H), c.H, c.Hkv);
    EXPECT_TRUE(one.out == two.out && one.gq == two.gq && one.gk == two.gk && one.gv == two.gv);
  }
  omp_set_num_threads(saved);
}

TEST(DocumentMasks, TheFusedQueryTilesCutEveryDocumentAtItsFirstRow) {
  MaskOptions none;
  EXPECT_TRUE(fused_query_tiles(none, 100, 64).empty());
  const std::vector<std::vector<int64_t>> layouts = {
      {0, 100},                        // one document
      {0, 64, 128, 192},               // ending on tile boundaries
      {0, 0, 3, 3, 70, 71, 200, 200},  // empty, length 1, longer than a tile
      {0, 1, 2, 3, 4, 5, 6, 7, 8},     // every document of length 1
      {0, 63, 65, 129, 130},           // one row either side of a boundary
  };
  for (const int64_t size : {16, 32, 64}) {
    for (const std::vector<int64_t>& o : layouts) {
      MaskOptions m;
      m.doc_offsets = o.data();
      m.documents = static_cast<int64_t>(o.size()) - 1;
      const int64_t Q = o.back();
      const std::vector<fused::QueryTile> tiles = fused_query_tiles(m, Q, size);
      SCOPED_TRACE("size " + std::to_string(size) + ", Q " + std::to_string(Q));
      // In row order, each row once, no tile over `size` queries or across a boundary.
      int64_t next = 0;
      for (size_t t = 0; t < tiles.size(); ++t) {
        const fused::QueryTile& x = tiles[t];
        ASSERT_EQ(x.i0, next);
        ASSERT_GE(x.mq, 1);
        ASSERT_LE(x.mq, size);
        const int64_t doc = doc_of(o, x.i0);
        EXPECT_EQ(doc_of(o, x.i0 + x.mq - 1), doc);
        EXPECT_EQ(x.key0, o[static_cast<size_t>(doc)]);
        EXPECT_EQ(x.key_end, o[static_cast<size_t>(doc) + 1]);
        // A tile starts at each document's first row and every size rows after it.
        EXPECT_EQ((x.i0 - x.key0) % size, 0);
        // Its document's tiles: [first_tile, first_tile + doc_tiles), all of them.
        const auto f = static_cast<size_t>(x.first_tile);
        ASSERT_LE(f + static_cast<size_t>(x.doc_tiles), tiles.size());
        EXPECT_EQ(tiles[f].i0, x.key0);
        const fused::QueryTile& last = tiles[f + static_cast<size_t>(x.doc_tiles) - 1];
        EXPECT_EQ(last.i0 + last.mq, x.key_end);
        next = x.i0 + x.mq;
      }
      EXPECT_EQ(next, Q);
      // The forward's chunks (c of H * tiles): each (head, tile) once, a
      // document's chunks consecutive.
      fused::QueryTiles qt;
      qt.table = tiles.data();
      qt.count = static_cast<int64_t>(tiles.size());
      qt.size = size;
      qt.Q = Q;
      const int64_t H = 3;
      std::vector<int> seen(static_cast<size_t>(H * qt.count), 0);
      int64_t doc_before = -1;
      for (int64_t c = 0; c < H * qt.count; ++c) {
        int64_t bh = -1;
        const fused::QueryTile x = qt.chunk(c, H, &bh);
        ASSERT_TRUE(bh >= 0 && bh < H);
        const int64_t t = std::find_if(tiles.begin(), tiles.end(), [&](const fused::QueryTile& y) { return y.i0 == x.i0; }) -
                          tiles.begin();
        ++seen[static_cast<size_t>(bh * qt.count + t)];
        EXPECT_GE(x.key0, doc_before);
        doc_before = x.key0;
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
}

// The -inf fill and the zeros policy, causal or windows or neither, grouped
// heads, the score options: the fused kernel, on every instruction set,
// bitwise the same on a packed batch as on its documents one by one.
TEST(DocumentMasks, TheFusedKernelOnAPackedBatchIsBitwiseItsDocumentsOneByOne) {
  const std::vector<std::vector<int64_t>> lengths = {
      {5, 1, 17, 3, 9, 30, 2, 11, 7, 1, 20, 4},  // many documents shorter than a tile
      {64, 128, 48, 96, 16, 32},                 // ending on tile boundaries
      {200},                                     // one document over several tiles
      {70, 0, 1, 130, 0},                        // empty and length-1 documents
  };
  int compared = 0;
  std::vector<Case> cases = document_cases(0x62697473u, 16);
  for (size_t n = 0; n < cases.size(); ++n) {
    Case c = cases[n];
    c.key_keep = c.key_bias = c.pair_keep = c.pair_bias = false;
    c.length_kind = LengthKind::None;
    c.dropout = 0.0f;
    c.fill = MaskFill::NegInf;
    c.fully_masked = FullyMaskedRows::Zeros;
    c.causal = c.causal == Causal::None ? Causal::None : Causal::BottomRight;
    c.doc_offsets = {0};
    for (int64_t x : lengths[n % lengths.size()]) c.doc_offsets.push_back(c.doc_offsets.back() + x);
    c.Q = c.K = c.doc_offsets.back();
    SCOPED_TRACE(c.name());
    const CaseData data(c);
    for (const FusedIsa isa : test::supported_isas()) {
      ASSERT_TRUE(set_fused_isa(isa));
      const KernelRun packed =
          run_kernel(AttentionKernel::Fused, data.forward(), data.grad_out.view().split_heads(c.H), c.H, c.Hkv);
      for (size_t x = 0; x + 1 < c.doc_offsets.size(); ++x) {
        const int64_t s = c.doc_offsets[x], e = c.doc_offsets[x + 1];
        if (s == e) continue;
        AttentionForward f = data.forward();
        f.masks.doc_offsets = nullptr;
        f.masks.documents = 0;
        f.q = rows(f.q, s, e), f.k = rows(f.k, s, e), f.v = rows(f.v, s, e);
        const KernelRun alone =
            run_kernel(AttentionKernel::Fused, f, rows(data.grad_out.view().split_heads(c.H), s, e), c.H, c.Hkv);
        auto same = [&](const char* what, const Tensor& p, const Tensor& a) {
          const float* at = p.data() + s * (p.numel() / c.Q);
          for (int64_t i = 0; i < a.numel(); ++i)
            if (!(at[i] == a.data()[i]) && !(std::isnan(at[i]) && std::isnan(a.data()[i])))
              return ::testing::AssertionFailure() << what << " element " << i << " of document " << x << ": "
                                                   << at[i] << " against " << a.data()[i] << " (" << fused_isa_name(isa) << ")";
          return ::testing::AssertionSuccess();
        };
        EXPECT_TRUE(same("out", packed.out, alone.out));
        EXPECT_TRUE(same("grad_q", packed.gq, alone.gq));
        EXPECT_TRUE(same("grad_k", packed.gk, alone.gk));
        EXPECT_TRUE(same("grad_v", packed.gv, alone.gv));
        ++compared;
      }
      set_fused_isa(fused_best_isa());
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(compared, 80);
}

TEST(DocumentMasks, BadOffsetsAreRefused) {
  Case c;
  c.B = 1, c.H = 2, c.Hkv = 1, c.Q = c.K = 6, c.d = 4, c.dv = 4;
  c.doc_offsets = {0, 2, 6};
  const CaseData data(c);
  Tensor out = data.new_out();
  auto why = [&](auto edit) {
    AttentionForward f = data.forward();
    f.out = out.view().split_heads(c.H);
    std::vector<int64_t> offsets = c.doc_offsets;
    f.masks.doc_offsets = offsets.data();
    edit(f, offsets);
    return validate(f);
  };
  EXPECT_EQ(why([](AttentionForward&, std::vector<int64_t>&) {}), "");
  EXPECT_EQ(why([](AttentionForward& f, std::vector<int64_t>&) { f.masks.documents = 0; }),
            "masks.documents: 0 with doc_offsets set, wanted offsets and at least one document, or neither");
  EXPECT_EQ(why([](AttentionForward& f, std::vector<int64_t>& o) { o[1] = 7; f.masks.documents = 2; }),
            "masks.doc_offsets: [1] = 7 > [2] = 6, wanted nondecreasing offsets");
  EXPECT_EQ(why([](AttentionForward& f, std::vector<int64_t>& o) { o[0] = 1; f.masks.documents = 2; }),
            "masks.doc_offsets: from 1 to 6, wanted from 0 to the 6 packed rows");
  EXPECT_EQ(why([](AttentionForward& f, std::vector<int64_t>&) { f.masks.documents = 1; }),
            "masks.doc_offsets: from 0 to 2, wanted from 0 to the 6 packed rows");
  EXPECT_EQ(why([](AttentionForward& f, std::vector<int64_t>&) { f.masks.documents = 2, f.k.shape[2] = 5, f.v.shape[2] = 5; }),
            "masks.doc_offsets: a packed batch over q (1, 2, 6, 4), k (1, 1, 5, 4), wanted one batch row and as many queries as keys");
}

}  // namespace
}  // namespace mha::kernels
