// mha/atomic_file.h: writing files so that readers never see half of one.
//
// What mha's own writers use (checkpoints, safetensors, pictures, the `mha`
// tool's outputs), for programs that write files beside them:
//   mha::io::check_output_path("out.csv");   // before the work: fail early
//   mha::io::write_file_atomic("out.csv", bytes);
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
// The same, for the bytes of a vector.
inline void write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  write_file_atomic(path, bytes.data(), bytes.size());
}

// Refuses, with the message write_file_atomic would give, a path it could
// not write: empty, with a NUL byte, a folder, an existing file that is not
// a regular one (a symbolic link, FIFO or device: never replaced), or a
// folder that is missing or not writable. Commands check every output with
// it before they start work, so that a failing command leaves no file.
void check_output_path(const std::string& path);

// The whole content of `path`; mha::Error naming the file if it cannot be read.
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace mha::io
