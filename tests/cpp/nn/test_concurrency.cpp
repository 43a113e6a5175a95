// One module, many threads: forward() from 8 threads at once gives exactly
// the serial results; the first call's lazy initialisation, training-mode
// dropout draws, mode/kernel switches and load_state_dict are safe while
// calls run. The TSan build (scripts/test-sanitizers.sh tsan) runs these to
// show the absence of data races, not only of wrong answers. Calls hold no
// lock (mha/detail/published.h): what changes the parameters writes them in
// place, so the pointers an optimiser holds stay valid.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "mha/mha.h"

namespace mha {
// How gtest (and ctest's test names) print a kernel.
void PrintTo(AttentionKernel k, std::ostream* os) {
  *os << (k == AttentionKernel::Reference ? "Reference" : k == AttentionKernel::Blas ? "Blas" : "kernel")
      << static_cast<int>(k);
}
}  // namespace mha

namespace {

using mha::MultiHeadAttention;
using mha::Tensor;
using mha::ValidLens;

constexpr int kThreads = 8;

Tensor random_tensor(mha::Shape shape, uint64_t seed) {
  mha::Generator g(seed);
  Tensor t(std::move(shape));
  for (float& x : t.values()) x = g.uniform(-1.0f, 1.0f);
  return t;
}

struct Case {
  Tensor q, k, v;
  ValidLens lens;
};

// Eight calls of different shapes and masks, widths (Dq, Dk, Dv) = (12, 10, 6).
std::vector<Case> make_cases() {
  std::vector<Case> cases;
  for (int i = 0; i < kThreads; ++i) {
    const int64_t B = 1 + i % 3, Q = 1 + 3 * i, K = 2 + 5 * (i % 4);
    Case c{random_tensor({B, Q, 12}, 100 + i), random_tensor({B, K, 10}, 200 + i),
           random_tensor({B, K, 6}, 300 + i), {}};
    if (i % 3 == 1) {
      std::vector<float> l(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) l[b] = static_cast<float>((b + i) % (K + 1));
      c.lens = ValidLens::per_batch(l);
    } else if (i % 3 == 2) {
      std::vector<float> l(static_cast<size_t>(B * Q));
      for (size_t j = 0; j < l.size(); ++j) l[j] = static_cast<float>(j % (K + 2)) + 0.5f;
      c.lens = ValidLens::per_query(B, Q, l);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// Runs body(thread_index) on kThreads threads released together.
template <typename F>
void run_threads(F body) {
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  for (auto& th : threads) th.join();
}

class Concurrency : public ::testing::TestWithParam<mha::AttentionKernel> {};

TEST_P(Concurrency, EvalFromEightThreadsGivesExactlyTheSerialResults) {
  const auto cases = make_cases();
  MultiHeadAttention attention(32, 4, /*dropout=*/0.3f, /*bias=*/true, /*seed=*/7);
  attention.set_kernel(GetParam());
  attention.eval();
  std::vector<Tensor> serial, serial_weights;
  for (const Case& c : cases) {
    serial.push_back(attention(c.q, c.k, c.v, c.lens));
    serial_weights.push_back(attention.attention_weights());
  }
  std::atomic<int> mismatches{0}, weight_shapes_wrong{0};
  run_threads([&](int t) {
    for (int rep = 0; rep < 6; ++rep) {
      const int i = (t + rep) % kThreads;  // every thread runs every case
      const Case& c = cases[i];
      if (!(attention(c.q, c.k, c.v, c.lens) == serial[i])) ++mismatches;
      // Some call's weights, whole: never a torn mixture of two calls.
      const Tensor w = attention.attention_weights();
      if (std::none_of(serial_weights.begin(), serial_weights.end(), [&](const Tensor& s) { return s == w; }))
        ++weight_shapes_wrong;
    }
  });
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(weight_shapes_wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Concurrency,
                         ::testing::Values(mha::AttentionKernel::Reference, mha::AttentionKernel::Blas,
                                           mha::AttentionKernel::Fused));

TEST(ConcurrencyLazy, FirstCallFromEightThreadsInitialisesOnceAsASerialCallWould) {
  const auto cases = make_cases();
  MultiHeadAttention serial_module(32, 4, 0.0f, true, 11);
  const Tensor want = serial_module(cases[3].q, cases[3].k, cases[3].v, cases[3].lens);

  MultiHeadAttention attention(32, 4, 0.0f, true, 11);
  std::vector<Tensor> got(kThreads);
  run_threads([&](int t) { got[t] = attention(cases[3].q, cases[3].k, cases[3].v, cases[3].lens); });
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(got[t] == want) << "thread " << t;
  const mha::StateDict a = attention.state_dict(), b = serial_module.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : b) EXPECT_TRUE(a.at(name) == tensor) << name;
}

TEST(ConcurrencyLazy, ConflictingWidthsOnTheFirstCallFailCleanly) {
  MultiHeadAttention attention(16, 2, 0.0f);
  const Tensor narrow({1, 3, 5}, 0.5f), wide({1, 3, 7}, 0.5f);
  std::atomic<int> ok5{0}, ok7{0}, refused{0}, other{0};
  run_threads([&](int t) {
    const Tensor& x = t % 2 ? narrow : wide;
    try {
      attention(x, x, x);
      ++(t % 2 ? ok5 : ok7);
    } catch (const mha::Error& e) {
      if (std::string(e.what()).find("fixed by the first call") != std::string::npos) ++refused;
      else ++other;
    }
  });
  // Whichever width came first won; every call of the other width was refused.
  EXPECT_EQ(other.load(), 0);
  EXPECT_TRUE((ok5 == kThreads / 2 && ok7 == 0) || (ok7 == kThreads / 2 && ok5 == 0))
      << ok5 << " " << ok7;
  EXPECT_EQ(refused.load(), kThreads / 2);
  EXPECT_TRUE(attention.W_q().in_features() == 5 || attention.W_q().in_features() == 7);
}

TEST(ConcurrencyTraining, DropoutDrawsAreThoseOfSomeSerialOrder) {
  // Every call draws the next dropout key from the module's generator, so 8
  // threads x 5 calls on one input give the same 40 outputs as 40 serial
  // calls, in some order.
  const auto cases = make_cases();
  const Case& c = cases[5];
  const int calls = 5;
  MultiHeadAttention serial_module(32, 4, 0.5f, false, 3);
  std::vector<Tensor> serial;
  for (int i = 0; i < kThreads * calls; ++i) serial.push_back(serial_module(c.q, c.k, c.v, c.lens));

  MultiHeadAttention attention(32, 4, 0.5f, false, 3);
  attention(c.q, c.k, c.v, c.lens);  // the first (initialising) call, as serially
  std::vector<std::vector<Tensor>> got(kThreads);
  run_threads([&](int t) {
    for (int i = 0; i < calls - (t == 0 ? 1 : 0); ++i) got[t].push_back(attention(c.q, c.k, c.v, c.lens));
  });
  std::vector<Tensor> all = {serial[0]};
  for (auto& v : got) all.insert(all.end(), v.begin(), v.end());
  ASSERT_EQ(all.size(), serial.size());
  std::vector<bool> used(serial.size(), false);
  for (const Tensor& t : all) {
    auto it = std::find_if(serial.begin(), serial.end(), [&](const Tensor& s) {
      return !used[&s - serial.data()] && s == t;
    });
    ASSERT_NE(it, serial.end()) << "an output no serial call gives";
    used[it - serial.begin()] = true;
  }
}

TEST(ConcurrencyState, LoadStateDictWhileCallsRunGivesOneStateOrTheOther) {
  const auto cases = make_cases();
  const Case& c = cases[6];
  MultiHeadAttention a(32, 4, 0.0f, true, 21), b(32, 4, 0.0f, true, 22);
  a.eval();
  b.eval();
  const Tensor out_a = a(c.q, c.k, c.v, c.lens), out_b = b(c.q, c.k, c.v, c.lens);
  const mha::StateDict state_a = a.state_dict(), state_b = b.state_dict();
  ASSERT_FALSE(out_a == out_b);

  std::atomic<int> torn{0};
  std::atomic<bool> done{false};
  std::thread loader([&] {
    for (int i = 0; !done; ++i) a.load_state_dict(i % 2 ? state_a : state_b);
  });
  run_threads([&](int) {
    for (int rep = 0; rep < 10; ++rep) {
      const Tensor out = a(c.q, c.k, c.v, c.lens);
      if (!(out == out_a) && !(out == out_b)) ++torn;
    }
  });
  done = true;
  loader.join();
  EXPECT_EQ(torn.load(), 0) << "a call saw parameters of two states at once";
}

TEST(ConcurrencyState, ModeAndKernelSwitchesWhileCallsRunAreSafe) {
  // Each call takes one snapshot of the mode and the kernel: its output is
  // one of the outputs a serial call gives with some mode and kernel.
  const auto cases = make_cases();
  const Case& c = cases[2];
  MultiHeadAttention attention(32, 4, 0.0f, false, 5);  // p = 0: modes agree
  attention.eval();
  attention.set_kernel(mha::AttentionKernel::Reference);
  const Tensor ref = attention(c.q, c.k, c.v, c.lens);
  attention.set_kernel(mha::AttentionKernel::Blas);
  const Tensor blas = attention(c.q, c.k, c.v, c.lens);
  std::atomic<bool> done{false};
  std::thread switcher([&] {
    for (int i = 0; !done; ++i) {
      attention.train(i % 2 == 0);
      attention.set_kernel(i % 3 ? mha::AttentionKernel::Blas : mha::AttentionKernel::Reference);
      (void)attention.training();
      (void)attention.kernel();
    }
  });
  std::atomic<int> unexpected{0};
  run_threads([&](int) {
    for (int rep = 0; rep < 10; ++rep) {
      const Tensor out = attention(c.q, c.k, c.v, c.lens);
      if (!(out == ref) && !(out == blas)) ++unexpected;
    }
  });
  done = true;
  switcher.join();
  EXPECT_EQ(unexpected.load(), 0);
}

TEST(ConcurrencyState, DotProductAttentionFromEightThreadsMatchesSerial) {
  mha::DotProductAttention dpa(0.2f, 9);
  dpa.eval();
  std::vector<Tensor> q, k, v, want;
  for (int i = 0; i < kThreads; ++i) {
    q.push_back(random_tensor({2, 3 + i, 4}, 400 + i));
    k.push_back(random_tensor({2, 5, 4}, 500 + i));
    v.push_back(random_tensor({2, 5, 3}, 600 + i));
    want.push_back(dpa.forward(q[i], k[i], v[i], ValidLens::per_batch({2, 4})));
  }
  std::atomic<int> mismatches{0};
  run_threads([&](int t) {
    for (int rep = 0; rep < 5; ++rep)
      if (!(dpa.forward(q[t], k[t], v[t], ValidLens::per_batch({2, 4})) == want[t])) ++mismatches;
  });
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ConcurrencyState, CopiesAreIndependentModules) {
  const auto cases = make_cases();
  const Case& c = cases[1];
  MultiHeadAttention a(32, 4, 0.0f, false, 8);
  a.eval();
  const Tensor want = a(c.q, c.k, c.v, c.lens);
  MultiHeadAttention b = a;  // copies parameters, not locks
  std::vector<Tensor> got(kThreads);
  run_threads([&](int t) { got[t] = (t % 2 ? a : b)(c.q, c.k, c.v, c.lens); });
  for (const Tensor& g : got) EXPECT_TRUE(g == want);
}

TEST(ConcurrencyState, LoadStateDictWritesTheParametersOptimisersHold) {
  // An optimiser keeps parameters()' pointers across load_state_dict and
  // prune-free updates (gates, the lazy initialisation of another width is
  // refused): they must address what calls read, with the loaded values.
  const auto cases = make_cases();
  const Case& c = cases[3];
  MultiHeadAttention a(32, 4, 0.0f, true, 31), b(32, 4, 0.0f, true, 32);
  a.eval();
  b.eval();
  (void)a(c.q, c.k, c.v, c.lens);
  const Tensor out_b = b(c.q, c.k, c.v, c.lens);
  mha::ParamList held = a.parameters();
  a.load_state_dict(b.state_dict());
  a.set_head_gates({1, 1, 1, 1});
  for (const mha::ParamRef& p : held) EXPECT_TRUE(*p.value == b.state_dict().at(p.name)) << p.name;
  EXPECT_TRUE(a(c.q, c.k, c.v, c.lens) == out_b);
  // A step through the held pointers moves what the next call reads.
  for (mha::ParamRef& p : held)
    if (p.name == "W_o.bias") p.value->values()[0] += 1.0f;
  const Tensor moved = a(c.q, c.k, c.v, c.lens);
  EXPECT_FLOAT_EQ(moved.values()[0], out_b.values()[0] + 1.0f);
}

}  // namespace
