#include "cpu/gemm/packed_weight.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/bf16.h"
#include "core/parallel.h"
#include "mha/threads.h"

namespace mha::cpu {

namespace {

std::atomic<int64_t> g_packings{0};

// Panels [0, panels) through pack(p0, p1), a few per job on mha's threads.
template <class Pack>
void pack_panels(int64_t panels, const Pack& pack) {
  constexpr int64_t kPanelsPerJob = 4;
  const int64_t jobs = (panels + kPanelsPerJob - 1) / kPanelsPerJob;
  core::parallel_for(jobs, omp_in_parallel() ? 1 : num_threads(), [&](int64_t j) {
    pack(j * kPanelsPerJob, std::min(panels, (j + 1) * kPanelsPerJob));
  });
}

}  // namespace

bool PackedWeight::current() const {
  if (precision == Precision::BFloat16 && (tiles != nullptr) != amx_usable()) return false;
  return !panels || panels->isa() == gemm_isa();
}

int64_t PackedWeight::bytes() const {
  int64_t b = 0;
  if (panels) b += panels->bytes();
  if (tiles) b += tiles->bytes();
  return b;
}

std::shared_ptr<PackedWeight> pack_weight(const float* W, int64_t N, int64_t K, Precision precision) {
  auto out = std::make_shared<PackedWeight>();
  out->precision = precision;
  out->N = N;
  out->K = K;
  if (precision == Precision::BFloat16 && amx_usable()) {
    out->tiles = std::make_unique<PackedBf16B>(K, N);
    PackedBf16B& t = *out->tiles;
    pack_panels(t.panels(), [&](int64_t p0, int64_t p1) { t.pack(true, W, K, p0, p1); });
  } else {
    std::vector<float> rounded;  // the portable bfloat16 path packs the rounded weight
    const float* src = W;
    if (precision == Precision::BFloat16) {
      rounded.resize(static_cast<size_t>(N * K));
      std::transform(W, W + N * K, rounded.begin(), core::round_to_bf16);
      src = rounded.data();
    }
    out->panels = std::make_unique<PackedB>(K, N);
    PackedB& p = *out->panels;
    pack_panels(p.panels(), [&](int64_t p0, int64_t p1) { p.pack(true, src, K, p0, p1); });
  }
  g_packings.fetch_add(1, std::memory_order_relaxed);
  return out;
}

int64_t packed_weight_count() { return g_packings.load(std::memory_order_relaxed); }

}  // namespace mha::cpu
