// src/kernels/ring_rows.cpp: see kernels/ring_rows.h.
#include "kernels/ring_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "kernels/dispatch.h"
#include "kernels/softmax_merge.h"

namespace mha::kernels {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

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

// A (1, 1, n, d) view of a contiguous [n, d] scratch buffer.
TensorView scratch_view(std::vector<float>& buf, int64_t n, int64_t d) {
  buf.resize(static_cast<size_t>(n * d));
  TensorView v;
  v.data = buf.data();
  v.rank = 4;
  v.shape[0] = 1, v.shape[1] = 1, v.shape[2] = n, v.shape[3] = d;
  v.stride[0] = n * d, v.stride[1] = n * d, v.stride[2] = d, v.stride[3] = 1;
  return v;
}

}  // namespace

RingRows::RingRows(RingRowsSpec spec) : s_(std::move(spec)) {
  for (const Piece& p : s_.q_pieces) Qr_ += p.size;
  Hd_ = s_.H * s_.d;
  if (s_.key_keep)  // each row's first kept key, once (not per query and block)
    for (int64_t b = 0; b < s_.B; ++b) {
      const uint8_t* keep = s_.key_keep + b * s_.K;
      first_kept_.push_back(std::find(keep, keep + s_.K, uint8_t{1}) - keep);
    }
}

int64_t RingRows::position(int64_t i) const {
  for (const Piece& p : s_.q_pieces) {
    if (i < p.size) return p.begin + i;
    i -= p.size;
  }
  return -1;
}

int64_t RingRows::last_key(int64_t b, int64_t x) const {
  int64_t last = s_.K - 1;
  if (s_.causal) last = std::min(last, x);
  if (!s_.lens.empty()) {
    const float n = s_.lens[static_cast<size_t>(b)];  // key j is live iff float(j) < n
    if (n < static_cast<float>(s_.K)) last = std::min(last, static_cast<int64_t>(std::ceil(n)) - 1);
  }
  return last;
}

bool RingRows::masked_anywhere(int64_t b, int64_t x) const {
  const int64_t last = last_key(b, x);
  if (last < 0) return true;
  return s_.key_keep && first_kept_[static_cast<size_t>(b)] > last;
}

bool RingRows::skippable(int64_t b, const Piece& qp, int64_t q_row, const Piece& kp) const {
  (void)q_row;
  for (int64_t x = qp.begin; x < qp.begin + qp.size; ++x)
    if (masked_anywhere(b, x) || last_key(b, x) >= kp.begin) return false;
  return true;
}

void RingRows::pair_lengths(int64_t b, int64_t q_row, const Piece& qp, const Piece& kp) {
  if (s_.lens.empty() && !s_.causal) return;
  for (int64_t i = 0; i < qp.size; ++i) {
    float n = s_.lens.empty() ? kInf : s_.lens[static_cast<size_t>(b)] - static_cast<float>(kp.begin);
    if (s_.causal) n = std::min(n, static_cast<float>(qp.begin + i - kp.begin + 1));
    lens_buf_[static_cast<size_t>(b * Qr_ + q_row + i)] = n;
  }
}

AttentionForward RingRows::pair_params(int64_t b, int64_t h, int64_t q_row, const Piece& qp, const float* k,
                                       const float* v, int64_t Kb, int64_t k_row, const Piece& kp) {
  AttentionForward p;
  p.q = rows_view(q_, Qr_, Hd_, b, h, s_.d, q_row, qp.size);
  p.k = rows_view(k, Kb, Hd_, b, h, s_.d, k_row, kp.size);
  p.v = rows_view(v, Kb, Hd_, b, h, s_.d, k_row, kp.size);
  p.scale_divisor = s_.scale_divisor;
  p.precision = s_.precision;
  if (!s_.lens.empty() || s_.causal) {  // per-query lengths over the piece's keys
    p.length_kind = LengthKind::PerQuery;
    p.lens = lens_buf_.data() + b * Qr_ + q_row;
  }
  if (s_.key_keep) {
    p.masks.key_keep = s_.key_keep + b * s_.K + kp.begin;
    p.masks.key_stride_b = s_.K;
  }
  p.masks.fill = s_.fill;
  p.masks.fully_masked = s_.fully_masked;
  p.dropout = s_.dropout;
  if (p.dropout.active())
    p.dropout.frame = {1,        qp.size,   kp.size, b, s_.first_head + h, qp.begin, kp.begin,
                       s_.all_heads > 0 ? s_.all_heads : s_.H, s_.Q, s_.K};
  return p;
}

void RingRows::begin_forward(const float* q) {
  q_ = q;
  const size_t rows = static_cast<size_t>(s_.B * s_.H * Qr_);
  acc_.assign(static_cast<size_t>(s_.B * Qr_ * Hd_), 0.0f);
  row_max2_.assign(rows, -kInf);
  row_sum_.assign(rows, 0.0f);
  block_out_.resize(acc_.size());
  block_stats_.resize(2 * rows);
  lens_buf_.resize(static_cast<size_t>(s_.B * Qr_));
}

void RingRows::add_block(const float* k, const float* v, const std::vector<Piece>& k_pieces) {
  int64_t Kb = 0;
  for (const Piece& kp : k_pieces) Kb += kp.size;
  const int64_t rows = s_.B * s_.H * Qr_;
  int64_t k_row = 0;
  for (const Piece& kp : k_pieces) {
    int64_t q_row = 0;
    for (const Piece& qp : s_.q_pieces) {
      for (int64_t b = 0; b < s_.B; ++b) {
        if (qp.size == 0 || kp.size == 0 || skippable(b, qp, q_row, kp)) continue;  // adds exactly nothing
        pair_lengths(b, q_row, qp, kp);
        for (int64_t h = 0; h < s_.H; ++h) {
          AttentionForward p = pair_params(b, h, q_row, qp, k, v, Kb, k_row, kp);
          p.out = rows_view(block_out_.data(), Qr_, Hd_, b, h, s_.d, q_row, qp.size);
          const int64_t st = (b * s_.H + h) * Qr_ + q_row;
          p.stats = {block_stats_.data() + st, block_stats_.data() + rows + st};
          (void)attention_forward(AttentionKernel::Fused, p);
          for (int64_t i = 0; i < qp.size; ++i) {
            const size_t at_st = static_cast<size_t>(st + i);
            const int64_t at = (b * Qr_ + q_row + i) * Hd_ + h * s_.d;
            const float m_b = block_stats_[at_st], s_b = block_stats_[static_cast<size_t>(rows) + at_st];
            if (m_b == -kInf && row_max2_[at_st] == -kInf) {  // no live key yet: the policy's sum
              for (int64_t x = 0; x < s_.d; ++x) acc_[at + x] += static_cast<float>(kp.size) * block_out_[at + x];
              continue;
            }
            merge_block({acc_.data() + at, row_max2_[at_st], row_sum_[at_st]}, block_out_.data() + at, m_b, s_b,
                        s_.d);
          }
        }
      }
      q_row += qp.size;
    }
    k_row += kp.size;
  }
}

void RingRows::finish(float* out) {
  const bool zeros = s_.fully_masked == FullyMaskedRows::Zeros;
  for (int64_t b = 0; b < s_.B; ++b)
    for (int64_t h = 0; h < s_.H; ++h)
      for (int64_t i = 0; i < Qr_; ++i) {
        const size_t st = static_cast<size_t>((b * s_.H + h) * Qr_ + i);
        float* arow = acc_.data() + (b * Qr_ + i) * Hd_ + h * s_.d;
        if (!finish_row({arow, row_max2_[st], row_sum_[st]}, s_.d)) {
          row_sum_[st] = 1.0f;  // the statistics of a fully masked row
          for (int64_t x = 0; x < s_.d; ++x) arow[x] = zeros ? 0.0f : arow[x] / static_cast<float>(s_.K);
        }
      }
  std::copy(acc_.begin(), acc_.end(), out);
  acc_ = std::vector<float>();  // the caller keeps the output
  block_out_ = std::vector<float>();
  block_stats_ = std::vector<float>();
}

void RingRows::begin_backward(const float* out, const float* grad_out) {
  out_ = out;
  grad_out_ = grad_out;
  dq_.assign(static_cast<size_t>(s_.B * Qr_ * Hd_), 0.0f);
  // The kernels read grad_out itself unless some row has no live key
  // anywhere (its dO is rescaled per pair): a copy only then.
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
  int64_t k_row = 0;
  for (const Piece& kp : k_pieces) {
    int64_t q_row = 0;
    for (const Piece& qp : s_.q_pieces) {
      for (int64_t b = 0; b < s_.B; ++b) {
        if (qp.size == 0 || kp.size == 0 || skippable(b, qp, q_row, kp)) continue;  // weights 0 there
        pair_lengths(b, q_row, qp, kp);
        for (int64_t h = 0; h < s_.H; ++h) {
          const int64_t st = (b * s_.H + h) * Qr_ + q_row;
          // Rows with no live key anywhere have constant scores: each value
          // gets the policy's weight 1/K times their dO, and the pair's
          // kernel weighs them 1/K_piece over its keys.
          for (int64_t i = 0; i < qp.size; ++i)
            if (row_max2_[static_cast<size_t>(st + i)] == -kInf) {  // then d_live_ is a copy
              const int64_t at = (b * Qr_ + q_row + i) * Hd_ + h * s_.d;
              for (int64_t x = 0; x < s_.d; ++x)
                d_live_[static_cast<size_t>(at + x)] =
                    grad_out_[at + x] * static_cast<float>(kp.size) / static_cast<float>(s_.K);
            }
          AttentionBackward p;
          p.fwd = pair_params(b, h, q_row, qp, k, v, Kb, k_row, kp);
          p.fwd.out = rows_view(out_, Qr_, Hd_, b, h, s_.d, q_row, qp.size);
          p.fwd.stats = {row_max2_.data() + st, row_sum_.data() + st};
          p.stats_span_more_keys = true;
          p.grad_out = rows_view(d_out, Qr_, Hd_, b, h, s_.d, q_row, qp.size);
          // One (batch row, head) of the pair at a time in small scratch
          // buffers, added to the sums over pairs (the kernel overwrites its
          // outputs and skips rows with no key in the pair: zeros first).
          p.grad_q = scratch_view(dq_pair_, qp.size, s_.d);
          p.grad_k = scratch_view(dk_pair_, kp.size, s_.d);
          p.grad_v = scratch_view(dv_pair_, kp.size, s_.d);
          std::fill(dq_pair_.begin(), dq_pair_.end(), 0.0f);
          std::fill(dk_pair_.begin(), dk_pair_.end(), 0.0f);
          std::fill(dv_pair_.begin(), dv_pair_.end(), 0.0f);
          attention_backward(AttentionKernel::Fused, p);
          for (int64_t i = 0; i < qp.size; ++i) {
            const float* from = dq_pair_.data() + i * s_.d;
            float* to = dq_.data() + (b * Qr_ + q_row + i) * Hd_ + h * s_.d;
            for (int64_t x = 0; x < s_.d; ++x) to[x] += from[x];
          }
          for (int64_t j = 0; j < kp.size; ++j) {
            const int64_t at = (b * Kb + k_row + j) * Hd_ + h * s_.d;
            for (int64_t x = 0; x < s_.d; ++x) {
              dk[at + x] += dk_pair_[static_cast<size_t>(j * s_.d + x)];
              dv[at + x] += dv_pair_[static_cast<size_t>(j * s_.d + x)];
            }
          }
        }
      }
      q_row += qp.size;
    }
    k_row += kp.size;
  }
}

}  // namespace mha::kernels
