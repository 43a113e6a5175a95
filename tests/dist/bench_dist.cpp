// mha_dist_bench: times one forward (and forward + backward) of the
// single-process module, HeadParallelAttention and RingAttention on the same
// self-attention problem, in evaluation mode, one thread per rank:
//
//   mpirun -np 2 build/tests/dist/mha_dist_bench [B L num_hiddens num_heads reps]
//   mpirun -np 4 build/tests/dist/mha_dist_bench B L num_hiddens num_heads --plan
//
// Prints rank 0's median over `reps` calls (after one warm-up), each call
// timed from a barrier to the slowest rank's end, and the ring's overlap:
// per rank, the time of its steps (compute, then waiting for the next
// block) over the time computing, the largest over the ranks (1.00: the
// transfers hid entirely behind the compute).
//
// --plan runs nothing: it prints the bytes one forward plans with mha's
// memory accounting (src/core/memory.h, what a call checks against
// mha::memory_limit() before it allocates) for the single-process module
// and for the largest rank share of the ring (read off the memory error of
// a call made under a 1-byte limit, which refuses before allocating).
// --peak runs one evaluation-mode forward of each (the module on rank 0,
// then the ring on every rank) and prints how far each raised the process's
// resident peak (VmHWM, reset before each call through /proc/self/clear_refs)
// above its resident size before the call: the memory the call really
// touched, to set beside the planned bytes.
// Not a test: CTest does not run it.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <functional>
#include <vector>

#include "mha/dist.h"
#include "mha/mha.h"

namespace {

using namespace mha;

double median_ms(const dist::Communicator& c, int reps, const std::function<void()>& call) {
  call();  // warm-up: buffers, the lazy parts
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    c.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    call();
    c.barrier();  // the slowest rank's end
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor randn(Shape shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t(std::move(shape));
  for (float& x : t.values()) x = static_cast<float>(gen.normal());
  return t;
}

Tensor rows(const Tensor& x, int64_t begin, int64_t n) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  Tensor out({B, n, D});
  for (int64_t b = 0; b < B; ++b)
    std::copy(x.data() + (b * L + begin) * D, x.data() + (b * L + begin + n) * D, out.data() + b * n * D);
  return out;
}

// The bytes `call` plans: its memory error under a 1-byte limit says "needs N bytes".
uint64_t planned_bytes(const std::function<void()>& call) {
  const uint64_t saved = memory_limit();
  set_memory_limit(1);
  std::string message;
  try {
    call();
  } catch (const Error& e) {
    message = e.what();
  }
  set_memory_limit(saved);
  const size_t at = message.find("needs ");
  return at == std::string::npos ? 0 : std::strtoull(message.c_str() + at + 6, nullptr, 10);
}

// A field of /proc/self/status in KiB (VmRSS, VmHWM); -1 if unreadable.
long status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::atol(line.c_str() + key.size() + 1);
  return -1;
}

// MiB by which `call` raised the resident peak above the resident size before it.
double peak_growth_mib(const std::function<void()>& call) {
  { std::ofstream("/proc/self/clear_refs") << "5"; }  // VmHWM <- VmRSS
  const long before = status_kib("VmRSS");
  call();
  return static_cast<double>(status_kib("VmHWM") - before) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  const dist::Communicator c = dist::Communicator::world();
  const int64_t B = argc > 1 ? std::atoll(argv[1]) : 2, L = argc > 2 ? std::atoll(argv[2]) : 1024,
                D = argc > 3 ? std::atoll(argv[3]) : 256, H = argc > 4 ? std::atoll(argv[4]) : 8;
  const bool plan = argc > 5 && std::string(argv[5]) == "--plan";
  const bool peak = argc > 5 && std::string(argv[5]) == "--peak";
  const int reps = argc > 5 && !plan && !peak ? std::atoi(argv[5]) : 5;
  set_num_threads(1);
  MultiHeadAttention m(D, H, 0.0f, true, 1);
  m.initialize(D, D, D);
  m.eval();
  const Tensor X = randn({B, L, D}, 2), grad = randn({B, L, D}, 3);
  const auto [begin, n] = dist::RingAttention::block_of(L, c.size(), c.rank());
  const Tensor Xr = rows(X, begin, n), gradr = rows(grad, begin, n);

  dist::RingAttention ring(c, D, H, m.state_dict());
  if (plan) {  // evaluation mode, both: nothing kept for a backward
    ring.eval();
    const uint64_t one = c.rank() == 0 ? planned_bytes([&] { m.forward(X, X, X); }) : 0;
    const uint64_t mine = planned_bytes([&] { ring.forward(Xr, Xr, Xr, {}, Causal::TopLeft); });
    const std::vector<int64_t> all = c.all_gather(static_cast<int64_t>(mine));
    const int64_t most = *std::max_element(all.begin(), all.end());
    if (c.rank() == 0)
      std::printf("ranks %d, B %lld, L %lld, num_hiddens %lld, heads %lld: bytes one forward plans\n"
                  "  single process                  %12llu  (%.1f MiB)\n"
                  "  ring, the largest rank share    %12lld  (%.1f MiB) = %.3f of one process\n"
                  "  target 1/3 of one process + 64 MiB: %.1f MiB, %s\n",
                  c.size(), static_cast<long long>(B), static_cast<long long>(L), static_cast<long long>(D),
                  static_cast<long long>(H), static_cast<unsigned long long>(one), one / 1048576.0,
                  static_cast<long long>(most), most / 1048576.0, static_cast<double>(most) / static_cast<double>(one),
                  one / 3.0 / 1048576.0 + 64, static_cast<double>(most) <= one / 3.0 + 64 * 1048576.0 ? "met" : "missed");
    return 0;
  }
  if (peak) {
    ring.eval();
    c.barrier();
    const double one = c.rank() == 0 ? peak_growth_mib([&] { m.forward(X, X, X); }) : 0.0;
    c.barrier();
    const double mine = peak_growth_mib([&] { ring.forward(Xr, Xr, Xr); });
    const std::vector<int64_t> all = c.all_gather(static_cast<int64_t>(mine * 1024));
    const double most = static_cast<double>(*std::max_element(all.begin(), all.end())) / 1024.0;
    const uint64_t planned = ring.stats().planned_bytes;
    if (c.rank() == 0)
      std::printf("ranks %d, B %lld, L %lld, num_hiddens %lld, heads %lld: resident peak growth of one forward\n"
                  "  single process                  %9.1f MiB\n"
                  "  ring, the largest rank          %9.1f MiB (rank 0 planned %.1f MiB)\n",
                  c.size(), static_cast<long long>(B), static_cast<long long>(L), static_cast<long long>(D),
                  static_cast<long long>(H), one, most, static_cast<double>(planned) / 1048576.0);
    return 0;
  }
  dist::HeadParallelAttention heads(c, D, H, m.state_dict());
  heads.eval();
  const int G = c.size() % 2 == 0 && H % 2 == 0 ? 2 : 1;
  dist::GridAttention grid(c, G, D, H, m.state_dict());
  const auto [gq, gn] = grid.query_block(L);
  const Tensor Xg = rows(X, gq, gn);
  const double t_one = median_ms(c, reps, [&] { if (c.rank() == 0) m.forward(X, X, X); });
  const double t_heads = median_ms(c, reps, [&] { heads.forward(X, X, X); });
  const double t_ring = median_ms(c, reps, [&] { ring.forward(Xr, Xr, Xr, {}, Causal::TopLeft); });
  // The ring's overlap: this rank's step time over its compute time, and
  // the tiles its causal mask let it skip (the last call's).
  const dist::RingStats stats = ring.stats();
  const double t_ring_full = median_ms(c, reps, [&] { ring.forward(Xr, Xr, Xr); });
  const dist::RingStats full = ring.stats();
  const double t_grid = median_ms(c, reps, [&] { grid.forward(Xg, Xg, Xg, {}, Causal::TopLeft); });
  heads.train();
  const double t_heads_b = median_ms(c, reps, [&] {
    heads.forward(X, X, X);
    heads.backward(grad);
  });
  const double t_ring_b_full = median_ms(c, reps, [&] {
    ring.forward(Xr, Xr, Xr);
    ring.backward(gradr);
  });
  const double t_ring_b = median_ms(c, reps, [&] {
    ring.forward(Xr, Xr, Xr, {}, Causal::TopLeft);
    ring.backward(gradr);
  });
  // The fused kernel alone on one block of the same size (Q_r queries, K_r
  // keys, no mask): a ring of one rank (its own communicator) computes just
  // that block; beside it, the ring's own compute per block (no mask).
  const dist::Communicator alone = c.split(c.rank(), 0);
  dist::RingAttention one_block(alone, D, H, m.state_dict());
  one_block.eval();
  double block_s = 1e30;
  for (int i = 0; i < reps + 1; ++i) {
    one_block.forward(Xr, Xr, Xr);
    block_s = std::min(block_s, one_block.stats().compute_seconds);
  }
  const std::vector<int64_t> ring_block_us = c.all_gather(static_cast<int64_t>(1e6 * full.compute_seconds / c.size()));
  const std::vector<int64_t> fused_block_us = c.all_gather(static_cast<int64_t>(1e6 * block_s));
  double worst_block = 0;
  for (int r = 0; r < c.size(); ++r)
    worst_block = std::max(worst_block, static_cast<double>(ring_block_us[static_cast<size_t>(r)]) /
                                            static_cast<double>(fused_block_us[static_cast<size_t>(r)]));
  ring.train();
  const double t_one_b = median_ms(c, reps, [&] {
    if (c.rank() != 0) return;
    m.train();
    m.forward(X, X, X);
    m.backward(grad);
    m.eval();
  });
  // Per rank: step time / compute time (no mask, every tile computed); the largest.
  const std::vector<int64_t> ratio = c.all_gather(static_cast<int64_t>(1000.0 * full.step_seconds / full.compute_seconds));
  const std::vector<int64_t> skipped = c.all_gather(stats.tiles_skipped);
  const std::vector<int64_t> tiles = c.all_gather(stats.tiles);
  int64_t skipped_all = 0, tiles_all = 0;
  for (int r = 0; r < c.size(); ++r) skipped_all += skipped[static_cast<size_t>(r)], tiles_all += tiles[static_cast<size_t>(r)];
  if (c.rank() == 0)
    std::printf("ranks %d, B %lld, L %lld, num_hiddens %lld, heads %lld (median of %d, ms)\n"
                "  single process forward          %9.2f\n"
                "  heads  forward                  %9.2f\n"
                "  ring   forward (causal)         %9.2f   (%lld of %lld tiles skipped)\n"
                "  ring   forward (no mask)        %9.2f   (steps / compute, the largest rank: %.3f)\n"
                "  grid   forward (causal, G %d)    %9.2f\n"
                "  heads  forward + backward       %9.2f\n"
                "  ring   forward + backward (causal)  %9.2f\n"
                "  ring   forward + backward (no mask) %9.2f\n"
                "  single process forward + backward   %9.2f\n"
                "  ring/single: forward (causal) %.2f, (no mask) %.2f; forward + backward (no mask) %.2f\n"
                "  ring block compute / the fused kernel on one such block (no mask, the largest rank): %.2f\n",
                c.size(), static_cast<long long>(B), static_cast<long long>(L), static_cast<long long>(D),
                static_cast<long long>(H), reps, t_one, t_heads, t_ring, static_cast<long long>(skipped_all),
                static_cast<long long>(tiles_all), t_ring_full,
                *std::max_element(ratio.begin(), ratio.end()) / 1000.0, G, t_grid, t_heads_b, t_ring_b, t_ring_b_full,
                t_one_b, t_ring / t_one, t_ring_full / t_one, t_ring_b_full / t_one_b, worst_block);
  return 0;
}
