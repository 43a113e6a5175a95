// Hostile sizes: shapes whose element counts or byte sizes overflow 64 bits,
// or exceed mha::memory_limit(), are refused with an mha::Error before
// anything is allocated, by every entry point that allocates.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "mha/mha.h"

namespace {

using mha::Tensor;

// Restores the default limit when a test ends, pass or fail.
struct LimitGuard {
  explicit LimitGuard(uint64_t bytes) { mha::set_memory_limit(bytes); }
  ~LimitGuard() { mha::set_memory_limit(0); }
};

// The message of the mha::Error `f` throws; fails the test if it throws nothing.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const mha::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no mha::Error thrown";
  return "";
}

TEST(MemoryLimit, DefaultIsPhysicalMemoryAndZeroRestoresIt) {
  uint64_t phys = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  struct rlimit as {};  // or the address-space limit (ulimit -v) when lower
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && as.rlim_cur < phys) phys = as.rlim_cur;
  EXPECT_EQ(mha::default_memory_limit(), phys);
  EXPECT_EQ(mha::memory_limit(), phys);
  {
    LimitGuard g(12345);
    EXPECT_EQ(mha::memory_limit(), 12345u);
  }
  EXPECT_EQ(mha::memory_limit(), phys);
}

TEST(MemoryLimit, TensorAboveTheLimitIsRefused) {
  LimitGuard g(1 << 20);
  const std::string msg = error_of([] { Tensor t({1024, 1024}); });  // 4 MiB
  EXPECT_NE(msg.find("[Tensor]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(1024, 1024)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 4194304 bytes, above the memory limit of 1048576 bytes"), std::string::npos) << msg;
  EXPECT_NO_THROW(Tensor({512, 512}));  // 1 MiB: exactly at the limit
}

TEST(MemoryLimit, TensorWhoseElementCountOverflowsIsRefused) {
  const std::string msg = error_of([] { Tensor t({int64_t{1} << 40, int64_t{1} << 40}); });
  EXPECT_NE(msg.find("more elements than fit in 64 bits"), std::string::npos) << msg;
  // 2^62 elements fit in int64, their 2^64 bytes do not.
  const std::string bytes = error_of([] { Tensor t({int64_t{1} << 31, int64_t{1} << 31}); });
  EXPECT_NE(bytes.find("overflows 64 bits"), std::string::npos) << bytes;
}

TEST(MemoryLimit, AttentionWeightsPast2To63AreRefusedBeforeAnyAllocation) {
  // B*h*Q*K = 1 * 2^24 * 2^20 * 2^20 = 2^64, from inputs of 4 MiB each:
  // num_hiddens = num_heads = 2^24 (head width 1), widths 1.
  const int64_t h = int64_t{1} << 24, L = int64_t{1} << 20;
  mha::MultiHeadAttention attention(h, h, 0.0f);
  attention.set_kernel(mha::AttentionKernel::Blas);  // forms the weights in forward()
  const Tensor x({1, L, 1}, 1.0f);
  const std::string msg = error_of([&] { attention(x, x, x); });
  EXPECT_NE(msg.find("[MultiHeadAttention.forward] attention weights (1, 16777216, 1048576, 1048576): "
                     "the element count overflows 64 bits"),
            std::string::npos)
      << msg;
  // Nothing was created: the lazy layers are still lazy.
  EXPECT_FALSE(attention.W_q().initialized());
  EXPECT_FALSE(attention.W_o().initialized());
  EXPECT_TRUE(attention.attention_weights().empty());
}

TEST(MemoryLimit, ForwardAboveTheLimitIsRefusedAndChangesNothing) {
  mha::MultiHeadAttention attention(8, 2, 0.0f);
  attention.set_kernel(mha::AttentionKernel::Blas);  // forms the weights in forward()
  const Tensor q({1, 1024, 4}, 0.5f), kv({1, 1024, 3}, 0.25f);
  {
    LimitGuard g(1 << 20);  // the (1, 2, 1024, 1024) weights alone need 8 MiB
    const std::string msg = error_of([&] { attention(q, kv, kv); });
    EXPECT_NE(msg.find("[MultiHeadAttention.forward] needs "), std::string::npos) << msg;
    EXPECT_NE(msg.find("above the memory limit of 1048576 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the largest part: attention weights (1, 2, 1024, 1024), 8388608 bytes"),
              std::string::npos)
        << msg;
    EXPECT_FALSE(attention.W_q().initialized());
  }
  const Tensor out = attention(q, kv, kv);  // the default limit lets it run
  EXPECT_EQ(out.shape(), (mha::Shape{1, 1024, 8}));
}

TEST(MemoryLimit, DotProductAttentionAndMaskedSoftmaxAreChecked) {
  LimitGuard g(1 << 16);
  mha::DotProductAttention dpa;
  const Tensor q({1, 200, 2}), k({1, 200, 2});
  EXPECT_NE(error_of([&] { dpa.forward(q, k, k); }).find("above the memory limit"), std::string::npos);
  mha::set_memory_limit(0);
  const Tensor scores({1, 200, 200});
  mha::set_memory_limit(1 << 16);
  EXPECT_NE(error_of([&] { mha::masked_softmax(scores); }).find("[masked_softmax]"), std::string::npos);
}

std::vector<uint8_t> safetensors_bytes(const std::string& header, size_t data_bytes) {
  std::string h = header;
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::vector<uint8_t> out(8 + h.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  std::copy(h.begin(), h.end(), out.begin() + 8);
  return out;
}

TEST(MemoryLimit, SafetensorsHeaderDeclaringATerabyteTensorIsRefused) {
  // 2^38 float32 = 1 TiB, in a file of a few dozen bytes.
  const auto file = safetensors_bytes(
      R"({"w":{"dtype":"F32","shape":[274877906944],"data_offsets":[0,1099511627776]}})", 4);
  const std::string msg = error_of([&] { mha::parse_safetensors(file.data(), file.size(), "big.safetensors"); });
  EXPECT_NE(msg.find("[safetensors] 'big.safetensors': entry 'w' ends at byte 1099511627776 past the "
                     "data buffer's 4 bytes"),
            std::string::npos)
      << msg;
  // A shape whose byte count overflows 64 bits, with offsets that do not matter.
  const auto overflow = safetensors_bytes(
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  const std::string msg2 = error_of([&] { mha::parse_safetensors(overflow.data(), overflow.size(), "o"); });
  EXPECT_NE(msg2.find("entry 'w' shape (4294967296, 4294967296) overflows 64 bits"), std::string::npos) << msg2;
}

TEST(MemoryLimit, FilesAndConversionsAboveTheLimitAreRefused) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mha_limit_" + std::to_string(getpid()) + ".safetensors")).string();
  mha::save_safetensors(path, {{"x", Tensor({512, 1024}, 1.0f)}});  // 2 MiB of data
  {
    LimitGuard g(1 << 20);
    const std::string msg = error_of([&] { mha::read_safetensors(path); });
    EXPECT_NE(msg.find("[read] '" + path + "' needs "), std::string::npos) << msg;
    EXPECT_NE(msg.find("above the memory limit of 1048576 bytes"), std::string::npos) << msg;
  }
  std::remove(path.c_str());
  // An 8-bit tensor becomes four times larger as float32.
  mha::RawTensor raw;
  raw.dtype = mha::DType::U8;
  raw.shape = {1 << 19};
  raw.bytes.assign(1 << 19, 1);
  LimitGuard g(1 << 20);
  EXPECT_NE(error_of([&] { mha::to_float_tensor(raw, "u8"); }).find("above the memory limit"), std::string::npos);
}

TEST(MemoryLimit, PerQueryLengthsWithOverflowingShapeAreRefused) {
  const int64_t big = int64_t{1} << 40;
  const std::string msg = error_of([&] { mha::ValidLens::per_query(big, big, {1.0f}); });
  EXPECT_NE(msg.find("[ValidLens.per_query]"), std::string::npos) << msg;
}

// The fused kernel (the default) forms no (B, h, Q, K) weights in forward():
// a call the eager kernels would refuse runs in linear memory, and
// attention_weights(), which forms them, is checked on its own.
TEST(MemoryLimit, FusedForwardNeedsNoWeightsAndAttentionWeightsIsChecked) {
  mha::MultiHeadAttention attention(8, 2, 0.0f);
  attention.eval();
  const Tensor q({1, 1024, 4}, 0.5f), kv({1, 1024, 3}, 0.25f);
  LimitGuard g(1 << 20);  // the (1, 2, 1024, 1024) weights alone need 8 MiB
  const Tensor out = attention(q, kv, kv);
  EXPECT_EQ(out.shape(), (mha::Shape{1, 1024, 8}));
  const std::string msg = error_of([&] { attention.attention_weights(); });
  EXPECT_NE(msg.find("[MultiHeadAttention.attention_weights] needs "), std::string::npos) << msg;
  EXPECT_NE(msg.find("the largest part: attention weights (1, 2, 1024, 1024), 8388608 bytes"),
            std::string::npos)
      << msg;
  // A subset that fits is fine.
  EXPECT_NE(error_of([&] { attention.attention_weights({0}, {1}); }).find("(1, 1, 1024, 1024)"),
            std::string::npos);  // 4 MiB: also above this limit

}

}  // namespace
