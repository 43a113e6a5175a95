// safetensors: round trips keep every bit; every malformed file is refused
// with a message naming the file and the fault.
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "mha/error.h"
#include "mha/safetensors.h"
#include "test_util.h"

using namespace mha;
using mha::test::throws_with;

namespace {

std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes, uint64_t declared = ~0ull) {
  const uint64_t n = declared == ~0ull ? header.size() : declared;
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);  // one allocation (GCC 12's -Warray-bounds)
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  return out;
}

SafetensorsFile parse(const std::vector<uint8_t>& f) { return parse_safetensors(f.data(), f.size(), "t.safetensors"); }

}  // namespace

TEST(Safetensors, RoundTripKeepsEveryBit) {
  Generator gen(2);
  std::map<std::string, Tensor> tensors;
  tensors["a"] = mha::test::random_tensor({3, 5}, gen);
  Tensor special({6});
  const float vals[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-45f, 3.4e38f};
  std::memcpy(special.data(), vals, sizeof vals);
  tensors["b.weight"] = special;
  tensors["empty"] = Tensor({0, 4});
  const auto bytes = serialize_safetensors(tensors, {{"num_heads", "5"}});
  EXPECT_EQ((bytes[0] | bytes[1] << 8) % 8, 0) << "header padded to 8 bytes";
  const SafetensorsFile f = parse(bytes);
  EXPECT_EQ(f.metadata.at("num_heads"), "5");
  ASSERT_EQ(f.tensors.size(), 3u);
  for (const auto& [name, t] : tensors) {
    const RawTensor& raw = f.tensors.at(name);
    EXPECT_EQ(raw.dtype, DType::F32);
    EXPECT_EQ(raw.shape, t.shape());
    ASSERT_EQ(raw.bytes.size(), static_cast<size_t>(t.numel()) * 4);
    if (!raw.bytes.empty()) {  // memcmp of an empty range may not take null pointers
      EXPECT_EQ(std::memcmp(raw.bytes.data(), t.data(), raw.bytes.size()), 0) << name;
    }
  }
}

TEST(Safetensors, SaveIsAtomicAndLoadsBack) {
  const std::string path = ::testing::TempDir() + "/mha_roundtrip.safetensors";
  save_safetensors(path, {{"x", Tensor({2, 2}, std::vector<float>{1, 2, 3, 4})}});
  const auto loaded = load_f32_tensors(path);
  EXPECT_EQ(loaded.at("x"), Tensor({2, 2}, std::vector<float>{1, 2, 3, 4}));
  EXPECT_TRUE(throws_with([&] { save_safetensors("/nonexistent-dir/x.safetensors", {}); }, "nonexistent-dir"));
}

TEST(Safetensors, ConvertsIntegerAndHalfTypes) {
  // I64 [2], I32 [1], F16 [2] (1.0, -2.5), BF16 [1] (3.0) in one buffer.
  std::string h = R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"I32","shape":[1],"data_offsets":[16,20]},)"
                  R"("c":{"dtype":"F16","shape":[2],"data_offsets":[20,24]},)"
                  R"("d":{"dtype":"BF16","shape":[1],"data_offsets":[24,26]}})";
  auto f = make_file(h, 26);
  uint8_t* data = f.data() + 8 + h.size();
  const int64_t a[2] = {3, -7};
  const int32_t b = 5;
  const uint16_t c[2] = {0x3C00, 0xC100}, d = 0x4040;
  std::memcpy(data, a, 16);
  std::memcpy(data + 16, &b, 4);
  std::memcpy(data + 20, c, 4);
  std::memcpy(data + 24, &d, 2);
  const SafetensorsFile file = parse(f);
  EXPECT_EQ(to_float_tensor(file.tensors.at("a"), "a"), Tensor({2}, std::vector<float>{3, -7}));
  EXPECT_EQ(to_float_tensor(file.tensors.at("b"), "b"), Tensor({1}, std::vector<float>{5}));
  EXPECT_EQ(to_float_tensor(file.tensors.at("c"), "c"), Tensor({2}, std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(to_float_tensor(file.tensors.at("d"), "d"), Tensor({1}, std::vector<float>{3.0f}));
  EXPECT_TRUE(throws_with([&] { require_f32(file.tensors.at("a"), "tensor 'a'"); }, "tensor 'a': dtype I64 where F32 is wanted"));
}

TEST(Safetensors, RefusesMalformedFiles) {
  const std::string good = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(parse(make_file(good, 8)));
  EXPECT_TRUE(throws_with([&] { parse({}); }, "too short"));
  EXPECT_TRUE(throws_with([&] { parse({1, 0, 0}); }, "too short"));
  auto truncated = make_file(good, 8);
  truncated.resize(truncated.size() - 3);
  EXPECT_TRUE(throws_with([&] { parse(truncated); }, "entry 'x' ends at byte 8 past the data buffer's 5 bytes"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(good, 8, 1000)); }, "header length 1000 runs past the end"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(good, 8, ~0ull - 1)); }, "above the format's limit"));
  EXPECT_TRUE(throws_with([&] { parse(make_file("{\"x\": [1,", 0)); }, "not valid JSON"));
  EXPECT_TRUE(throws_with([&] { parse(make_file("[1, 2]", 0)); }, "not an object"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)); },
                          "needs 12 bytes but its offsets [0, 8] span 8"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8)); },
                          "unsupported dtype 'Q7'"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)); },
                          "not an integer >= 0"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)); },
                          "wrong order"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(R"({"x":{"dtype":"F32","shape":[2]}})", 8)); }, "no data_offsets"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(good, 12)); }, "the data buffer has 12 bytes but the entries cover 8"));
  EXPECT_TRUE(throws_with([&] {
    parse(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
  }, "overlap"));
  EXPECT_TRUE(throws_with([&] {
    parse(make_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8));
  }, "overflows 64 bits"));
  EXPECT_TRUE(throws_with([&] { parse(make_file(R"({"__metadata__":{"a":1}})", 0)); }, "not a string"));
  EXPECT_TRUE(throws_with([&] { read_safetensors("/nonexistent/file.safetensors"); }, "cannot open '/nonexistent/file.safetensors'"));
}

// Files of other kinds are named by their first bytes (ONNX by its name),
// never by the header length those bytes would make; a valid file whose
// length field happens to start like one of them still loads.
TEST(Safetensors, NamesOtherFileKinds) {
  auto bytes = [](std::string s) {
    s.resize(64, '\0');
    return std::vector<uint8_t>(s.begin(), s.end());
  };
  EXPECT_TRUE(throws_with([&] { parse(bytes(std::string("PK\x03\x04\x14\x00\x00\x00", 8))); },
                          "'t.safetensors': not a safetensors file: it looks like a zip archive, as torch.save "
                          "writes (.pt, .pth)"));
  EXPECT_TRUE(throws_with([&] { parse(bytes(std::string("\x80\x02}q\x00(X", 7))); },
                          "it looks like a Python pickle"));
  EXPECT_TRUE(throws_with([&] { parse(bytes(std::string("\x93NUMPY\x01\x00v\x00", 10))); },
                          "it looks like a numpy .npy array"));
  EXPECT_TRUE(throws_with([&] { parse(bytes("\x89HDF\r\n\x1a\n")); }, "it looks like an HDF5 file"));
  EXPECT_TRUE(throws_with([&] { parse(bytes("GGUF\x03")); }, "it looks like a GGUF model"));
  const auto onnx = bytes("\x08\x07\x12\x07pytorch\x1a\x03" "2.1");
  EXPECT_TRUE(throws_with([&] { parse_safetensors(onnx.data(), onnx.size(), "model.ONNX"); },
                          "it looks like an ONNX model (by its name)"));
  EXPECT_TRUE(throws_with([&] { parse(onnx); }, "not a safetensors file (or a damaged one): its first 8 bytes give "
                                                "a header length of "));
  EXPECT_TRUE(throws_with([&] { parse({'P', 'K', 3}); }, "too short"));  // too short to be anything
  // A header length of 640 is 0x80 0x02 ...: a pickle's first bytes, yet a valid file.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.resize(640, ' ');
  EXPECT_NO_THROW(parse(make_file(header, 8)));
}
