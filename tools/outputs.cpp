#include "outputs.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <limits>
#include <type_traits>

#include "mha/atomic_file.h"
#include "mha/error.h"
#include "mha/threads.h"

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
  if (ext == ".gif" || ext == ".bmp" || ext == ".tif" || ext == ".tiff" || ext == ".webp") return "another picture format";
  if (ext == ".npy" || ext == ".npz") return "a numpy array file";
  if (ext == ".pt" || ext == ".pth" || ext == ".bin" || ext == ".ckpt") return "a torch.save file";
  if (ext == ".onnx") return "an ONNX model";
  if (ext == ".h5" || ext == ".hdf5") return "an HDF5 file";
  if (ext == ".gguf") return "a GGUF model";
  if (ext == ".zip" || ext == ".gz" || ext == ".tar") return "an archive";
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

namespace {

// A digit string's value; false if it has no digits, another character, or
// does not fit (no saturation: from_chars reports the overflow).
template <typename T>
bool parse_decimal(const std::string& s, T& v) {
  if (s.empty() || (s[0] == '-' && (s.size() == 1 || !std::is_signed_v<T>))) return false;
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, v);
  return r.ec == std::errc() && r.ptr == end;
}

}  // namespace

std::string readable(int64_t v) {
  if (v == std::numeric_limits<int64_t>::max()) return "2^63 - 1";
  if (v == std::numeric_limits<int64_t>::min()) return "-2^63";
  if (v == std::numeric_limits<int32_t>::max()) return "2^31 - 1";
  return std::to_string(v);
}

CLI::Validator integer_in(int64_t lo, int64_t hi, bool allow_empty) {
  const std::string range = "[" + readable(lo) + ", " + readable(hi) + "]";
  return CLI::Validator(
      [lo, hi, range, allow_empty](std::string& s) -> std::string {
        if (s.empty() && allow_empty) return "";
        int64_t v = 0;
        if (!parse_decimal(s, v) || v < lo || v > hi) return "'" + s + "' is not an integer in " + range;
        s = std::to_string(v);  // "007" -> "7": CLI11 would read a leading 0 as octal
        return "";
      },
      range, "integer in " + range);
}

CLI::Validator thread_count() { return integer_in(1, mha::max_num_threads()); }

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        if (!parse_decimal(s, v)) return "'" + s + "' is not an integer in [0, 2^64 - 1]";
        s = std::to_string(v);
        return "";
      },
      "[0, 2^64 - 1]", "unsigned 64-bit integer");
}

CLI::Validator size_in_bytes() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::string wanted = "' is not a size: wanted a whole number of bytes with an optional unit "
                                   "(B, KB, MB, GB, TB; 1 KB = 1024 bytes), at most 2^64 - 1 bytes";
        size_t digits = 0;
        while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
        size_t at = digits;
        while (at < s.size() && s[at] == ' ') ++at;
        std::string unit = s.substr(at);
        std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
        int shift = -1;
        const char* const units[][3] = {{"b", "", ""}, {"k", "kb", "kib"}, {"m", "mb", "mib"},
                                        {"g", "gb", "gib"}, {"t", "tb", "tib"}};
        if (unit.empty()) shift = 0;
        for (int u = 0; u < 5 && shift < 0; ++u)
          for (const char* name : units[u])
            if (*name && unit == name) shift = 10 * u;
        uint64_t v = 0;
        if (digits == 0 || shift < 0 || !parse_decimal(s.substr(0, digits), v)) return "'" + s + wanted;
        if (shift > 0 && v > (std::numeric_limits<uint64_t>::max() >> shift)) return "'" + s + wanted;
        s = std::to_string(v << shift);
        return "";
      },
      "", "size in bytes");
}

}  // namespace mha::tools
