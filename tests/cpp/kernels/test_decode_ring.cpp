// A ring-buffer cache (KeyCache::ring, DecodeParams::ring): row b's
// lengths[b] positions of which the last `capacity` are held, position j in
// slot j % capacity. The decode kernel on a ring against the same call on a
// flat cache holding every position (with a window inside the ring, the
// two are the same attention), and against its reference reading the ring;
// on every instruction set, both storage formats, chunks that straddle the
// wrap, score options (ALiBi reads positions, not slots); the bits at one
// and two threads; the checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/decode/decode.h"
#include "cpu/reference/reference.h"
#include "harness.h"
#include "kernels/params.h"
#include "mha/random.h"
#include "mha/threads.h"
#include "test_util.h"

namespace mha::kernels {
namespace {

// Rows of `lengths` positions over Hkv cache heads: `flat` holds every
// position (capacity the longest row), `ring` the last `slots` of each row
// in slot j % slots. q as [B, Hq, Qn, d].
struct RingProblem {
  int64_t B, Hq, Hkv, Qn, d, slots, longest;
  std::vector<int64_t> lengths;
  std::vector<float> q, flat_k, flat_v, ring_k, ring_v, slopes;
  std::vector<uint16_t> flat_k16, flat_v16, ring_k16, ring_v16;

  RingProblem(int64_t hq, int64_t hkv, int64_t qn, int64_t dim, int64_t ring_slots, std::vector<int64_t> lens,
              uint64_t seed)
      : B(static_cast<int64_t>(lens.size())), Hq(hq), Hkv(hkv), Qn(qn), d(dim), slots(ring_slots),
        longest(*std::max_element(lens.begin(), lens.end())), lengths(std::move(lens)) {
    Generator gen(seed);
    q.resize(static_cast<size_t>(B * Hq * Qn * d));
    for (float& x : q) x = gen.uniform(-1.5f, 1.5f);
    flat_k.assign(static_cast<size_t>(B * Hkv * longest * d), NAN);
    flat_v = flat_k;
    ring_k.assign(static_cast<size_t>(B * Hkv * slots * d), NAN);
    ring_v = ring_k;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < Hkv; ++g)
        for (int64_t j = 0; j < lengths[static_cast<size_t>(b)]; ++j)
          for (int64_t x = 0; x < d; ++x) {
            const float kx = gen.uniform(-1.5f, 1.5f), vx = gen.uniform(-1.0f, 1.0f);
            flat_k[static_cast<size_t>(((b * Hkv + g) * longest + j) * d + x)] = kx;
            flat_v[static_cast<size_t>(((b * Hkv + g) * longest + j) * d + x)] = vx;
            ring_k[static_cast<size_t>(((b * Hkv + g) * slots + j % slots) * d + x)] = kx;  // later ones overwrite
            ring_v[static_cast<size_t>(((b * Hkv + g) * slots + j % slots) * d + x)] = vx;
          }
    for (float x : flat_k) flat_k16.push_back(core::to_bf16(x));
    for (float x : flat_v) flat_v16.push_back(core::to_bf16(x));
    for (float x : ring_k) ring_k16.push_back(core::to_bf16(x));
    for (float x : ring_v) ring_v16.push_back(core::to_bf16(x));
    for (int64_t h = 0; h < Hq; ++h) slopes.push_back(gen.uniform(-0.3f, 0.3f));
  }

  DecodeParams params(bool ring, std::vector<float>& out, CacheDtype dtype, int64_t left, int64_t chunk = 0,
                      bool alibi = false) {
    DecodeParams p;
    p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Qn = Qn, p.d = d, p.dv = d;
    p.capacity = ring ? slots : longest;
    p.set_contiguous_strides();
    p.q = q.data();
    p.dtype = dtype;
    const bool f32 = dtype == CacheDtype::F32;
    p.k = ring ? (f32 ? static_cast<const void*>(ring_k.data()) : ring_k16.data())
               : (f32 ? static_cast<const void*>(flat_k.data()) : flat_k16.data());
    p.v = ring ? (f32 ? static_cast<const void*>(ring_v.data()) : ring_v16.data())
               : (f32 ? static_cast<const void*>(flat_v.data()) : flat_v16.data());
    out.assign(static_cast<size_t>(B * Hq * Qn * d), -7.0f);
    p.out = out.data();
    p.lengths = lengths.data();
    p.scale_divisor = std::sqrt(static_cast<float>(d));
    p.masks.window_left = left, p.masks.window_right = 0;
    p.masks.alibi_slopes = alibi ? slopes.data() : nullptr;
    p.chunk_keys = chunk;
    p.ring = ring;
    return p;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * (std::fabs(want[i]) + 1.0)) << what << " element " << i;
}

using test::supported_isas;

TEST(DecodeRing, TheRingIsTheFlatCacheWithTheWindow) {
  struct Shape {
    int64_t Hq, Hkv, Qn, d, slots, left;
    std::vector<int64_t> lengths;
  };
  const std::vector<Shape> shapes = {
      {2, 2, 1, 8, 5, 4, {1, 5, 6, 23}},                 // a row not yet full, one just full, wrapped rows
      {4, 2, 3, 17, 40, 37, {3, 39, 40, 41, 1000}},      // window filling the ring, grouped heads
      {6, 3, 4, 33, 100, 50, {4, 99, 777, 2049}},        // a ring wider than the window
      {8, 8, 1, 64, 300, 299, {300, 301, 5000}},         // several tiles and chunks per ring
  };
  uint64_t seed = 40;
  for (const Shape& s : shapes) {
    RingProblem pb(s.Hq, s.Hkv, s.Qn, s.d, s.slots, s.lengths, seed++);
    for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16})
      for (bool alibi : {false, true}) {
        std::vector<float> flat, ring_ref, got;
        decode_attention_reference(pb.params(false, flat, dtype, s.left, 0, alibi));
        decode_attention_reference(pb.params(true, ring_ref, dtype, s.left, 0, alibi));
        const std::string what = "slots " + std::to_string(s.slots) + " left " + std::to_string(s.left) +
                                 (dtype == CacheDtype::BF16 ? " bf16" : "") + (alibi ? " alibi" : "");
        expect_close(ring_ref, flat, 1e-6, what + ": the reference on the ring vs on every position");
        for (int64_t chunk : {int64_t{0}, int64_t{32}, int64_t{96}})
          for (FusedIsa isa : supported_isas()) {
            decode_attention(pb.params(true, got, dtype, s.left, chunk, alibi), isa);
            expect_close(got, flat, 1e-5, what + " chunk " + std::to_string(chunk) + " isa " + fused_isa_name(isa));
          }
      }
  }
}

TEST(DecodeRing, BitwiseTheSameAtOneAndTwoThreads) {
  RingProblem pb(8, 2, 2, 64, 2000, {5000, 4321}, 77);
  const int saved = num_threads();
  for (CacheDtype dtype : {CacheDtype::F32, CacheDtype::BF16}) {
    std::vector<float> one, two;
    set_num_threads(1);
    decode_attention(pb.params(true, one, dtype, 1990, 0, true));
    set_num_threads(2);
    decode_attention(pb.params(true, two, dtype, 1990, 0, true));
    ASSERT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)));
  }
  set_num_threads(saved);
}

TEST(DecodeRing, AWindowOutsideTheRingIsRefused) {
  RingProblem pb(2, 2, 3, 8, 10, {20}, 5);
  std::vector<float> out;
  EXPECT_TRUE(mha::test::throws_with([&] { decode_attention(pb.params(true, out, CacheDtype::F32, 8)); },
                                "[decode_attention] ring: a ring buffer of 10 slots with window (8, 0) and 3 new "
                                "queries; wanted window_left >= 0 and window_left + new queries <= the slots"));
  EXPECT_TRUE(mha::test::throws_with([&] { decode_attention(pb.params(true, out, CacheDtype::F32, -1)); },
                                "ring: a ring buffer of 10 slots with window (-1, 0)"));
  decode_attention(pb.params(true, out, CacheDtype::F32, 7));  // left + Qn = the slots: fits
}

}  // namespace
}  // namespace mha::kernels
