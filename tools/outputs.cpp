#include "outputs.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>

#include "mha/atomic_file.h"
#include "mha/error.h"

namespace mha::tools {

namespace {

// The lower-case extension of a path's file name (".png"), or "".
std::string extension_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

// What an extension names, for the extensions whose format a reader would
// take for granted; "" for others (any name without one of these is fine).
const char* format_of(const std::string& ext) {
  if (ext == ".png") return "a PNG picture";
  if (ext == ".jpg" || ext == ".jpeg") return "a JPEG picture";
  if (ext == ".svg") return "an SVG picture";
  if (ext == ".pdf") return "a PDF document";
  if (ext == ".csv") return "a CSV table";
  if (ext == ".json") return "a JSON file";
  if (ext == ".safetensors") return "a safetensors file";
  return "";
}

// Two paths name one file: the same inode when both exist, otherwise the
// same absolute path with "." and ".." resolved (and links followed).
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(std::filesystem::absolute(a), ea);
  const auto cb = std::filesystem::weakly_canonical(std::filesystem::absolute(b), eb);
  if (ea || eb) return a == b;
  return ca == cb;
}

}  // namespace

void check_outputs(const char* op, const std::vector<NamedPath>& outputs, const std::vector<std::string>& formats,
                   const std::vector<NamedPath>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [option, path] = outputs[i];
    if (path.empty()) continue;
    io::check_output_path(path);
    const std::string ext = extension_of(path), wanted = i < formats.size() ? formats[i] : "";
    const char* named = format_of(ext);
    if (*named && !wanted.empty() && ext != wanted && !(ext == ".jpeg" && wanted == ".jpg"))
      fail(op, option, ": '", path, "' names ", named, ", but ", option, " writes ", format_of(wanted),
           "; give it a ", wanted, " name");
    for (size_t j = 0; j < i; ++j)
      if (!outputs[j].second.empty() && same_file(path, outputs[j].second))
        fail(op, option, ": '", path, "' is also ", outputs[j].first, "; each output needs its own file");
    for (const auto& [in_option, in_path] : inputs)
      if (!in_path.empty() && same_file(path, in_path))
        fail(op, option, ": '", path, "' is also the input ", in_option, ", which writing would destroy");
  }
}

}  // namespace mha::tools

namespace mha::tools {

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const char* end = s.data() + s.size();
        const auto r = std::from_chars(s.data(), end, v);
        if (s.empty() || r.ptr != end) return "'" + s + "' is not an integer >= 0";
        if (r.ec == std::errc::result_out_of_range) return "'" + s + "' is above 2^64 - 1";
        return "";
      },
      "UINT64", "unsigned 64-bit integer");
}

CLI::Validator non_negative_size() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.find('-') != std::string::npos) return "'" + s + "' is negative; wanted a size >= 0 (0: the default)";
        return "";
      },
      "", "non-negative size");
}

}  // namespace mha::tools
