// mha/safetensors.h: read and write safetensors files.
//
// The format (https://github.com/huggingface/safetensors): 8 bytes of
// little-endian u64 N, then N bytes of a JSON object mapping each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the byte
// buffer that follows the header), plus an optional "__metadata__" object of
// string to string. The reader checks every length and offset before use:
// the header fits in the file, is a JSON object, each entry has a known dtype,
// a shape of non-negative integers whose byte size (checked for overflow)
// equals end - begin, and the entries tile the buffer without holes or
// overlaps. Any violation throws mha::Error naming the file and the entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mha/tensor.h"

namespace mha {

// The element types a safetensors file may hold (the reader accepts these;
// the writer writes F32).
enum class DType {
  F64,   // IEEE double
  F32,   // IEEE single: mha's own type
  F16,   // IEEE half
  BF16,  // bfloat16
  I64,   // signed integers
  I32,   // signed integers
  I16,   // signed integers
  I8,    // signed integers
  U8,    // unsigned bytes
  BOOL,  // one byte, 0 or not
};

// "F32" etc., as the format spells them.
const char* dtype_name(DType t);
// Bytes per element of `t` (8, 4, 2 or 1).
size_t dtype_size(DType t);

// One tensor of a file, as stored: its dtype, shape and raw bytes.
struct RawTensor {
  DType dtype = DType::F32;    // element type
  Shape shape;                 // extents, outermost first
  std::vector<uint8_t> bytes;  // little-endian, row-major
};

// A whole safetensors file: its tensors by name and its __metadata__.
struct SafetensorsFile {
  std::map<std::string, RawTensor> tensors;     // by name
  std::map<std::string, std::string> metadata;  // the optional __metadata__
};

// Parse a whole file already in memory; `origin` names it in errors. Every
// length, offset, dtype and shape is checked before use (see above); a
// violation throws mha::Error naming `origin` and the entry.
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size,
                                  const std::string& origin = "buffer");
// Read and parse `path`; mha::Error when it cannot be read or is malformed.
SafetensorsFile read_safetensors(const std::string& path);

// The bytes of a file holding `tensors` as F32 (names in sorted order).
// Throws mha::Error for a tensor named "__metadata__".
std::vector<uint8_t> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
// Write `tensors` as F32 to `path` through a temporary file renamed into
// place, so a failed or killed write never leaves a partial file. Throws
// mha::Error naming the file when it cannot be written.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The tensor as float32. F32 is copied; F64, F16, BF16 and the integer
// types are converted (integers as PyTorch promotes them to float32).
// `what` names the tensor in errors.
Tensor to_float_tensor(const RawTensor& raw, const std::string& what);
// Only F32 accepted: for parameters, where a silent conversion would hide a
// mistake. Throws mha::Error naming `what` and the dtype seen.
Tensor require_f32(const RawTensor& raw, const std::string& what);

// Every tensor of a file as float32 parameters (all must be F32).
std::map<std::string, Tensor> load_f32_tensors(const std::string& path);

}  // namespace mha
