// src/nn/ring_rows.cpp: see nn/ring_rows.h.
#include "nn/ring_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "kernels/dispatch.h"
#include "kernels/softmax_merge.h"

namespace mha::nn {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// log2(e) in float, as the fused kernel scales natural logits (cpu/fused/limits.h).
constexpr float kLog2e = 1.4426950408889634f;

// Rows [row, row + n) of one batch row and head of a [B, L, H*d] buffer as a
// (1, 1, n, d) view.
TensorView rows_view(const float* base, int64_t L, int64_t Hd, int64_t b, int64_t h, int64_t d, int64_t row,
                     int64_t n) {
  TensorView v;
  v.data = const_cast<float*>(base) + (b * L + row) * Hd + h * d;
  v.rank = 4;
  v.shape[0] = 1, v.shape[1] = 1, v.shape[2] = n, v.shape[3] = d;
  v.stride[0] = L * Hd, v.stride[1] = d, v.stride[2] = Hd, v.stride[3] = 1;
  return v;
}

// A (1, 1, n, d) view of a contiguous [n, d] scratch buffer, zeroed (the
// backward overwrites its outputs but skips rows with no key in the pair).
TensorView zeroed_view(std::vector<float>& buf, int64_t n, int64_t d) {
  buf.assign(static_cast<size_t>(n * d), 0.0f);
  TensorView v;
  v.data = buf.data();
  v.rank = 4;
  v.shape[0] = 1, v.shape[1] = 1, v.shape[2] = n, v.shape[3] = d;
  v.stride[0] = n * d, v.stride[1] = n * d, v.stride[2] = d, v.stride[3] = 1;
  return v;
}

}  // namespace

RingRows::RingRows(RingRowsSpec spec) : s_(std::move(spec)) {
  for (const Piece& p : s_.q_pieces)
    for (int64_t x = p.begin; x < p.begin + p.size; ++x) position_.push_back(x);
  Qr_ = static_cast<int64_t>(position_.size());
  Hd_ = s_.H * s_.d;
  if (s_.all_heads == 0) s_.all_heads = s_.H;
  if (const uint8_t* keep = s_.masks.key_padding_mask.keep_data()) {  // prefix counts, once per call
    kept_prefix_.assign(static_cast<size_t>(s_.B * (s_.K + 1)), 0);
    for (int64_t b = 0; b < s_.B; ++b)
      for (int64_t j = 0; j < s_.K; ++j)
        kept_prefix_[static_cast<size_t>(b * (s_.K + 1) + j + 1)] =
            kept_prefix_[static_cast<size_t>(b * (s_.K + 1) + j)] + (keep[b * s_.K + j] != 0);
  }
  for (int64_t b = 0; b < s_.B; ++b)
    for (int64_t i = 0; i < Qr_; ++i) {
      const auto [first, last] = live_range(b, i);
      live_.emplace_back(first, last);
      nowhere_.push_back(first > last || kept(b, first, last) == 0);
    }
}

std::pair<int64_t, int64_t> RingRows::live_range(int64_t b, int64_t i) const {
  const int64_t K = s_.K, x = position_[static_cast<size_t>(i)];
  const int64_t diag = x + K - s_.Q;  // bottom right over the whole attention
  int64_t first = 0, last = K - 1;
  if (s_.masks.causal == Causal::TopLeft) last = std::min(last, x);
  if (s_.masks.causal == Causal::BottomRight) last = std::min(last, diag);
  const Window& w = s_.masks.window;
  if (w.left >= 0 && w.left < diag) first = diag - w.left;
  if (w.right >= 0 && w.right < K - diag) last = std::min(last, diag + w.right);
  const float n = s_.lens.at(b, i);  // key j is live iff float(j) < n
  if (n < static_cast<float>(K)) last = std::min(last, static_cast<int64_t>(std::ceil(n)) - 1);
  if (!s_.doc_offsets.empty()) {  // [begin, end) of the document holding x
    const auto it = std::upper_bound(s_.doc_offsets.begin(), s_.doc_offsets.end(), x);
    first = std::max(first, *(it - 1));
    last = std::min(last, *it - 1);
  }
  return {first, last};
}

int64_t RingRows::kept(int64_t b, int64_t from, int64_t to) const {
  if (from > to) return 0;
  if (kept_prefix_.empty()) return to - from + 1;
  const int64_t* row = kept_prefix_.data() + b * (s_.K + 1);
  return row[to + 1] - row[from];
}

bool RingRows::skippable(const Pair& p) const {
  for (int64_t i = p.q_row; i < p.q_row + p.n; ++i) {
    const size_t at = static_cast<size_t>(p.b * Qr_ + i);
    if (nowhere_[at]) return false;  // its weights span every key
    const int64_t lo = std::max(live_[at].first, p.kp.begin);
    const int64_t hi = std::min(live_[at].second, p.kp.begin + p.kp.size - 1);
    if (kept(p.b, lo, hi) > 0) return false;
  }
  return true;  // adds exactly nothing (see the file comment of dist/ring_attention.h)
}

template <class Each>
void RingRows::each_pair(const std::vector<Piece>& k_pieces, bool count, const Each& each) {
  int64_t Kb = 0;
  for (const Piece& kp : k_pieces) Kb += kp.size;
  int64_t k_row = 0, piece = 0;
  for (const Piece& kp : k_pieces) {
    int64_t q_row = 0;
    for (const Piece& qp : s_.q_pieces) {
      for (int64_t b = 0; b < s_.B && kp.size > 0; ++b)
        for (int64_t t = 0; t < qp.size; t += kTile) {
          const Pair p{b, q_row + t, qp.begin + t, std::min(kTile, qp.size - t), kp, k_row, Kb, piece};
          const bool skip = skippable(p);
          if (count) ++tiles_.tiles, tiles_.skipped += skip;
          if (!skip) each(p);
        }
      q_row += qp.size;
    }
    k_row += kp.size;
    ++piece;
  }
}

void RingRows::pair_masks(const Pair& p) {
  // Lengths and the causal limit over global positions become per-query
  // lengths over the piece's keys (L - begin is exact in float for L >=
  // begin, and any L below masks the whole piece either way).
  const Causal causal = s_.masks.causal;
  pair_lens_ = !s_.lens.is_none() || causal != Causal::None;
  if (pair_lens_) {
    lens_buf_.resize(static_cast<size_t>(p.n));
    for (int64_t i = 0; i < p.n; ++i) {
      const int64_t x = p.x0 + i;
      float n = s_.lens.is_none() ? kInf : s_.lens.at(p.b, p.q_row + i) - static_cast<float>(p.kp.begin);
      if (causal != Causal::None) {
        const int64_t last = causal == Causal::TopLeft ? x : x + s_.K - s_.Q;
        n = std::min(n, static_cast<float>(last - p.kp.begin + 1));
      }
      lens_buf_[static_cast<size_t>(i)] = std::max(n, 0.0f);
    }
  }
  // Documents: a (n, K_piece) keep mask, the same for every head (B = 1),
  // only where some query's document ends inside the piece.
  pair_keep_ = false;
  for (int64_t i = 0; i < p.n && !s_.doc_offsets.empty() && !pair_keep_; ++i) {
    const auto it = std::upper_bound(s_.doc_offsets.begin(), s_.doc_offsets.end(), p.x0 + i);
    pair_keep_ = p.kp.begin < *(it - 1) || p.kp.begin + p.kp.size > *it;
  }
  if (pair_keep_) {
    keep_buf_.assign(static_cast<size_t>(p.n * p.kp.size), 0);
    for (int64_t i = 0; i < p.n; ++i) {
      const auto it = std::upper_bound(s_.doc_offsets.begin(), s_.doc_offsets.end(), p.x0 + i);
      for (int64_t j = std::max(*(it - 1), p.kp.begin); j < std::min(*it, p.kp.begin + p.kp.size); ++j)
        keep_buf_[static_cast<size_t>(i * p.kp.size + j - p.kp.begin)] = 1;
    }
  }
}

kernels::AttentionForward RingRows::pair_params(const Pair& p, int64_t h, const float* k, const float* v) {
  kernels::AttentionForward f;
  f.q = rows_view(q_, Qr_, Hd_, p.b, h, s_.d, p.q_row, p.n);
  f.k = rows_view(k, p.Kb, Hd_, p.b, h, s_.d, p.k_row, p.kp.size);
  f.v = rows_view(v, p.Kb, Hd_, p.b, h, s_.d, p.k_row, p.kp.size);
  f.scale_divisor = s_.scale_divisor;
  f.precision = s_.precision;
  if (pair_lens_) {
    f.length_kind = kernels::LengthKind::PerQuery;
    f.lens = lens_buf_.data();
  }
  kernels::MaskOptions& m = f.masks;
  if (const uint8_t* keep = s_.masks.key_padding_mask.keep_data()) {
    m.key_keep = keep + p.b * s_.K + p.kp.begin;
    m.key_stride_b = s_.K;
  }
  if (pair_keep_) m.pair_keep = keep_buf_.data(), m.pair_stride_b = m.pair_stride_h = 0;
  // The window and ALiBi over global positions: the pair's diagonal moved
  // to where the whole attention's diagonal falls among its keys.
  m.window_left = s_.masks.window.left, m.window_right = s_.masks.window.right;
  m.diagonal_shift = (p.x0 + s_.K - s_.Q) - p.kp.begin - (p.kp.size - p.n);
  const ScoreOptions& scores = s_.masks.scores;
  m.softcap = scores.softcap;
  if (!scores.alibi_slopes.empty()) m.alibi_slopes = scores.alibi_slopes.data() + s_.first_head + h;
  m.fill = s_.fill;
  m.fully_masked = s_.masks.fully_masked_rows;
  f.dropout = s_.dropout;
  if (f.dropout.active())
    f.dropout.frame = {1, p.n, p.kp.size, p.b, s_.first_head + h, p.x0, p.kp.begin, s_.all_heads, s_.Q, s_.K};
  return f;
}

void RingRows::begin_forward(const float* q) {
  q_ = q;
  const size_t rows = static_cast<size_t>(s_.B * s_.H * Qr_);
  acc_.assign(static_cast<size_t>(s_.B * Qr_ * Hd_), 0.0f);
  row_max2_.assign(rows, -kInf);
  row_sum_.assign(rows, 0.0f);
  block_out_.resize(acc_.size());
  block_stats_.resize(2 * rows);
  tiles_ = RingTiles();
}

void RingRows::add_block(const float* k, const float* v, const std::vector<Piece>& k_pieces) {
  const int64_t rows = s_.B * s_.H * Qr_;
  const size_t first_piece = piece_stats_.size();
  if (s_.weights)
    for (const Piece& kp : k_pieces) {
      std::vector<float> stats(static_cast<size_t>(2 * rows), 0.0f);
      std::fill(stats.begin(), stats.begin() + rows, -kInf);
      piece_stats_.emplace_back(kp, std::move(stats));
    }
  each_pair(k_pieces, true, [&](const Pair& p) {
    pair_masks(p);
    for (int64_t h = 0; h < s_.H; ++h) {
      kernels::AttentionForward f = pair_params(p, h, k, v);
      f.out = rows_view(block_out_.data(), Qr_, Hd_, p.b, h, s_.d, p.q_row, p.n);
      const int64_t st = (p.b * s_.H + h) * Qr_ + p.q_row;
      f.stats = {block_stats_.data() + st, block_stats_.data() + rows + st};
      if (s_.weights) w_pair_.resize(static_cast<size_t>(p.n * p.kp.size)), f.weights = w_pair_.data();
      (void)kernels::attention_forward(AttentionKernel::Fused, f);  // the fused kernel: K_b within its limit (the caller's check)
      if (s_.progress) s_.progress();
      for (int64_t i = 0; i < p.n; ++i) {
        const size_t at_st = static_cast<size_t>(st + i);
        const int64_t at = (p.b * Qr_ + p.q_row + i) * Hd_ + h * s_.d;
        const float m_b = block_stats_[at_st], s_b = block_stats_[static_cast<size_t>(rows) + at_st];
        if (s_.weights) {
          std::vector<float>& ps = piece_stats_[first_piece + static_cast<size_t>(p.piece)].second;
          ps[at_st] = m_b, ps[static_cast<size_t>(rows) + at_st] = s_b;
          std::copy(w_pair_.data() + i * p.kp.size, w_pair_.data() + (i + 1) * p.kp.size,
                    s_.weights + static_cast<int64_t>(at_st) * s_.K + p.kp.begin);
        }
        // A row with no live key so far sums its pieces' outputs times their
        // key counts (each gives it the policy's weights over its own keys,
        // dropout included); the first piece with a live key replaces that
        // sum (merge_block scales what is there by 0).
        if (m_b == -kInf && row_max2_[at_st] == -kInf) {
          for (int64_t x = 0; x < s_.d; ++x) acc_[at + x] += static_cast<float>(p.kp.size) * block_out_[at + x];
          continue;
        }
        kernels::merge_block({acc_.data() + at, row_max2_[at_st], row_sum_[at_st]}, block_out_.data() + at, m_b, s_b,
                             s_.d);
      }
    }
  });
}

void RingRows::finish(float* out) {
  const int64_t rows = s_.B * s_.H * Qr_;
  const std::vector<float>& sinks = s_.masks.scores.sinks;
  // Each head's sink joins every row's denominator once, after the blocks
  // (as one process's kernel adds it after its keys). A row with no live key
  // anywhere (M = -inf: each piece gave it the policy) then puts all its
  // weight on the sink: merge_sink zeroes its sum of the pieces' outputs.
  if (!sinks.empty())
    for (int64_t b = 0; b < s_.B; ++b)
      for (int64_t h = 0; h < s_.H; ++h)
        for (int64_t i = 0; i < Qr_; ++i) {
          const size_t st = static_cast<size_t>((b * s_.H + h) * Qr_ + i);
          kernels::merge_sink({acc_.data() + (b * Qr_ + i) * Hd_ + h * s_.d, row_max2_[st], row_sum_[st]},
                              sinks[static_cast<size_t>(s_.first_head + h)] * kLog2e, s_.d);
        }
  // Normalise; a row with no live key anywhere gets uniform weights over
  // every key (the chapter's -1e6 fill, or the policy) or zeros.
  const bool zeros = s_.masks.fully_masked_rows == FullyMaskedRows::Zeros;
  const float uniform = zeros ? 0.0f : 1.0f / static_cast<float>(s_.K);
  for (int64_t b = 0; b < s_.B; ++b)
    for (int64_t h = 0; h < s_.H; ++h)
      for (int64_t i = 0; i < Qr_; ++i) {
        const size_t st = static_cast<size_t>((b * s_.H + h) * Qr_ + i);
        float* arow = acc_.data() + (b * Qr_ + i) * Hd_ + h * s_.d;
        const bool live = kernels::finish_row({arow, row_max2_[st], row_sum_[st]}, s_.d);
        if (!live) {
          row_sum_[st] = 1.0f;  // the statistics of a fully masked row
          for (int64_t x = 0; x < s_.d; ++x) arow[x] = zeros ? 0.0f : arow[x] / static_cast<float>(s_.K);
        }
        if (!s_.weights) continue;
        float* w = s_.weights + static_cast<int64_t>(st) * s_.K;
        if (!live) {
          std::fill(w, w + s_.K, uniform);
          continue;
        }
        for (const auto& [kp, ps] : piece_stats_) {  // each piece's weights were normalised over its own keys
          const float m_b = ps[st];
          const float scale =
              m_b == -kInf ? 0.0f : ps[static_cast<size_t>(rows) + st] * std::exp2(m_b - row_max2_[st]) / row_sum_[st];
          for (int64_t j = kp.begin; j < kp.begin + kp.size; ++j) w[j] *= scale;
        }
      }
  std::copy(acc_.begin(), acc_.end(), out);
  acc_ = std::vector<float>();  // the caller keeps the output
  block_out_ = std::vector<float>();
  block_stats_ = std::vector<float>();
  piece_stats_.clear();
}

void RingRows::begin_backward(const float* out, const float* grad_out) {
  out_ = out;
  grad_out_ = grad_out;
  dq_.assign(static_cast<size_t>(s_.B * Qr_ * Hd_), 0.0f);
  // The kernels read grad_out itself unless some row has no live key
  // anywhere (its dO is rescaled per piece): a copy only then.
  d_live_.clear();
  if (std::find(row_max2_.begin(), row_max2_.end(), -kInf) != row_max2_.end())
    d_live_.assign(grad_out, grad_out + dq_.size());
}

void RingRows::backward_block(const float* k, const float* v, const std::vector<Piece>& k_pieces, float* dk,
                              float* dv) {
  int64_t Kb = 0;
  for (const Piece& kp : k_pieces) Kb += kp.size;
  const size_t kv_size = static_cast<size_t>(s_.B * Kb * Hd_);
  std::fill(dk, dk + kv_size, 0.0f);
  std::fill(dv, dv + kv_size, 0.0f);
  const float* d_out = d_live_.empty() ? grad_out_ : d_live_.data();
  each_pair(k_pieces, false, [&](const Pair& p) {  // a skipped pair has weights 0: adds nothing
    pair_masks(p);
    for (int64_t h = 0; h < s_.H; ++h) {
      const int64_t st = (p.b * s_.H + h) * Qr_ + p.q_row;
      // Rows with no live key anywhere have constant scores: each value
      // gets the policy's weight 1/K times their dO, and the pair's kernel
      // weighs them 1/K_piece over its keys.
      for (int64_t i = 0; i < p.n; ++i)
        if (row_max2_[static_cast<size_t>(st + i)] == -kInf) {  // then d_live_ is a copy
          const int64_t at = (p.b * Qr_ + p.q_row + i) * Hd_ + h * s_.d;
          for (int64_t x = 0; x < s_.d; ++x)
            d_live_[static_cast<size_t>(at + x)] =
                grad_out_[at + x] * static_cast<float>(p.kp.size) / static_cast<float>(s_.K);
        }
      kernels::AttentionBackward g;
      g.fwd = pair_params(p, h, k, v);
      g.fwd.out = rows_view(out_, Qr_, Hd_, p.b, h, s_.d, p.q_row, p.n);
      g.fwd.stats = {row_max2_.data() + st, row_sum_.data() + st};
      g.stats_span_more_keys = true;
      g.grad_out = rows_view(d_out, Qr_, Hd_, p.b, h, s_.d, p.q_row, p.n);
      // One (batch row, head) of the pair at a time in small scratch
      // buffers, added to the sums over pairs.
      g.grad_q = zeroed_view(dq_pair_, p.n, s_.d);
      g.grad_k = zeroed_view(dk_pair_, p.kp.size, s_.d);
      g.grad_v = zeroed_view(dv_pair_, p.kp.size, s_.d);
      kernels::attention_backward(AttentionKernel::Fused, g);
      if (s_.progress) s_.progress();
      for (int64_t i = 0; i < p.n; ++i) {
        const float* from = dq_pair_.data() + i * s_.d;
        float* to = dq_.data() + (p.b * Qr_ + p.q_row + i) * Hd_ + h * s_.d;
        for (int64_t x = 0; x < s_.d; ++x) to[x] += from[x];
      }
      for (int64_t j = 0; j < p.kp.size; ++j) {
        const int64_t at = (p.b * Kb + p.k_row + j) * Hd_ + h * s_.d;
        for (int64_t x = 0; x < s_.d; ++x) {
          dk[at + x] += dk_pair_[static_cast<size_t>(j * s_.d + x)];
          dv[at + x] += dv_pair_[static_cast<size_t>(j * s_.d + x)];
        }
      }
    }
  });
}

std::vector<double> RingRows::sinks_grad_share() const {
  std::vector<double> share(static_cast<size_t>(s_.H), 0.0);
  const std::vector<float>& sinks = s_.masks.scores.sinks;
  if (sinks.empty()) return share;
  // dL/d sink_h = -sum over rows of the sink's weight 2^(t - M) / S (the
  // merged statistics hold it) times D = dO . O.
  for (int64_t h = 0; h < s_.H; ++h) {
    const float t = sinks[static_cast<size_t>(s_.first_head + h)] * kLog2e;
    double part = 0.0;
    for (int64_t b = 0; b < s_.B; ++b)
      for (int64_t i = 0; i < Qr_; ++i) {
        const size_t st = static_cast<size_t>((b * s_.H + h) * Qr_ + i);
        const int64_t at = (b * Qr_ + i) * Hd_ + h * s_.d;
        double D = 0.0;
        for (int64_t x = 0; x < s_.d; ++x) D += static_cast<double>(grad_out_[at + x]) * out_[at + x];
        part -= static_cast<double>(std::exp2(t - row_max2_[st]) / row_sum_[st]) * D;
      }
    share[static_cast<size_t>(h)] = part;
  }
  return share;
}

}  // namespace mha::nn
