// src/kernels/cases.h: one description of an attention kernel call, shared by
// the kernel tests (tests/cpp/kernels/harness.h runs each case on every
// kernel and direction against the reference) and `mha bench` (which times
// kernels on cases). kernels/case_data.h turns a Case into buffers and
// parameter structs.
//
// A Case holds shapes, which options are on, and a seed; the data (q, k, v,
// grad_out, lengths, mask values, dropout key) is drawn from the seed, so a
// case is reproducible from its description alone. Lengths and the key_keep
// mask may instead be given explicitly (for worked examples and benchmarks).
//
// Generators: named families reproducing the shapes the kernel tests have
// always covered (tile edges, the backward grid, every option alone) and
// random_cases(seed, n) drawing shapes and every option combination.
#pragma once

#include <cstdint>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/params.h"
#include "mha/random.h"

namespace mha::kernels {

struct Case {
  std::string family;  // where it comes from: "tile-edges", "random", ...
  // q:[B,H,Q,d] k:[B,Hkv,K,d] v:[B,Hkv,K,dv] (module layout: (B, L, H*d) buffers seen as heads)
  int64_t B = 1, H = 1, Hkv = 1, Q = 1, K = 1, d = 1, dv = 1;
  LengthKind length_kind = LengthKind::None;
  std::vector<float> lens;  // [B] or [B,Q]; empty: drawn (0, fractional, exact, K, past K)
  // Masks (kernels/params.h MaskOptions): whether each is on. The
  // values are drawn per row so that every kind of row turns up: padding
  // (kept keys first), holes, nothing kept, every score -inf.
  bool key_keep = false, key_bias = false, pair_keep = false, pair_bias = false;
  bool pair_per_head = false;               // pair masks (B*H, Q, K) instead of a broadcast (Q, K)
  std::vector<uint8_t> key_keep_values;     // [B,K]; empty: drawn (when key_keep)
  Causal causal = Causal::None;
  int64_t window_left = -1, window_right = -1;  // MaskOptions' sliding window; -1: unbounded
  // A packed batch (MaskOptions::doc_offsets): documents + 1 offsets from 0
  // to Q = K, B = 1; empty: none.
  std::vector<int64_t> doc_offsets;
  MaskFill fill = MaskFill::Seed;
  FullyMaskedRows fully_masked = FullyMaskedRows::Uniform;
  float dropout = 0.0f;
  // Score options (MaskOptions): the softcap (0: off); ALiBi slopes and sink
  // logits drawn per head (kernels/case_data.h: slopes of both signs, sinks
  // from small to dominating).
  float softcap = 0.0f;
  bool alibi = false, sinks = false;
  float input_range = 1.5f;  // q and k uniform in [-r, r]; v and grad_out in [-1, 1]
  uint64_t seed = 0;

  bool grouped() const { return Hkv != H; }
  bool any_mask() const {
    return key_keep || key_bias || pair_keep || pair_bias || causal != Causal::None || window_left >= 0 ||
           window_right >= 0 || !doc_offsets.empty() || fill != MaskFill::Seed ||
           fully_masked != FullyMaskedRows::Uniform || score_options();
  }
  bool score_options() const { return softcap > 0.0f || alibi || sinks; }
  std::string name() const {
    std::ostringstream s;  // not a chain of std::string +: GCC 12 warns (-Wrestrict) on those
    s << family << " B" << B << " H" << H << " Hkv" << Hkv << " Q" << Q << " K" << K << " d" << d
      << " dv" << dv;
    if (length_kind != LengthKind::None) s << (length_kind == LengthKind::PerBatch ? " lens/b" : " lens/q");
    if (key_keep) s << " key_keep";
    if (key_bias) s << " key_bias";
    if (pair_keep) s << " pair_keep";
    if (pair_bias) s << " pair_bias";
    if ((pair_keep || pair_bias) && pair_per_head) s << "/head";
    if (causal != Causal::None) s << (causal == Causal::TopLeft ? " causal/tl" : " causal/br");
    if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
    if (!doc_offsets.empty()) {
      s << " docs";
      for (size_t x = 1; x < doc_offsets.size(); ++x) s << (x == 1 ? "(" : ",") << doc_offsets[x] - doc_offsets[x - 1];
      s << ")";
    }
    if (fill == MaskFill::NegInf) s << " -inf";
    if (fully_masked == FullyMaskedRows::Zeros) s << " zeros";
    if (dropout > 0) s << " p" << dropout;
    if (softcap > 0) s << " softcap" << softcap;
    if (alibi) s << " alibi";
    if (sinks) s << " sinks";
    s << " seed " << seed;
    return s.str();
  }

  // Multiply-adds x 2 of each direction, by the usual count (masked pairs
  // included: it is the work of an unmasked call of the same shapes).
  // forward: q k^T and P v
  double forward_flops() const { return 2.0 * B * H * Q * K * (d + dv); }
  // weights: q k^T again
  double weights_flops() const { return 2.0 * B * H * Q * K * d; }
  // backward: dV = P^T dO, dP = dO v^T, dQ = dS k, dK = dS^T q
  double backward_flops() const { return 4.0 * B * H * Q * K * (d + dv); }
};

namespace cases_detail {

template <class T, size_t N>
T pick(Generator& g, const T (&values)[N]) {
  return values[g.below(N)];
}
inline LengthKind length_kind_of(uint64_t i) {
  return i == 0 ? LengthKind::None : i == 1 ? LengthKind::PerBatch : LengthKind::PerQuery;
}
// A case of `family` with B, then H = Hkv, drawn from 1..most.
inline Case small_batch(const char* family, Generator& g, uint64_t most) {
  Case c;
  c.family = family;
  c.B = 1 + static_cast<int64_t>(g.below(most));
  c.H = c.Hkv = 1 + static_cast<int64_t>(g.below(most));
  return c;
}
// The cases, each changed by edit(case, g) in turn, g one generator seeded
// with seed: how a family is made from random_cases.
template <class Edit>
std::vector<Case> edited(std::vector<Case> cases, uint64_t seed, Edit edit) {
  Generator g(seed);
  for (Case& c : cases) edit(c, g);
  return cases;
}
// Causal a third of the time, top left or bottom right alike.
inline Causal some_causal(Generator& g) {
  if (g.below(3) != 0) return Causal::None;
  return g.below(2) ? Causal::TopLeft : Causal::BottomRight;
}
// No key or pair mask (lengths as they are).
inline void without_masks(Case& c) { c.key_keep = c.key_bias = c.pair_keep = c.pair_bias = false; }

}  // namespace cases_detail

// Lengths one off the fused kernel's tiles (64/48 queries/keys for AVX-512,
// 16/48 AVX2, 8/32 portable, and their 16-, 8- and 4-query vectors), primes,
// a single query or key; odd head widths. Every third case per-batch and
// per-query lengths, every fifth dropout.
inline std::vector<Case> tile_edge_cases() {
  using cases_detail::pick;
  const int64_t lengths[] = {1, 2, 5, 7, 15, 16, 17, 31, 47, 48, 49, 63, 64, 65, 97, 129, 211, 300};
  const int64_t widths[] = {1, 3, 8, 17, 20, 33, 64, 65};
  Generator g(1234);
  std::vector<Case> cases;
  for (int i = 0; i < 90; ++i) {
    Case c = cases_detail::small_batch("tile-edges", g, 3);
    c.Q = pick(g, lengths);
    c.K = pick(g, lengths);
    c.d = pick(g, widths);
    c.dv = g.below(3) == 0 ? pick(g, widths) : c.d;
    c.length_kind = cases_detail::length_kind_of(static_cast<uint64_t>(i % 3));
    c.dropout = i % 5 == 4 ? 0.3f : 0.0f;
    c.seed = g.next();
    cases.push_back(c);
  }
  return cases;
}

// The backward's grid: every (Q, K) of {1, 2, 7, 13} x {1, 3, 11, 17}, each
// kind of length, with and without dropout; B, H, d, dv drawn small.
inline std::vector<Case> backward_grid_cases() {
  Generator g(7);
  std::vector<Case> cases;
  for (int64_t Q : {1, 2, 7, 13})
    for (int64_t K : {1, 3, 11, 17})
      for (uint64_t kind = 0; kind < 3; ++kind)
        for (float dropout : {0.0f, 0.3f}) {
          Case c = cases_detail::small_batch("backward-grid", g, 3);
          c.Q = Q;
          c.K = K;
          c.d = 1 + static_cast<int64_t>(g.below(9));
          c.dv = 1 + static_cast<int64_t>(g.below(9));
          c.length_kind = cases_detail::length_kind_of(kind);
          c.dropout = dropout;
          c.input_range = 2.0f;
          c.seed = g.next();
          cases.push_back(c);
        }
  return cases;
}

// Every option alone, with each kind of length, on shapes that straddle the
// tiles (K over two key tiles a third of the time).
inline std::vector<Case> single_option_cases() {
  using cases_detail::pick;
  const int64_t lengths[] = {1, 3, 17, 47, 49, 64, 65, 97, 130, 161};
  const int64_t widths[] = {3, 8, 17, 20, 33, 64};
  Generator g(2024);
  std::vector<Case> cases;
  for (uint64_t kind = 0; kind < 3; ++kind)
    for (int option = 0; option < 12; ++option) {
      Case c = cases_detail::small_batch("one-option", g, 2);
      c.Q = pick(g, lengths);
      c.K = g.below(3) == 0 ? 100 + static_cast<int64_t>(g.below(120)) : pick(g, lengths);
      c.d = pick(g, widths);
      c.dv = g.below(3) == 0 ? pick(g, widths) : c.d;
      c.length_kind = cases_detail::length_kind_of(kind);
      switch (option) {
        case 0: break;  // none: the chapter's call
        case 1: c.key_keep = true; break;
        case 2: c.key_bias = true; break;
        case 3: c.pair_keep = true; break;
        case 4: c.pair_keep = c.pair_per_head = true; break;
        case 5: c.pair_bias = true; break;
        case 6: c.pair_bias = c.pair_per_head = true; break;
        case 7: c.causal = g.below(2) ? Causal::TopLeft : Causal::BottomRight; break;
        case 8: c.fill = MaskFill::NegInf; break;
        case 9: c.fully_masked = FullyMaskedRows::Zeros; break;
        case 10:
          c.Hkv = g.below(2) ? 1 : 2;
          c.H = c.Hkv * (2 + static_cast<int64_t>(g.below(2)));
          break;
        case 11: c.dropout = 0.3f; break;
      }
      c.seed = g.next();
      cases.push_back(c);
    }
  return cases;
}

// Shapes named for what they exercise: more queries than one tile with
// per-query lengths, more keys than two tiles, a single key; zero lengths
// everywhere; K far above Q.
inline std::vector<Case> named_cases() {
  std::vector<Case> cases;
  auto add = [&](int64_t B, int64_t H, int64_t Q, int64_t K, int64_t d, int64_t dv, LengthKind kind,
                 float dropout, std::vector<float> lens = {}) {
    Case c;
    c.family = "named";
    c.B = B, c.H = c.Hkv = H, c.Q = Q, c.K = K, c.d = d, c.dv = dv;
    c.length_kind = kind;
    c.dropout = dropout;
    c.lens = std::move(lens);
    c.seed = static_cast<uint64_t>(cases.size() + 1);
    cases.push_back(c);
  };
  add(3, 4, 50, 67, 16, 16, LengthKind::PerQuery, 0.0f);
  add(2, 3, 129, 33, 20, 20, LengthKind::PerBatch, 0.0f);
  add(2, 2, 5, 300, 7, 7, LengthKind::None, 0.0f);
  add(2, 3, 150, 131, 64, 64, LengthKind::PerQuery, 0.2f);
  add(2, 2, 9, 70, 8, 8, LengthKind::PerBatch, 0.0f, {0.0f, 33.0f});  // row 0: uniform over all keys
  add(2, 1, 3, 77, 8, 8, LengthKind::PerBatch, 0.0f, {0.0f, 0.0f});   // every row uniform
  add(3, 2, 6, 10, 5, 3, LengthKind::PerBatch, 0.5f, {4.0f, 1.0f, 7.5f});
  return cases;
}

// n cases with shapes and options all drawn: B <= 3, Hkv <= 3 dividing H <= 9,
// Q and K from tile edges and primes (K over two key tiles a fifth of the
// time), d and dv from odd widths; each mask option about half the time,
// lengths a third each kind, dropout a third.
inline std::vector<Case> random_cases(uint64_t seed, int n) {
  using cases_detail::pick;
  const int64_t lengths[] = {1, 2, 3, 5, 7, 16, 17, 31, 33, 47, 49, 65, 97};
  const int64_t widths[] = {1, 2, 3, 5, 8, 9, 17, 20, 33};
  Generator g(seed);
  auto coin = [&](double prob) { return g.uniform() < prob; };
  std::vector<Case> cases;
  for (int i = 0; i < n; ++i) {
    Case c;
    c.family = "random";
    c.B = 1 + static_cast<int64_t>(g.below(3));
    c.Hkv = 1 + static_cast<int64_t>(g.below(3));
    c.H = c.Hkv * (1 + static_cast<int64_t>(g.below(3)));
    c.Q = pick(g, lengths);
    c.K = g.below(5) == 0 ? 100 + static_cast<int64_t>(g.below(120)) : pick(g, lengths);
    c.d = pick(g, widths);
    c.dv = coin(0.5) ? c.d : pick(g, widths);
    c.length_kind = cases_detail::length_kind_of(g.below(3));
    c.key_keep = coin(0.5);
    c.key_bias = coin(0.4);
    if (coin(0.6)) {
      c.pair_per_head = coin(0.5);
      c.pair_keep = coin(0.7);
      c.pair_bias = coin(0.5);
    }
    c.causal = static_cast<Causal>(g.below(3));
    c.fill = coin(0.5) ? MaskFill::Seed : MaskFill::NegInf;
    c.fully_masked = coin(0.5) ? FullyMaskedRows::Uniform : FullyMaskedRows::Zeros;
    c.dropout = coin(1.0 / 3) ? 0.3f : 0.0f;
    c.input_range = 2.0f;
    c.seed = g.next();
    cases.push_back(c);
  }
  return cases;
}

// random_cases(seed, n) with a sliding window on each: left only, right
// only or both sides, each side 0, a few keys, about half the keys, or wider
// than both axes; a third of the cases on long axes (several key tiles of
// every instruction set, so that whole tiles fall outside the windows), a
// quarter with no other mask but the window (the fused kernel's path
// without a masking pass), causal a third of the time.
inline std::vector<Case> window_cases(uint64_t seed, int n) {
  return cases_detail::edited(random_cases(seed, n), seed ^ 0x77696e646f77ull, [](Case& c, Generator& g) {
    c.family = "window";
    if (g.below(3) == 0) {
      c.Q = 100 + static_cast<int64_t>(g.below(200));
      c.K = 200 + static_cast<int64_t>(g.below(300));
      c.B = 1 + static_cast<int64_t>(g.below(2));
    }
    if (g.below(4) == 0) {
      cases_detail::without_masks(c);
      c.length_kind = LengthKind::None;
    }
    c.causal = cases_detail::some_causal(g);
    auto side = [&]() -> int64_t {
      switch (g.below(5)) {
        case 0: return 0;
        case 1: return 1 + static_cast<int64_t>(g.below(5));
        case 2: return static_cast<int64_t>(g.below(static_cast<uint64_t>(c.K / 2 + 1)));
        case 3: return c.K + c.Q + static_cast<int64_t>(g.below(5));  // wider than both axes
        default: return 10 + static_cast<int64_t>(g.below(60));
      }
    };
    const uint64_t sides = g.below(3);  // left only, right only, both
    c.window_left = sides == 1 ? -1 : side();
    c.window_right = sides == 0 ? -1 : side();
  });
}

// random_cases(seed, n) made packed batches (MaskOptions::doc_offsets): B = 1,
// Q = K, the rows cut into documents of one kind per case: one document,
// every document of length 1, random lengths, random lengths with empty
// documents among them (and at either end), or a few long ones (a third of
// the cases on long axes, so that key tiles fall outside every query's
// document); a window a quarter of the time, causal a third.
inline std::vector<Case> document_cases(uint64_t seed, int n) {
  return cases_detail::edited(random_cases(seed, n), seed ^ 0x646f6373ull, [](Case& c, Generator& g) {
    c.family = "documents";
    c.B = 1;
    // One batch row: a fully masked one (no length, no kept key) leaves the
    // case without score gradients, so lengths and key_keep come less often.
    if (g.below(2) == 0) c.length_kind = LengthKind::None;
    if (g.below(2) == 0) c.key_keep = false;
    if (g.below(3) == 0) c.Q = 150 + static_cast<int64_t>(g.below(250));
    c.K = c.Q;
    c.lens.clear();
    c.key_keep_values.clear();
    c.causal = cases_detail::some_causal(g);
    if (g.below(4) == 0) {
      c.window_left = static_cast<int64_t>(g.below(8));
      c.window_right = g.below(2) ? -1 : static_cast<int64_t>(g.below(8));
    }
    const int64_t T = c.Q;
    std::vector<int64_t>& o = c.doc_offsets;
    o = {0};
    switch (g.below(5)) {
      case 0: break;  // one document
      case 1:         // every document of length 1
        for (int64_t x = 1; x < T; ++x) o.push_back(x);
        break;
      case 2:
      case 3: {  // random lengths (1..~T/3), empty documents among them in case 3
        const bool empties = o.size() == 1 && g.below(2) == 0;
        if (empties) o.push_back(0);
        for (int64_t at = 0; at < T;) {
          at += 1 + static_cast<int64_t>(g.below(static_cast<uint64_t>(T / 3 + 1)));
          if (at >= T) break;
          o.push_back(at);
          if (empties && g.below(4) == 0) o.push_back(at);
        }
        break;
      }
      default:  // a few long documents
        for (int64_t x = 1; x < 3; ++x)
          if (x * T / 3 > 0) o.push_back(x * T / 3);
        break;
    }
    o.push_back(T);
    if (g.below(5) == 0) o.push_back(T);  // an empty last document
    // The score options a third of the time (they apply within each document).
    if (g.below(3) == 0) {
      c.softcap = g.below(2) ? 0.5f : 0.0f;
      c.alibi = g.below(2) != 0;
      c.sinks = g.below(2) != 0;
    }
  });
}

// The score options (softcap, ALiBi, sinks) on random_cases and
// window_cases, each option about half the time (at least one per case),
// with each other and with every mask, length, grouped heads and dropout:
// softcap small (0.5: most scores clipped) or large (50: nearly linear);
// a fifth of the cases with no other mask (the fused kernel's path without
// a masking pass), a third on long axes with a window (tiles skipped).
inline std::vector<Case> score_cases(uint64_t seed, int n) {
  std::vector<Case> cases = random_cases(seed, n - n / 3);
  const std::vector<Case> windows = window_cases(seed + 1, n / 3);
  cases.insert(cases.end(), windows.begin(), windows.end());
  return cases_detail::edited(std::move(cases), seed ^ 0x73636f7265ull, [](Case& c, Generator& g) {
    const float caps[] = {0.5f, 2.0f, 50.0f};
    c.family = c.family == "window" ? "scores+window" : "scores";
    do {
      c.softcap = g.below(2) ? caps[g.below(3)] : 0.0f;
      c.alibi = g.below(2) != 0;
      c.sinks = g.below(2) != 0;
    } while (!c.score_options());
    if (g.below(5) == 0) {
      cases_detail::without_masks(c);
      if (c.family == "scores") c.causal = Causal::None;
    }
  });
}

}  // namespace mha::kernels
