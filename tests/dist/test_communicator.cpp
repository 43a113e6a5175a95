// mha::dist::Communicator: every rank's part of a collective or a message
// arrives where it should, counts are checked, and a Request completes.
#include <numeric>
#include <string>
#include <vector>

#include "dist_test_util.h"

namespace mha::dist::test {
namespace {

TEST(Communicator, RankAndSizeMatchMpi) {
  const Communicator& c = world();
  EXPECT_GE(c.size(), 1);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  // Every rank appears exactly once.
  const std::vector<int64_t> ranks = c.all_gather(c.rank());
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
}

TEST(Communicator, AllReduceSumsEveryRanksPart) {
  const Communicator& c = world();
  Tensor t({2, 3});
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>((c.rank() + 1) * (i + 1));
  c.all_reduce_sum(t);
  const float ranks_sum = static_cast<float>(c.size() * (c.size() + 1) / 2);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data()[i], ranks_sum * static_cast<float>(i + 1)) << i;
}

TEST(Communicator, BroadcastCopiesTheRoots) {
  const Communicator& c = world();
  const int root = c.size() - 1;
  std::vector<float> v(5, static_cast<float>(c.rank()));
  c.broadcast(v.data(), 5, root);
  for (float x : v) EXPECT_EQ(x, static_cast<float>(root));
}

TEST(Communicator, BroadcastTextCopiesTheRootsWhateverItsLength) {
  const Communicator& c = world();
  const int root = c.size() - 1;
  for (const std::string& text : {std::string(), std::string("rank 0: above the memory limit"),
                                  std::string(100000, 'x')}) {
    // Every other rank offers a different text, longer or shorter than the root's.
    const std::string mine = c.rank() == root ? text : std::string(static_cast<size_t>(c.rank() + 3), 'y');
    EXPECT_EQ(c.broadcast(mine, root), text) << text.size();
  }
  EXPECT_THROW(c.broadcast(std::string("x"), c.size()), Error);
}

TEST(Communicator, RingOfSendsAndReceives) {
  const Communicator& c = world();
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  std::vector<float> mine(4), got(4, -1.0f);
  std::iota(mine.begin(), mine.end(), static_cast<float>(10 * c.rank()));
  // Non-blocking both ways round the ring (a blocking send to the next rank
  // could wait forever for a receive that every rank posts after its send).
  Request in = c.irecv(got.data(), 4, prev, 7);
  Request out = c.isend(mine.data(), 4, next, 7);
  EXPECT_TRUE(in.pending());
  in.wait();
  out.wait();
  EXPECT_FALSE(in.pending());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], static_cast<float>(10 * prev + i));
  // Blocking: even ranks send first, odd ones receive first.
  std::vector<float> back(4, -1.0f);
  if (c.size() > 1) {
    if (c.rank() % 2 == 0) {
      c.send(mine.data(), 4, next, 8);
      c.recv(back.data(), 4, prev, 8);
    } else {
      c.recv(back.data(), 4, prev, 8);
      c.send(mine.data(), 4, next, 8);
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[static_cast<size_t>(i)], static_cast<float>(10 * prev + i));
  }
  c.barrier();
}

TEST(Communicator, CopiesShareOneCommunicator) {
  const Communicator copy = world();
  float x = 1.0f;
  copy.all_reduce_sum(&x, 1);
  EXPECT_EQ(x, static_cast<float>(copy.size()));
}

}  // namespace
}  // namespace mha::dist::test
