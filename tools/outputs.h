// tools/outputs.h: the checks every command runs on its output files before
// it starts any work, so that a command that fails leaves no file behind and
// never spends minutes of training on a path it cannot write.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mha::tools {

// An option and the path it names ("--out", "model.safetensors"); an empty
// path means the option is off.
using NamedPath = std::pair<std::string, std::string>;

// For each output that is not off: the path can be written (io::check_output_path:
// its folder exists, it is not a folder, a link or a device), its extension
// does not name another format than `formats` says it writes (".png" for
// a safetensors checkpoint), and no two outputs, and no output and input,
// are the same file. Throws mha::Error naming the option.
//   outputs: {option, path}; formats: the extension each writes (".png", ...)
void check_outputs(const char* op, const std::vector<NamedPath>& outputs, const std::vector<std::string>& formats,
                   const std::vector<NamedPath>& inputs = {});

}  // namespace mha::tools

#include <CLI/CLI.hpp>
#include <cstdint>

namespace mha::tools {

// The one rule for the tool's options (tests/python/test_cli_rules.py walks
// every command and option): a value that is not of the option's kind, or
// outside its range, is a usage error of CLI11's (exit status 2) that names
// the option, the value and the range; nothing saturates or wraps.

// Integers: plain decimal digits with an optional '-' (no "0x", no octal
// "010", no '+', no spaces), in [lo, hi]; the string is normalised, so that
// CLI11's own conversion (strtoll with base 0) reads it as written. A
// transform: add it with ->transform(). With allow_empty, "" passes (for a
// list option whose "" means "none").
CLI::Validator integer_in(int64_t lo, int64_t hi, bool allow_empty = false);
// Thread counts: integer_in(1, mha::max_num_threads()).
CLI::Validator thread_count();
// Seeds and other unsigned options: digits only, at most 2^64 - 1.
CLI::Validator unsigned_integer();
// Sizes in bytes (--memory-limit): a whole number with an optional unit
// B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (powers of 1024, any case),
// at most 2^64 - 1 bytes; normalised to the number of bytes.
CLI::Validator size_in_bytes();
// A number as people read it: 2^63 - 1, 2^31 - 1, 2^64 - 1, else its digits.
std::string readable(int64_t v);

}  // namespace mha::tools
