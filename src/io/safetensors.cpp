#include "mha/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <nlohmann/json.hpp>

#include "core/memory.h"
#include "io/atomic_file.h"
#include "mha/error.h"

namespace mha {

namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, which
// also bounds what a hostile length field can make us parse.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2}, {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
};

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant ? std::numeric_limits<float>::quiet_NaN() : INFINITY;
  else v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// What a file that failed to parse as safetensors is instead, by its first
// bytes (ONNX, a protobuf without a magic number, by its name); "" when
// unknown. Asked only after the length field or the header failed: a valid
// safetensors file may start with any of these bytes (a pickle's 0x80 0x02
// is also a header length of 640).
std::string other_file_kind(const uint8_t* data, size_t size, const std::string& origin) {
  auto starts = [&](const char* magic, size_t n) { return size >= n && std::memcmp(data, magic, n) == 0; };
  if (starts("PK\x03\x04", 4)) return "a zip archive, as torch.save writes (.pt, .pth)";
  if (size >= 2 && data[0] == 0x80 && data[1] >= 2 && data[1] <= 5)
    return "a Python pickle, as older torch.save writes (.pt, .pth, .bin)";
  if (starts("\x93NUMPY", 6)) return "a numpy .npy array";
  if (starts("PK\x05\x06", 4)) return "an empty zip archive";
  if (starts("\x89HDF\r\n\x1a\n", 8)) return "an HDF5 file (.h5)";
  if (starts("GGUF", 4)) return "a GGUF model";
  if (starts("\x1f\x8b", 2)) return "a gzip archive";
  if (starts("\x89PNG", 4)) return "a PNG picture";
  std::string ext = origin.size() >= 5 ? origin.substr(origin.size() - 5) : "";
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".onnx") return "an ONNX model (by its name)";
  return "";
}

}  // namespace

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& origin) {
  const std::string op = "safetensors";
  auto bad = [&](const auto&... parts) -> void { fail(op, "'", origin, "': ", parts...); };
  // A file of another kind (a torch.save archive, a .npy array) is named as
  // such rather than by the header length its first bytes would make.
  auto other_kind = [&] {
    const std::string kind = other_file_kind(data, size, origin);
    if (!kind.empty())
      bad("not a safetensors file: it looks like ", kind, "; read it with its own library and save the tensors "
          "with mha.save_safetensors (or safetensors' save_file)");
  };
  if (size < 8) other_kind(), bad("file of ", size, " bytes is too short for the 8-byte header length");
  const uint64_t header_len = read_u64_le(data);
  if (header_len > kMaxHeaderBytes) {
    other_kind();
    bad("not a safetensors file (or a damaged one): its first 8 bytes give a header length of ", header_len,
        ", above the format's limit of ", kMaxHeaderBytes);
  }
  if (header_len > size - 8) other_kind();
  if (header_len > size - 8)
    bad("header length ", header_len, " runs past the end of the file (", size - 8,
        " bytes follow the length field)");
  if (header_len < 2) other_kind();
  if (header_len < 2) bad("header of ", header_len, " bytes cannot hold a JSON object");
  const char* header = reinterpret_cast<const char*>(data + 8);
  json doc = json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) other_kind();
  if (doc.is_discarded()) bad("header is not valid JSON");
  if (!doc.is_object()) bad("header is JSON but not an object");

  const uint8_t* buffer = data + 8 + header_len;
  const uint64_t buffer_len = size - 8 - header_len;
  SafetensorsFile file;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) bad("__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__ value of '", m.key(), "' is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) bad("entry '", name, "' is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string())
      bad("entry '", name, "' has no dtype string");
    if (!entry.contains("shape") || !entry["shape"].is_array())
      bad("entry '", name, "' has no shape array");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      bad("entry '", name, "' has no data_offsets pair");
    RawTensor t;
    const std::string dt = entry["dtype"].get<std::string>();
    size_t item = 0;
    for (const auto& d : kDTypes)
      if (dt == d.name) {
        t.dtype = d.type;
        item = d.size;
      }
    if (!item) bad("entry '", name, "' has unsupported dtype '", dt, "'");
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) bad("entry '", name, "' has a shape entry that is not an integer >= 0");
      const uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad("entry '", name, "' has a dimension too large: ", v);
      t.shape.push_back(static_cast<int64_t>(v));
    }
    for (const json& o : entry["data_offsets"])
      if (!o.is_number_unsigned()) bad("entry '", name, "' has an offset that is not an integer >= 0");
    const uint64_t begin = entry["data_offsets"][0].get<uint64_t>();
    const uint64_t end = entry["data_offsets"][1].get<uint64_t>();
    if (begin > end) bad("entry '", name, "' has offsets [", begin, ", ", end, "] in the wrong order");
    if (end > buffer_len)
      bad("entry '", name, "' ends at byte ", end, " past the data buffer's ", buffer_len, " bytes");
    // Byte size of the shape, with every product checked for overflow.
    uint64_t bytes = item;
    for (int64_t d : t.shape) {
      const uint64_t u = static_cast<uint64_t>(d);
      if (u != 0 && bytes > std::numeric_limits<uint64_t>::max() / u)
        bad("entry '", name, "' shape ", shape_str(t.shape), " overflows 64 bits");
      bytes *= u;
    }
    if (bytes != end - begin)
      bad("entry '", name, "' of dtype ", dt, " and shape ", shape_str(t.shape), " needs ", bytes,
          " bytes but its offsets [", begin, ", ", end, "] span ", end - begin);
    t.bytes.assign(buffer + begin, buffer + end);
    spans.push_back({begin, end, name});
    file.tensors.emplace(name, std::move(t));
  }
  // The entries must tile the buffer exactly: no holes, no overlaps.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const Span& s : spans) {
    if (s.begin != at)
      bad("entry '", s.name, "' starts at byte ", s.begin, " but the previous data ends at ", at,
          s.begin < at ? " (overlap)" : " (hole)");
    at = s.end;
  }
  if (at != buffer_len)
    bad("the data buffer has ", buffer_len, " bytes but the entries cover ", at);
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::vector<uint8_t> bytes = io::read_file(path);
  return parse_safetensors(bytes.data(), bytes.size(), path);
}

std::vector<uint8_t> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail("safetensors", "a tensor cannot be named '__metadata__'");
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8 + text.size() + offset);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* p = out.data() + 8 + text.size();
  for (const auto& [name, t] : tensors) {
    // float32 is stored little-endian, which is the host order on every
    // platform this library builds for (checked in CMakeLists.txt).
    // An empty tensor's data() may be null, which memcpy must not see
    // (found by UBSan replaying the fuzz corpus: valid_scalar_and_zero).
    if (t.numel() > 0) std::memcpy(p, t.data(), static_cast<size_t>(t.numel()) * 4);
    p += t.numel() * 4;
  }
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  io::write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

Tensor to_float_tensor(const RawTensor& raw, const std::string& what) {
  const int64_t n = checked_numel(raw.shape, "safetensors");
  if (static_cast<uint64_t>(raw.bytes.size()) != static_cast<uint64_t>(n) * dtype_size(raw.dtype))
    fail("safetensors", what, ": ", raw.bytes.size(), " bytes do not hold shape ",
         shape_str(raw.shape), " of ", dtype_name(raw.dtype));
  Tensor result(raw.shape);  // checks the memory limit before allocating
  float* out = result.data();
  const uint8_t* p = raw.bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* e = p + i * static_cast<int64_t>(dtype_size(raw.dtype));
    switch (raw.dtype) {
      case DType::F32: std::memcpy(&out[i], e, 4); break;
      case DType::F64: { double v; std::memcpy(&v, e, 8); out[i] = static_cast<float>(v); break; }
      case DType::F16: { uint16_t v; std::memcpy(&v, e, 2); out[i] = half_to_float(v); break; }
      case DType::BF16: { uint16_t v; std::memcpy(&v, e, 2); out[i] = bf16_to_float(v); break; }
      case DType::I64: { int64_t v; std::memcpy(&v, e, 8); out[i] = static_cast<float>(v); break; }
      case DType::I32: { int32_t v; std::memcpy(&v, e, 4); out[i] = static_cast<float>(v); break; }
      case DType::I16: { int16_t v; std::memcpy(&v, e, 2); out[i] = static_cast<float>(v); break; }
      case DType::I8: out[i] = static_cast<float>(static_cast<int8_t>(*e)); break;
      case DType::U8: out[i] = static_cast<float>(*e); break;
      case DType::BOOL: out[i] = *e ? 1.0f : 0.0f; break;
    }
  }
  return result;
}

Tensor require_f32(const RawTensor& raw, const std::string& what) {
  if (raw.dtype != DType::F32)
    fail("safetensors", what, ": dtype ", dtype_name(raw.dtype), " where F32 is wanted");
  return to_float_tensor(raw, what);
}

std::map<std::string, Tensor> load_f32_tensors(const std::string& path) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, raw] : read_safetensors(path).tensors)
    out.emplace(name, require_f32(raw, "'" + path + "' tensor '" + name + "'"));
  return out;
}

}  // namespace mha
