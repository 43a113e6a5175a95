// tests/cpp/kernels/decode_problem.h: the data of one cached call of the
// decode kernel (cpu/decode/decode.h), shared by its tests
// (test_decode.cpp, test_decode_score_options.cpp): the shape, random q and
// caches, the call's DecodeParams and the closeness check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/decode/decode.h"
#include "kernels/params.h"
#include "mha/random.h"
#include "mha/threads.h"

namespace mha::kernels::test {

// One call: Hq query heads over Hkv kv heads, Qn new queries per batch row,
// widths d and dv, one cached length per batch row.
struct DecodeShape {
  int64_t Hq, Hkv, Qn, d, dv;
  std::vector<int64_t> lengths;  // one per batch row
  bool causal = true;
  std::string name() const {
    std::string s = "Hq" + std::to_string(Hq) + " Hkv" + std::to_string(Hkv) + " Qn" + std::to_string(Qn) +
                    " d" + std::to_string(d) + " dv" + std::to_string(dv) + (causal ? " causal" : "") + " lengths";
    for (int64_t n : lengths) s += " " + std::to_string(n);
    return s;
  }
};

// q is laid out as (B, Qn, Hq*d) (as a projection makes it) and seen through
// strides; the caches are [B, Hkv, capacity, d] with `spare` slots past the
// longest length, and every unwritten slot holds NaN: a kernel reading past
// a length makes NaN outputs. q and the written slots are drawn from gen,
// which a test may go on drawing from for its own data.
struct DecodeData {
  DecodeShape c;
  Generator gen;
  int64_t B, capacity;
  std::vector<float> q, k, v, out;
  std::vector<uint16_t> k16, v16;

  DecodeData(const DecodeShape& shape, int64_t spare, uint64_t seed) : c(shape), gen(seed) {
    B = static_cast<int64_t>(c.lengths.size());
    capacity = *std::max_element(c.lengths.begin(), c.lengths.end()) + spare;
    q.resize(static_cast<size_t>(B * c.Qn * c.Hq * c.d));
    for (float& x : q) x = gen.uniform(-1.5f, 1.5f);
    k.assign(static_cast<size_t>(B * c.Hkv * capacity * c.d), NAN);
    v.assign(static_cast<size_t>(B * c.Hkv * capacity * c.dv), NAN);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < c.Hkv; ++g)
        for (int64_t j = 0; j < c.lengths[static_cast<size_t>(b)]; ++j) {
          for (int64_t x = 0; x < c.d; ++x) k[static_cast<size_t>(((b * c.Hkv + g) * capacity + j) * c.d + x)] = gen.uniform(-1.5f, 1.5f);
          for (int64_t x = 0; x < c.dv; ++x) v[static_cast<size_t>(((b * c.Hkv + g) * capacity + j) * c.dv + x)] = gen.uniform(-1.0f, 1.0f);
        }
    for (float x : k) k16.push_back(core::to_bf16(x));
    for (float x : v) v16.push_back(core::to_bf16(x));
  }

  // The call on this data into o (filled with -7 first), caches in dtype,
  // causal (bottom right) as the shape says, scale 1/sqrt(d), no other mask.
  DecodeParams params(std::vector<float>& o, CacheDtype dtype = CacheDtype::F32) const {
    DecodeParams p;
    p.B = B, p.Hq = c.Hq, p.Hkv = c.Hkv, p.Qn = c.Qn, p.capacity = capacity, p.d = c.d, p.dv = c.dv;
    p.set_contiguous_strides();
    p.q = q.data();
    p.q_stride_b = c.Qn * c.Hq * c.d, p.q_stride_i = c.Hq * c.d, p.q_stride_h = c.d;  // (B, Qn, Hq*d)
    p.dtype = dtype;
    p.k = dtype == CacheDtype::F32 ? static_cast<const void*>(k.data()) : k16.data();
    p.v = dtype == CacheDtype::F32 ? static_cast<const void*>(v.data()) : v16.data();
    o.assign(static_cast<size_t>(B * c.Hq * c.Qn * c.dv), -7.0f);
    p.out = o.data();
    p.lengths = c.lengths.data();
    p.masks.causal = c.causal ? Causal::BottomRight : Causal::None;
    p.scale_divisor = std::sqrt(static_cast<float>(c.d));
    return p;
  }
};

// |got - want| <= rtol (|want| + scale), naming the first offenders.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, double scale,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = rtol * (std::fabs(want[i]) + scale);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", wanted " << want[i] << " (tolerance "
                    << tol << ")";
      ++bad;
    }
  }
}

// The call params(out, dtype) makes (a DecodeParams on out) gives the same
// bits at one and two threads, with float32 and bfloat16 caches.
template <class Params>
void expect_bitwise_at_one_and_two_threads(Params params) {
  const int saved = num_threads();
  for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16}) {
    std::vector<float> one, two;
    set_num_threads(1);
    decode_attention(params(one, dtype));
    set_num_threads(2);
    decode_attention(params(two, dtype));
    EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)))
        << "the output depends on the thread count (" << (dtype == CacheDtype::BF16 ? "bfloat16" : "float32")
        << " cache)";
  }
  set_num_threads(saved);
}

}  // namespace mha::kernels::test
