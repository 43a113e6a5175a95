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

namespace mha::tools {

// Validators for unsigned options (seeds, --memory-limit): CLI11 would read
// "-1" as 2^64 - 1 and 2^64 as 2^64 - 1 without a word.
CLI::Validator unsigned_integer();      // digits only, at most 2^64 - 1
CLI::Validator non_negative_size();     // no minus sign (before the size suffix is read)

}  // namespace mha::tools
