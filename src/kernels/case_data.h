// src/kernels/case_data.h: the buffers of a kernels::Case (kernels/cases.h),
// drawn from its seed, and the parameter structs that view them.
//
// Inputs are laid out as the modules lay them out: (B, L, H*d) buffers seen
// as (B, H, L, d) strided views, so rows of one head are not contiguous.
//   q:(B, Q, H*d)  k:(B, K, Hkv*d)  v:(B, K, Hkv*dv)  grad_out:(B, Q, H*dv)
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cases.h"
#include "kernels/params.h"
#include "mha/random.h"
#include "mha/tensor.h"

namespace mha::kernels {

struct CaseData {
  Case c;
  Tensor q, k, v, grad_out;
  std::vector<float> lens, key_bias, pair_bias;
  std::vector<float> alibi_slopes, sinks;  // [H] each, when the case has them
  std::vector<uint8_t> key_keep, pair_keep;
  uint64_t dropout_key = 0;

  explicit CaseData(const Case& cs) : c(cs) {
    Generator g(c.seed);
    auto fill = [&](Tensor& t, float r) {
      for (float& x : t.values()) x = g.uniform(-r, r);
    };
    q = Tensor({c.B, c.Q, c.H * c.d});
    k = Tensor({c.B, c.K, c.Hkv * c.d});
    v = Tensor({c.B, c.K, c.Hkv * c.dv});
    grad_out = Tensor({c.B, c.Q, c.H * c.dv});
    fill(q, c.input_range);
    fill(k, c.input_range);
    fill(v, 1.0f);
    fill(grad_out, 1.0f);
    draw_lengths(g);
    draw_masks(g);
    dropout_key = g.next();
    draw_score_options();
  }

  // The forward call on this case (out and weights unset: the caller's).
  AttentionForward forward() const {
    AttentionForward p;
    p.q = q.view().split_heads(c.H);
    p.k = k.view().split_heads(c.Hkv);
    p.v = v.view().split_heads(c.Hkv);
    p.length_kind = c.length_kind;
    p.lens = c.length_kind == LengthKind::None ? nullptr : lens.data();
    p.scale_divisor = std::sqrt(static_cast<float>(c.d));
    if (c.dropout > 0) p.dropout = {c.dropout, dropout_key};
    MaskOptions& m = p.masks;
    if (c.key_keep) m.key_keep = key_keep.data();
    if (c.key_bias) m.key_bias = key_bias.data();
    if (c.pair_keep) m.pair_keep = pair_keep.data();
    if (c.pair_bias) m.pair_bias = pair_bias.data();
    if (c.pair_per_head) {
      m.pair_stride_h = c.Q * c.K;
      m.pair_stride_b = c.H * c.Q * c.K;
    }
    m.causal = c.causal;
    m.window_left = c.window_left;
    m.window_right = c.window_right;
    if (!c.doc_offsets.empty()) {
      m.doc_offsets = c.doc_offsets.data();
      m.documents = static_cast<int64_t>(c.doc_offsets.size()) - 1;
    }
    m.fill = c.fill;
    m.fully_masked = c.fully_masked;
    m.softcap = c.softcap;
    if (c.alibi) m.alibi_slopes = alibi_slopes.data();
    if (c.sinks) m.sinks = sinks.data();
    return p;
  }

  Tensor new_out() const { return Tensor({c.B, c.Q, c.H * c.dv}); }          // (B, Q, H*dv)
  Tensor new_weights() const { return Tensor({c.B, c.H, c.Q, c.K}); }        // [B,H,Q,K]
  std::vector<float> new_stats() const { return std::vector<float>(static_cast<size_t>(2 * c.B * c.H * c.Q)); }

 private:
  void draw_lengths(Generator& g) {
    if (c.length_kind == LengthKind::None) return;
    const int64_t n = c.length_kind == LengthKind::PerBatch ? c.B : c.B * c.Q;
    if (!c.lens.empty()) {
      lens = c.lens;
      return;
    }
    const auto K = static_cast<uint64_t>(c.K);
    for (int64_t i = 0; i < n; ++i) {
      // Every kind of length: 0 (uniform over all keys), integer, fractional,
      // exactly K, past K, just below an integer.
      float len = 0.0f;
      switch (g.below(6)) {
        case 0: break;
        case 1: len = static_cast<float>(g.below(K) + 1); break;
        case 2: len = static_cast<float>(g.below(K)) + 0.5f; break;
        case 3: len = static_cast<float>(c.K); break;
        case 4: len = static_cast<float>(c.K) + 7.25f; break;
        case 5: len = static_cast<float>(g.below(K + 1)) * 0.999f; break;
      }
      lens.push_back(len);
    }
  }

  // Per head (from their own stream, so that the other draws do not move):
  // ALiBi slopes BLOOM's 2^(-8 (h+1) / H) or uniform in [-0.3, 0.3] (both
  // signs); sinks in [-3, 3], or dominating (+20) or negligible (-20).
  void draw_score_options() {
    Generator g(c.seed ^ 0x616c696269ull);
    for (int64_t h = 0; h < c.H && c.alibi; ++h)
      alibi_slopes.push_back(g.below(2) ? std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(c.H))
                                        : g.uniform(-0.3f, 0.3f));
    for (int64_t h = 0; h < c.H && c.sinks; ++h) {
      const uint64_t kind = g.below(6);
      sinks.push_back(kind == 0 ? 20.0f : kind == 1 ? -20.0f : g.uniform(-3.0f, 3.0f));
    }
  }

  void draw_masks(Generator& g) {
    auto coin = [&](double prob) { return g.uniform() < prob; };
    const int64_t B = c.B, K = c.K;
    // A row kind per mask row: random, padding (a kept prefix), none kept.
    if (c.key_keep) {
      if (!c.key_keep_values.empty()) {
        key_keep = c.key_keep_values;
      } else {
        for (int64_t b = 0; b < B; ++b) {
          const uint64_t kind = g.below(5);
          const int64_t prefix = static_cast<int64_t>(g.below(static_cast<uint64_t>(K) + 1));
          for (int64_t j = 0; j < K; ++j) key_keep.push_back(kind == 4 ? 0 : kind >= 2 ? j < prefix : coin(0.6));
        }
      }
    }
    // Additive masks: -inf now and then, or a whole row of -inf. (Huge finite
    // biases such as -1e4 are left to worked examples: added to a score they
    // round it to a grid of 1e-3, so a one-ulp difference in the dot product
    // moves a weight by 1e-3 in every kernel, the reference included.)
    auto bias_value = [&](uint64_t kind) -> float {
      if (kind == 3) return -INFINITY;
      return coin(0.2) ? -INFINITY : g.uniform(-3, 3);
    };
    if (c.key_bias)
      for (int64_t b = 0; b < B; ++b) {
        const uint64_t kind = g.below(5);
        for (int64_t j = 0; j < K; ++j) key_bias.push_back(bias_value(kind));
      }
    const int64_t pair_rows = c.pair_per_head ? B * c.H * c.Q : c.Q;
    if (c.pair_keep)
      for (int64_t r = 0; r < pair_rows; ++r) {
        const bool none = g.below(8) == 0;
        for (int64_t j = 0; j < K; ++j) pair_keep.push_back(!none && coin(0.8));
      }
    if (c.pair_bias)
      for (int64_t r = 0; r < pair_rows; ++r) {
        const uint64_t kind = g.below(8);
        for (int64_t j = 0; j < K; ++j) pair_bias.push_back(bias_value(kind < 4 ? 0 : kind - 2));
      }
  }
};

}  // namespace mha::kernels
