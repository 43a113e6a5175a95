// mha/error.h: the one exception type the library throws for bad input.
//
// Every message starts with the operation in brackets, then names the
// argument, the shape (or value) seen and the shape wanted, e.g.
//   [MultiHeadAttention.forward] keys: batch size 3 differs from queries' 2
// It derives from std::invalid_argument so that pybind11 turns it into a
// Python ValueError and C++ callers can catch either type.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace mha {

// The exception for every invalid input, file problem or size the library
// refuses; what() is the message described above.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Builds "[op] " + the streamed parts and throws mha::Error.
template <typename... Parts>
[[noreturn]] void fail(const std::string& op, const Parts&... parts) {
  std::ostringstream out;
  out << "[" << op << "] ";
  (out << ... << parts);
  throw Error(out.str());
}

// "(2, 4, 100)": the notation every message uses for shapes.
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace mha
