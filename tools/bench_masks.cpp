// `mha bench --masks`: what causal, key padding and sliding-window masks
// save in the fused kernel, which skips the key tiles outside each query's
// visible keys.
//
// Two levels, each timed with and without the mask in one run:
// - the attention kernel alone (kernels::attention_forward on (B, h,
//   L, d) views): the part masks can save;
// - TorchMultiheadAttention (eval, need_weights=False, as a caller runs it
//   for inference), projections included, on the Fused kernel, and on the
//   BLAS kernel (which materialises every score: what a masked call ran on
//   before the fused kernel honoured masks).
// ms: median wall time after a warm-up call; ratio: masked / unmasked time
// of the same kernel. The window row compares a causal sliding window of 256
// keys before each query (window (256, 0)) with full causal attention (its
// "none" column), kernel alone. The score rows time the softcap (50), ALiBi,
// sinks and all three against none, kernel alone.
#include "bench_masks.h"
#include "bench_progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

// Internal (the bench part, CMakeLists.txt mha_tool_bench): each mask path of
// a kernel is timed alone, below the modules of the public API.
#include "kernels/case_data.h"
#include "kernels/cases.h"
#include "kernels/dispatch.h"
#include "mha/mha.h"

namespace mha::tools {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of f() over >= 3 calls and about `budget` seconds, after one warm-up.
double median_time(const std::function<void()>& f, double budget) {
  f();
  std::vector<double> t;
  const double end = now() + budget;
  while (t.size() < 3 || (now() < end && t.size() < 30)) {
    const double t0 = now();
    f();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor normal(Shape s, Generator& g, float scale = 1.0f) {
  Tensor t(std::move(s));
  for (float& x : t.values()) x = scale * static_cast<float>(g.normal());
  return t;
}

// Key padding averaging 40% kept: row b keeps its first fr[b % 8] * K keys.
std::vector<uint8_t> padding_keep(int64_t B, int64_t K) {
  const double fr[] = {0.15, 0.25, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6};
  std::vector<uint8_t> keep;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = std::max<int64_t>(1, std::lround(static_cast<double>(K) * fr[b % 8]));
    for (int64_t j = 0; j < K; ++j) keep.push_back(j < n);
  }
  return keep;
}

enum class MaskKind { None, Causal, Padding, CausalWindow, Softcap, Alibi, Sinks, AllScores };

// The kernel alone on (B, h, L, d) self-attention views: the shared kernel
// case (kernels/cases.h) of this shape and mask, its buffers drawn by
// kernels/case_data.h.
double kernel_time(int64_t B, int64_t L, int64_t D, int64_t h, MaskKind kind, AttentionKernel kernel,
                   double budget) {
  kernels::Case c;
  c.family = "bench";
  c.B = B, c.H = c.Hkv = h, c.Q = c.K = L, c.d = c.dv = D / h;
  c.fill = kernels::MaskFill::NegInf;  // as PyTorch's masks
  if (kind == MaskKind::Causal || kind == MaskKind::CausalWindow) c.causal = Causal::TopLeft;
  if (kind == MaskKind::CausalWindow) c.window_left = 256, c.window_right = 0;
  // The score options (Gemma 2's softcap 50, ALiBi, sinks), drawn per head by case_data.h.
  if (kind == MaskKind::Softcap || kind == MaskKind::AllScores) c.softcap = 50.0f;
  if (kind == MaskKind::Alibi || kind == MaskKind::AllScores) c.alibi = true;
  if (kind == MaskKind::Sinks || kind == MaskKind::AllScores) c.sinks = true;
  if (kind == MaskKind::Padding) {
    c.key_keep = true;
    c.key_keep_values = padding_keep(B, L);
  }
  c.seed = 1;
  const kernels::CaseData data(c);
  Tensor out = data.new_out();
  kernels::AttentionForward p = data.forward();
  p.out = out.view().split_heads(h);
  Tensor weights;
  if (kernel == AttentionKernel::Blas) {  // the BLAS kernel forms the weights
    weights = data.new_weights();
    p.weights = weights.data();
  }
  return median_time([&] { (void)kernels::attention_forward(kernel, p); }, budget);
}

// TorchMultiheadAttention (E = D, h heads, biases), eval, no weights.
double module_time(int64_t B, int64_t L, int64_t D, int64_t h, MaskKind kind, AttentionKernel kernel,
                   double budget) {
  Generator g(2);
  StateDict s;
  const float w = 1.0f / std::sqrt(static_cast<float>(D));
  s["in_proj_weight"] = normal({3 * D, D}, g, w);
  s["in_proj_bias"] = normal({3 * D}, g, 0.1f);
  s["out_proj.weight"] = normal({D, D}, g, w);
  s["out_proj.bias"] = normal({D}, g, 0.1f);
  TorchMhaOptions batch_first;  // x is (B, L, D)
  batch_first.batch_first = true;
  auto m = TorchMultiheadAttention::from_state_dict(s, h, batch_first);
  m.eval();
  m.set_kernel(kernel);
  const Tensor x = normal({B, L, D}, g);
  Mask kpm;
  if (kind == MaskKind::Padding) {
    std::vector<uint8_t> masked = padding_keep(B, L);
    for (uint8_t& b : masked) b = !b;
    kpm = mask_from_torch_mha({B, L}, masked);
  }
  return median_time([&] { m(x, x, x, kpm, false, {}, true, kind == MaskKind::Causal); }, budget);
}

struct Shape4 {
  const char* name;
  int64_t B, L, D, h;
  MaskKind mask;
};

}  // namespace

void run_mask_bench(const std::vector<int>& threads, double budget) {
  const Shape4 shapes[] = {{"B1 L4096 D512 h8 causal", 1, 4096, 512, 8, MaskKind::Causal},
                           {"B8 L512 D768 h12 keypad40%", 8, 512, 768, 12, MaskKind::Padding}};
  const int saved = num_threads();
  std::printf("\n%-28s %-26s %3s %10s %10s %7s\n", "case", "what", "thr", "none ms", "masked ms",
              "ratio");
  for (int t : threads) {
    set_num_threads(t);
    for (const Shape4& c : shapes) {
      bench_progress("threads=" + std::to_string(t) + " " + c.name);
      const double k0 = kernel_time(c.B, c.L, c.D, c.h, MaskKind::None, AttentionKernel::Fused, budget);
      const double k1 = kernel_time(c.B, c.L, c.D, c.h, c.mask, AttentionKernel::Fused, budget);
      const double m0 = module_time(c.B, c.L, c.D, c.h, MaskKind::None, AttentionKernel::Fused, budget);
      const double m1 = module_time(c.B, c.L, c.D, c.h, c.mask, AttentionKernel::Fused, budget);
      const double b0 = module_time(c.B, c.L, c.D, c.h, MaskKind::None, AttentionKernel::Blas, budget);
      const double b1 = module_time(c.B, c.L, c.D, c.h, c.mask, AttentionKernel::Blas, budget);
      bench_progress_done();
      std::printf("%-28s %-26s %3d %10.2f %10.2f %7.3f\n", c.name, "fused kernel alone", t, k0 * 1e3,
                  k1 * 1e3, k1 / k0);
      std::printf("%-28s %-26s %3d %10.2f %10.2f %7.3f\n", c.name, "TorchMHA module, Fused", t,
                  m0 * 1e3, m1 * 1e3, m1 / m0);
      std::printf("%-28s %-26s %3d %10.2f %10.2f %7.3f\n", c.name, "TorchMHA module, Blas", t,
                  b0 * 1e3, b1 * 1e3, b1 / b0);
      std::printf("%-28s %-26s %3d %10s %10s %7.3f\n", c.name, "masked: Fused / Blas module", t, "",
                  "", m1 / b1);
    }
    // Each score option's cost in the fused forward, kernel alone, against none.
    const struct {
      const char* name;
      MaskKind kind;
    } scores[] = {{"B8 L512 D768 h12 softcap50", MaskKind::Softcap},
                  {"B8 L512 D768 h12 alibi", MaskKind::Alibi},
                  {"B8 L512 D768 h12 sinks", MaskKind::Sinks},
                  {"B8 L512 D768 h12 all three", MaskKind::AllScores}};
    bench_progress("threads=" + std::to_string(t) + " score options");
    const double plain = kernel_time(8, 512, 768, 12, MaskKind::None, AttentionKernel::Fused, budget);
    double with[4];
    for (int x = 0; x < 4; ++x)
      with[x] = kernel_time(8, 512, 768, 12, scores[x].kind, AttentionKernel::Fused, budget);
    bench_progress_done();
    for (int x = 0; x < 4; ++x)
      std::printf("%-28s %-26s %3d %10.2f %10.2f %7.3f\n", scores[x].name, "fused kernel alone", t, plain * 1e3,
                  with[x] * 1e3, with[x] / plain);
    const char* name = "B1 L16384 D256 h4 win(256,0)";
    bench_progress("threads=" + std::to_string(t) + " " + name);
    const double causal = kernel_time(1, 16384, 256, 4, MaskKind::Causal, AttentionKernel::Fused, budget);
    const double window = kernel_time(1, 16384, 256, 4, MaskKind::CausalWindow, AttentionKernel::Fused, budget);
    bench_progress_done();
    std::printf("%-28s %-26s %3d %10.2f %10.2f %7.3f\n", name, "fused kernel, none=causal", t, causal * 1e3,
                window * 1e3, window / causal);
  }
  set_num_threads(saved);
}

}  // namespace mha::tools
