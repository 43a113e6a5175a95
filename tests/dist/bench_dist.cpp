// mha_dist_bench: times one forward (and forward + backward) of the
// single-process module, HeadParallelAttention and RingAttention on the same
// self-attention problem, in evaluation mode, one thread per rank:
//
//   mpirun -np 2 build/tests/dist/mha_dist_bench [B L num_hiddens num_heads reps]
//
// Prints rank 0's median over `reps` calls (after one warm-up), each call
// timed from a barrier to the slowest rank's end. Not a test: CTest does not
// run it.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  const dist::Communicator c = dist::Communicator::world();
  const int64_t B = argc > 1 ? std::atoll(argv[1]) : 2, L = argc > 2 ? std::atoll(argv[2]) : 1024,
                D = argc > 3 ? std::atoll(argv[3]) : 256, H = argc > 4 ? std::atoll(argv[4]) : 8;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 5;
  set_num_threads(1);
  MultiHeadAttention m(D, H, 0.0f, true, 1);
  m.initialize(D, D, D);
  m.eval();
  const Tensor X = randn({B, L, D}, 2), grad = randn({B, L, D}, 3);
  const auto [begin, n] = dist::RingAttention::block_of(L, c.size(), c.rank());
  const Tensor Xr = rows(X, begin, n), gradr = rows(grad, begin, n);

  dist::HeadParallelAttention heads(c, D, H, m.state_dict());
  heads.eval();
  dist::RingAttention ring(c, D, H, m.state_dict());
  const double t_one = median_ms(c, reps, [&] { if (c.rank() == 0) m.forward(X, X, X); });
  const double t_heads = median_ms(c, reps, [&] { heads.forward(X, X, X); });
  const double t_ring = median_ms(c, reps, [&] { ring.forward(Xr, Xr, Xr, {}, Causal::TopLeft); });
  heads.train();
  const double t_heads_b = median_ms(c, reps, [&] {
    heads.forward(X, X, X);
    heads.backward(grad);
  });
  const double t_ring_b = median_ms(c, reps, [&] {
    ring.forward(Xr, Xr, Xr, {}, Causal::TopLeft);
    ring.backward(gradr);
  });
  if (c.rank() == 0)
    std::printf("ranks %d, B %lld, L %lld, num_hiddens %lld, heads %lld (median of %d, ms)\n"
                "  single process forward          %9.2f\n"
                "  heads  forward                  %9.2f\n"
                "  ring   forward (causal)         %9.2f\n"
                "  heads  forward + backward       %9.2f\n"
                "  ring   forward + backward       %9.2f\n",
                c.size(), static_cast<long long>(B), static_cast<long long>(L), static_cast<long long>(D),
                static_cast<long long>(H), reps, t_one, t_heads, t_ring, t_heads_b, t_ring_b);
  return 0;
}
