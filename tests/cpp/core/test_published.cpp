// mha/detail/published.h: the lock-free state under the modules' calls.
// Published<T>: a pinned value never changes under its reader; a writer
// never makes a reader wait (new pins get a copy of the old value while the
// writer waits for the old pins), and the live object keeps its address.
// KeyStream: keys drawn from many threads are those of some serial order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "mha/detail/published.h"

namespace {

using mha::detail::KeyStream;
using mha::detail::Published;

struct Value {
  std::vector<int> numbers;
};

TEST(Published, AWriterWaitsForPinsWhileNewPinsReadACopyOfTheOldValue) {
  Published<Value> value(Value{{1, 2, 3}});
  const Value* live = &value.live();
  auto old_pin = value.pin();
  ASSERT_EQ(old_pin.get(), live);  // nothing changing: calls read the live object

  std::atomic<bool> written{false};
  std::thread writer([&] {
    value.update([](Value& v) { v.numbers.assign({7, 8}); });
    written = true;
  });
  // The writer publishes a copy first; a pin taken meanwhile is that copy.
  std::shared_ptr<const Value> during;
  do {
    during = value.pin();
  } while (during.get() == live && !written);
  EXPECT_FALSE(written) << "update() finished while a pin of the live object was held";
  EXPECT_NE(during.get(), live);
  EXPECT_EQ(during->numbers, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(old_pin->numbers, (std::vector<int>{1, 2, 3}));  // unchanged under its reader

  old_pin.reset();  // the last reader of the live object lets go
  writer.join();
  EXPECT_TRUE(written);
  EXPECT_EQ(during->numbers, (std::vector<int>{1, 2, 3}));  // a pinned copy outlives the update
  auto after = value.pin();
  EXPECT_EQ(after.get(), live);  // the same object, written in place
  EXPECT_EQ(after->numbers, (std::vector<int>{7, 8}));
}

TEST(Published, AChangeThatThrowsPublishesTheLiveObjectAgain) {
  Published<Value> value(Value{{1}});
  EXPECT_THROW(value.update([](Value&) -> int { throw std::runtime_error("refused"); }), std::runtime_error);
  EXPECT_EQ(value.pin().get(), &value.live());
  EXPECT_EQ(value.pin()->numbers, std::vector<int>{1});
  value.update([](Value& v) { v.numbers.push_back(2); });  // writers still work
  EXPECT_EQ(value.pin()->numbers, (std::vector<int>{1, 2}));
}

TEST(Published, CopiesAreIndependent) {
  Published<Value> a(Value{{1}});
  Published<Value> b = a;
  b.update([](Value& v) { v.numbers[0] = 5; });
  EXPECT_EQ(a.pin()->numbers, std::vector<int>{1});
  EXPECT_EQ(b.pin()->numbers, std::vector<int>{5});
  const Value* a_live = &a.live();
  a = b;  // assignment writes a's live object in place
  EXPECT_EQ(&a.live(), a_live);
  EXPECT_EQ(a.pin()->numbers, std::vector<int>{5});
}

TEST(Published, ManyReadersAndAWriterSeeWholeValues) {
  // Every value the writer publishes is (n, n, n, n); a reader that saw a
  // mixture would have read the live object while it was written.
  Published<Value> value(Value{{0, 0, 0, 0}});
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread writer([&] {
    for (int n = 1; n <= 300; ++n)
      value.update([n](Value& v) {
        for (int& x : v.numbers) x = n;
      });
    done = true;
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&] {
      while (!done) {
        auto p = value.pin();
        const int first = p->numbers[0];
        for (int x : p->numbers)
          if (x != first) ++torn;
      }
    });
  writer.join();
  for (auto& r : readers) r.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(value.pin()->numbers, (std::vector<int>{300, 300, 300, 300}));
}

TEST(KeyStream, KeysFromManyThreadsAreTheSerialKeys) {
  KeyStream serial(42), shared(42);
  std::vector<uint64_t> want(8 * 500);
  for (uint64_t& k : want) k = serial.next();
  std::vector<std::vector<uint64_t>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) got[static_cast<size_t>(t)].push_back(shared.next());
    });
  for (auto& th : threads) th.join();
  std::vector<uint64_t> all;
  for (const auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(all, want);
  EXPECT_EQ(std::adjacent_find(want.begin(), want.end()), want.end()) << "a key repeats";
}

TEST(KeyStream, SeedRestartsTheStream) {
  KeyStream a(7);
  const uint64_t first = a.next(), second = a.next();
  EXPECT_NE(first, second);
  a.seed(7);
  EXPECT_EQ(a.next(), first);
  KeyStream b(8);
  EXPECT_NE(b.next(), first);
}

}  // namespace
