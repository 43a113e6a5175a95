#include "nn/attention_state.h"

#include <cstring>

#include "kernels/dispatch.h"

namespace mha::nn {

namespace {

// The fused kernel's weights of (rows x heads) from the state's statistics.
Tensor fused_weights(const AttentionState& s, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& heads);

}  // namespace

Tensor all_weights(const AttentionState& s) {
  std::lock_guard lock(s.weights_mutex);
  if (!s.have_all) {
    std::vector<int64_t> rows(static_cast<size_t>(s.B)), heads(static_cast<size_t>(s.H));
    for (int64_t b = 0; b < s.B; ++b) rows[static_cast<size_t>(b)] = b;
    for (int64_t h = 0; h < s.H; ++h) heads[static_cast<size_t>(h)] = h;
    s.weights = fused_weights(s, rows, heads);
    s.have_all = true;
  }
  return s.weights;
}

Tensor weights_of(const AttentionState& s, const std::vector<int64_t>& rows,
                  const std::vector<int64_t>& heads) {
  const int64_t nr = static_cast<int64_t>(rows.size()), nh = static_cast<int64_t>(heads.size());
  {
    std::lock_guard lock(s.weights_mutex);
    if (s.have_all) {
      Tensor out({nr, nh, s.Q, s.K});
      const int64_t block = s.Q * s.K;
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nh; ++j)
          std::memcpy(out.data() + (i * nh + j) * block,
                      s.weights.data() +
                          (rows[static_cast<size_t>(i)] * s.H + heads[static_cast<size_t>(j)]) * block,
                      sizeof(float) * static_cast<size_t>(block));
      return out;
    }
  }
  return fused_weights(s, rows, heads);
}

namespace {

Tensor fused_weights(const AttentionState& s, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& heads) {
  const int64_t nr = static_cast<int64_t>(rows.size()), nh = static_cast<int64_t>(heads.size());
  Tensor out({nr, nh, s.Q, s.K});
  kernels::AttentionWeightsParams p;
  p.fwd.q = s.proj.q.split_heads(s.H);
  p.fwd.k = s.proj.k.split_heads(s.H);
  kernels::set_lengths(p.fwd, s.lens);
  p.fwd.scale_divisor = s.scale_divisor;
  const size_t n = static_cast<size_t>(s.B * s.H * s.Q);
  float* stats = const_cast<float*>(s.stats.data());  // only read
  p.fwd.stats = {stats, stats + n};
  p.batch_rows = rows;
  p.heads = heads;
  p.out = out.data();
  kernels::attention_weights(p);
  return out;
}

}  // namespace

}  // namespace mha::nn
