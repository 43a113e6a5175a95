// mha::dist from the installed package, run under mpirun: the d2l chapter's
// MultiHeadAttention with the sequence split over the ranks (ring attention)
// gives each rank its rows of the one-process output.
//
//   mpirun -np 2 ./dist_check
//
// Exit status 0 on every rank when its rows match the one-process module to 1e-5.
#include <cmath>
#include <cstdio>

#include <mha/dist.h>
#include <mha/mha.h>

int main(int argc, char** argv) {
  mha::dist::Environment mpi(argc, argv);
  const mha::dist::Communicator world = mha::dist::Communicator::world();
  const int64_t num_hiddens = 16, num_heads = 4, B = 2, L = 9;

  mha::MultiHeadAttention whole(num_hiddens, num_heads, 0.0f, false, /*seed=*/7);
  whole.eval();
  mha::Tensor X({B, L, num_hiddens});
  for (int64_t i = 0; i < X.numel(); ++i) X.data()[i] = std::sin(0.37f * static_cast<float>(i));
  const mha::ValidLens lens = mha::ValidLens::per_batch({7.0f, 9.0f});
  const mha::Tensor want = whole(X, X, X, lens);

  mha::dist::RingAttention ring(world, num_hiddens, num_heads, whole.state_dict());
  const auto [begin, n] = mha::dist::RingAttention::block_of(L, world.size(), world.rank());
  mha::Tensor mine({B, n, num_hiddens});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < num_hiddens; ++d) mine.at({b, t, d}) = X.at({b, begin + t, d});
  const mha::Tensor out = ring.forward(mine, mine, mine, lens);

  float worst = 0.0f;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < num_hiddens; ++d)
        worst = std::fmax(worst, std::fabs(out.at({b, t, d}) - want.at({b, begin + t, d})));
  std::printf("mha::dist rank %d of %d: rows %lld..%lld, largest difference %.2g: %s\n", world.rank(),
              world.size(), static_cast<long long>(begin), static_cast<long long>(begin + n),
              static_cast<double>(worst), worst <= 1e-5f ? "ok" : "MISMATCH");
  return worst <= 1e-5f ? 0 : 1;
}
