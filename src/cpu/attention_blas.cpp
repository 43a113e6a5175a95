// The unfused attention forward: for each (batch row, head) the (Q, K) score
// matrix is one BLAS product, the masked softmax runs over its rows, and the
// output is a second BLAS product. Its cost is the Q x K scratch per head; it
// is the path that materialises attention weights most simply, and the one
// that honours every option of AttentionForward (the fallback of the others).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/blas.h"
#include "kernels/attention_params.h"

namespace mha::kernels {

namespace {

// row:[K] raw scores q.k of query i in (b, h) -> its softmax weights, in place.
void softmax_row(const AttentionForward& p, int64_t b, int64_t h, int64_t i, float* row) {
  const int64_t K = p.K();
  const float len = p.length(b, i);
  const int64_t last = p.causal_last_key(i);  // keys after it are masked
  const uint8_t* key_keep = p.key_keep ? p.key_keep + b * K : nullptr;
  const float* key_bias = p.key_bias ? p.key_bias + b * K : nullptr;
  const uint8_t* pair_keep = p.pair_keep ? p.pair_keep + p.pair_offset(b, h, i) : nullptr;
  const float* pair_bias = p.pair_bias ? p.pair_bias + p.pair_offset(b, h, i) : nullptr;
  const float fill = p.fill_value();
  float row_max = -INFINITY;
  int64_t live = 0;
  for (int64_t j = 0; j < K; ++j) {
    float x = row[j] / p.scale_divisor;
    if (key_bias) x += key_bias[j];
    if (pair_bias) x += pair_bias[j];
    // float(j) < len is the seed's comparison (a length 2.5 keeps key 2).
    const bool keep = static_cast<float>(j) < len && j <= last &&
                      (!key_keep || key_keep[j]) && (!pair_keep || pair_keep[j]);
    if (!keep) x = fill;
    live += keep && x != -INFINITY;
    row[j] = x;
    row_max = std::fmax(row_max, x);
  }
  if (live == 0) {
    const float w = p.fully_masked == FullyMaskedRows::Uniform ? 1.0f / static_cast<float>(K) : 0.0f;
    std::fill(row, row + K, w);
    return;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j) {
    row[j] = std::exp(row[j] - row_max);
    sum += row[j];
  }
  for (int64_t j = 0; j < K; ++j) row[j] /= sum;
}

}  // namespace

void attention_forward_blas(const AttentionForward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  std::vector<float> scratch;
  if (!p.weights) scratch.resize(static_cast<size_t>(Q * K));
  std::vector<float> dropped;
  if (p.dropout.active()) dropped.resize(static_cast<size_t>(Q * K));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = p.kv_head(h);  // grouped heads share k and v
      const uint64_t base = static_cast<uint64_t>((b * H + h) * Q * K);
      float* s = p.weights ? p.weights + base : scratch.data();
      // s:[Q,K] = q_bh:[Q,d] @ k_bhk:[K,d]^T
      cpu::sgemm(false, true, Q, K, d, 1.0f, p.q.ptr(b, h), p.q.stride[2], p.k.ptr(b, hk),
                 p.k.stride[2], 0.0f, s, K);
      for (int64_t i = 0; i < Q; ++i) softmax_row(p, b, h, i, s + i * K);
      const float* pw = s;
      if (p.dropout.active()) {
        for (int64_t x = 0; x < Q * K; ++x) dropped[x] = s[x] * p.dropout.multiplier(base + x);
        pw = dropped.data();
      }
      // out_bh:[Q,dv] = pw:[Q,K] @ v_bhk:[K,dv]
      cpu::sgemm(false, false, Q, dv, K, 1.0f, pw, K, p.v.ptr(b, hk), p.v.stride[2], 0.0f,
                 p.out.ptr(b, h), p.out.stride[2]);
    }
  }
}

}  // namespace mha::kernels
