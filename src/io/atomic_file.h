// src/io/atomic_file.h: writing files so that readers never see half of one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mha::io {

// Writes `bytes` to a temporary file in the same folder as `path`, flushes it
// to disk and renames it over `path`. On any error the temporary is removed,
// `path` keeps its old content, and mha::Error is thrown naming the file.
// Where the kernel allows (Linux O_TMPFILE) the file has no name until it is
// complete, so even a SIGKILL mid-write leaves nothing behind.
void write_file_atomic(const std::string& path, const uint8_t* bytes, size_t size);
inline void write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  write_file_atomic(path, bytes.data(), bytes.size());
}

// The whole content of `path`; mha::Error naming the file if it cannot be read.
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace mha::io
