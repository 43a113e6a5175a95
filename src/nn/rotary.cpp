// Rotary position embeddings (src/nn/rotary.h, mha/rotary.h).
#include "nn/rotary.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "mha/error.h"
#include "mha/threads.h"

namespace mha {

void check_rotary(const char* op, const Rotary& r, int64_t head_dim) {
  if (r.dims == 0) return;
  if (head_dim < 0 && (r.dims < 0 || r.dims % 2 != 0))
    fail(op, "dims: ", r.dims, "; wanted an even number >= 0 (the rotated entries of each head)");
  if (head_dim >= 0 && (r.dims < 0 || r.dims % 2 != 0 || r.dims > head_dim))
    fail(op, "rotary dims: ", r.dims, "; wanted an even number in [0, head_dim = ", head_dim,
         "] (the rotated entries of each head)");
  if (!(r.base > 1.0f) || !std::isfinite(r.base))
    fail(op, "rotary base: ", r.base, "; wanted a finite number > 1 (10000 in RoFormer and LLaMA 2)");
}

namespace nn {

void rotary_frequencies(const Rotary& r, float* theta) {
  // Hugging Face: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), in float32.
  for (int64_t m = 0; m < r.dims / 2; ++m) {
    const float exponent = static_cast<float>(2 * m) / static_cast<float>(r.dims);
    theta[m] = 1.0f / std::pow(r.base, exponent);
  }
}

namespace {

// Rotates the pairs of one row by the angles of cos_a / sin_a (minus them
// when inverse). One loop per layout, without a branch inside, so that the
// compiler vectorises it (the half layout reads two contiguous runs); each
// entry's arithmetic is the same in either case, so bits do not change.
inline void rotate(float* row, const Rotary& r, const float* cos_a, const float* sin_a, bool inverse) {
  const int64_t half = r.dims / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  if (r.layout == Rotary::Layout::Half) {  // pairs (x[m], x[m + dims/2])
    float* __restrict lo = row;
    float* __restrict hi = row + half;
    for (int64_t m = 0; m < half; ++m) {
      const float c = cos_a[m], s = sign * sin_a[m];
      const float x1 = lo[m], x2 = hi[m];
      lo[m] = x1 * c - x2 * s;
      hi[m] = x2 * c + x1 * s;
    }
  } else {  // pairs (x[2m], x[2m + 1])
    for (int64_t m = 0; m < half; ++m) {
      const float c = cos_a[m], s = sign * sin_a[m];
      const float x1 = row[2 * m], x2 = row[2 * m + 1];
      row[2 * m] = x1 * c - x2 * s;
      row[2 * m + 1] = x2 * c + x1 * s;
    }
  }
}

}  // namespace

void rotate_row_reference(float* row, int64_t position, const Rotary& r, bool inverse) {
  std::vector<float> theta(static_cast<size_t>(r.dims / 2)), c(theta.size()), s(theta.size());
  rotary_frequencies(r, theta.data());
  for (size_t m = 0; m < theta.size(); ++m) {
    const float angle = static_cast<float>(position) * theta[m];
    c[m] = std::cos(angle);
    s[m] = std::sin(angle);
  }
  rotate(row, r, c.data(), s.data(), inverse);
}

RotaryTable::RotaryTable(const Rotary& r, int64_t p_lo, int64_t p_hi)
    : r_(r), p_lo_(p_lo), half_(r.dims / 2), P_(std::max<int64_t>(p_hi - p_lo, 0)) {
  if (!r.enabled() || P_ == 0) return;
  std::vector<float> theta(static_cast<size_t>(half_));
  rotary_frequencies(r, theta.data());
  cs_.resize(static_cast<size_t>(2 * half_ * P_));
  float* const cos_a = cs_.data();
  float* const sin_a = cs_.data() + half_ * P_;
  const int64_t half = half_;
  core::parallel_for(P_, core::team_for(static_cast<double>(P_) * half * 40, P_), [&](int64_t i) {
    for (int64_t m = 0; m < half; ++m) {
      const float angle = static_cast<float>(p_lo + i) * theta[static_cast<size_t>(m)];
      cos_a[i * half + m] = std::cos(angle);
      sin_a[i * half + m] = std::sin(angle);
    }
  });
}

void RotaryTable::rotate_heads(float* row, int64_t heads, int64_t d, int64_t position, bool inverse) const {
  const int64_t i = position - p_lo_;
  const float* c = cs_.data() + i * half_;
  const float* s = cs_.data() + (P_ + i) * half_;
  for (int64_t h = 0; h < heads; ++h) rotate(row + h * d, r_, c, s, inverse);
}

void rotary_positions(const int64_t* first, int64_t B, int64_t rows, int64_t& p_lo, int64_t& p_hi) {
  p_lo = 0, p_hi = rows;
  if (!first || B <= 0) return;
  p_lo = first[0], p_hi = first[0] + rows;
  for (int64_t b = 1; b < B; ++b) p_lo = std::min(p_lo, first[b]), p_hi = std::max(p_hi, first[b] + rows);
}

void apply_rotary(const TensorView& x, int64_t rows, const Rotary& r, const int64_t* first, bool inverse) {
  if (!r.enabled() || rows <= 0) return;
  // The cosines and sines of the call's positions, once for every batch row
  // and head (an uncached call: 0..rows-1; a cached one: the rows' new
  // positions, each row's starting at its cached length).
  int64_t p_lo = 0, p_hi = 0;
  rotary_positions(first, x.shape[0], rows, p_lo, p_hi);
  apply_rotary(x, rows, RotaryTable(r, p_lo, p_hi), first, inverse);
}

void apply_rotary(const TensorView& x, int64_t rows, const RotaryTable& table, const int64_t* first, bool inverse) {
  if (!table.enabled() || rows <= 0) return;
  const int64_t B = x.shape[0], heads = x.shape[1];
  // One (batch row, head) per task; each element is written by one thread:
  // any thread count gives the same bits.
  const double work = static_cast<double>(B) * heads * rows * table.rotary().dims * 3;
  core::parallel_for(B * heads, core::team_for(work, B * heads), [&](int64_t bh) {
    const int64_t b = bh / heads, h = bh % heads;
    const int64_t p0 = first ? first[b] : 0;
    for (int64_t i = 0; i < rows; ++i)
      table.rotate_heads(x.data + b * x.stride[0] + h * x.stride[1] + i * x.stride[2], 1, 0, p0 + i, inverse);
  });
}

}  // namespace nn
}  // namespace mha
