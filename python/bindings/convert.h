// python/bindings/convert.h: Python -> mha conversions for every binding file, and
// mha::Tensor -> numpy.
//
// Every value a binding reads as numbers goes through real_array(): numpy
// arrays, nested lists and CPU torch tensors (detached, without a copy, so a
// tensor that requires grad is read as its data) of bool, integer or floating
// dtype. Anything else is an mha.ArgumentTypeError naming the operation and
// the argument, never a crash and never a silent conversion: strings, bytes,
// dicts, None, objects, ragged lists (nothing to read), complex numbers (the
// imaginary part would be dropped), dates and durations, structured records.
//
// mha.ArgumentTypeError derives from both TypeError (the argument is of the
// wrong kind) and ValueError (mha's one error type, docs/errors.md), so code
// that catches either keeps working. Arguments that pybind11 converts itself
// (int, float, bool) get the same error, naming the argument, through
// add_type_help(), which every binding file's functions pass through at the
// end of the module's set-up.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "mha/error.h"
#include "mha/tensor.h"
#include "mha/valid_lens.h"

namespace mha::python {

// Thrown for an argument of the wrong kind; Python sees mha.ArgumentTypeError,
// a TypeError and a ValueError.
class ArgumentTypeError : public Error {
 public:
  using Error::Error;
};

// fail(kType, op, parts...): as mha::fail, but throws ArgumentTypeError.
struct TypeMismatch {};
inline constexpr TypeMismatch kType{};

template <typename... Parts>
[[noreturn]] void fail(TypeMismatch, const std::string& op, const Parts&... parts) {
  try {
    mha::fail(op, parts...);
  } catch (const Error& e) {
    throw ArgumentTypeError(e.what());
  }
}
using mha::fail;

// The Python class of ArgumentTypeError (module.cpp creates it).
inline PyObject* argument_type_error_class = nullptr;

// A real number argument (dropout, learning rates): a Python int or float or
// a numpy scalar or 0-d array of bool, integer or floating dtype; anything
// else is a TypeError. pybind11's own float caster reads whatever has
// __float__: a one-element array of strings, a complex scalar.
struct Real {
  double value = 0.0;
  operator double() const { return value; }
  operator float() const { return static_cast<float>(value); }
};

}  // namespace mha::python

namespace pybind11::detail {
template <>
struct type_caster<mha::python::Real> {
  PYBIND11_TYPE_CASTER(mha::python::Real, const_name("float"));
  bool load(handle src, bool) {
    if (!src || src.is_none() || PyUnicode_Check(src.ptr()) || PyBytes_Check(src.ptr()) ||
        PyComplex_Check(src.ptr()) || !PyNumber_Check(src.ptr()))
      return false;
    if (hasattr(src, "dtype") && hasattr(src.attr("dtype"), "kind")) {  // numpy scalars and arrays
      const std::string kind = src.attr("dtype").attr("kind").cast<std::string>();
      if (kind != "b" && kind != "i" && kind != "u" && kind != "f") return false;
      if (hasattr(src, "ndim") && src.attr("ndim").cast<int>() != 0) return false;
    }
    const double v = PyFloat_AsDouble(src.ptr());
    if (v == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    value.value = v;
    return true;
  }
  static handle cast(mha::python::Real r, return_value_policy, handle) { return PyFloat_FromDouble(r.value); }
};
}  // namespace pybind11::detail

namespace mha::python {

namespace py = pybind11;
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// A torch tensor becomes its numpy array (detached, on the CPU: no copy for a
// CPU tensor); anything else is returned as it is.
inline py::object as_numpy(const py::handle& obj) {
  // A numpy array first: asking it for `detach` raises and formats an
  // AttributeError inside hasattr, a few microseconds per argument (the d2l
  // chapter's toy call passes four).
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::object>(obj);
  if (py::hasattr(obj, "detach") && py::hasattr(obj, "numpy") && py::hasattr(obj, "requires_grad")) {
    py::object t = obj.attr("detach")().attr("cpu")();
    // numpy has no bfloat16: widened to float32 (exact), never read as an
    // empty array.
    if (std::string(py::str(t.attr("dtype"))) == "torch.bfloat16") t = t.attr("float")();
    return t.attr("numpy")();
  }
  return py::reinterpret_borrow<py::object>(obj);
}

inline Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

// `obj` as a numpy array of bool, integer or floating dtype (not converted
// yet). `what` names the argument in messages ("queries", "'W_q.weight'").
inline std::string type_name(const py::handle& obj) {
  return obj.is_none() ? std::string("None") : py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

// Whether x is an integer as Python code passes one: an int or a numpy
// integer scalar (__index__, not an array), never a bool, which would silently
// count as 0 or 1 (a window of True is no window of 1).
inline bool is_integer(const py::handle& x) {
  return PyIndex_Check(x.ptr()) && !PyBool_Check(x.ptr()) && !py::isinstance<py::array>(x) &&
         type_name(x) != "bool_" && type_name(x) != "bool";
}

// x as an int64 when is_integer(x), else an ArgumentTypeError naming op and
// name with `wanted`.
inline int64_t integer_arg(const py::handle& x, const char* op, const char* name, const char* wanted) {
  if (!is_integer(x)) fail(kType, op, name, ": got ", type_name(x), ", wanted ", wanted);
  return py::int_(py::reinterpret_borrow<py::object>(x)).cast<int64_t>();
}

inline py::array real_array(const py::handle& obj, const std::string& op, const std::string& what) {
  // What numpy would read as a 0-d array of characters or objects, or not at all.
  if (obj.is_none() || PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr()) ||
      PyDict_Check(obj.ptr()))
    fail(kType, op, what, ": got ", type_name(obj), ", wanted an array of numbers (bool, integer or floating)");
  py::array a;
  try {
    a = py::array::ensure(as_numpy(obj));
  } catch (const py::error_already_set&) {
  }
  if (!a) {
    PyErr_Clear();
    fail(kType, op, what, ": cannot be read as a numeric array");
  }
  const char kind = a.dtype().kind();
  if (kind == 'O') fail(kType, op, what, ": cannot be read as a numeric array");
  if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f')
    fail(kType, op, what, ": dtype ", std::string(py::str(a.dtype())),
         " is not a real number type; wanted bool, integer or floating");
  return a;
}

inline FloatArray float_array(const py::handle& obj, const std::string& op, const std::string& what) {
  FloatArray f = FloatArray::ensure(real_array(obj, op, what));
  if (!f) {
    PyErr_Clear();
    fail(kType, op, what, ": cannot be read as a numeric array");
  }
  return f;
}

inline Tensor to_tensor(const FloatArray& a) {
  return Tensor(shape_of(a), std::vector<float>(a.data(), a.data() + a.size()));
}

inline Tensor to_tensor(const py::handle& obj, const std::string& op, const std::string& what) {
  return to_tensor(float_array(obj, op, what));
}

// valid_lens: None, (B,) or (B, Q) (`per_query` names the second form in
// messages), read as the d2l chapter compares them: key k is kept iff
// float32(k) < length, in the promoted dtype. Integer and float32 lengths are
// compared in float32 there (torch promotes int64 against float32 to
// float32), and so here. float64 lengths are compared in float64: k < x iff
// k < ceil(x) for a whole k, so x is kept as ceil(x), which float32 holds
// exactly up to 2^24 keys (rounded up past that); 3.0000001 keeps key 3 and
// 1e-300 keeps key 0, as in the chapter, where rounding to float32 first
// would mask them. NaN, negative and infinite lengths pass unchanged, to
// ValidLens::check's errors and rules.
inline ValidLens to_valid_lens(const py::handle& obj, const std::string& op, const char* per_query = "(B, Q)") {
  if (obj.is_none()) return {};
  const py::array a = real_array(obj, op, "valid_lens");
  if (a.ndim() != 1 && a.ndim() != 2)
    fail(op, "valid_lens: shape ", shape_str(shape_of(a)), " is neither (B,) nor ", per_query);
  if (a.dtype().kind() != 'f' || a.dtype().itemsize() <= 4) return ValidLens::from_tensor(to_tensor(float_array(a, op, "valid_lens")));
  using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;
  const DoubleArray d = DoubleArray::ensure(a);
  if (!d) {
    PyErr_Clear();
    fail(kType, op, "valid_lens: cannot be read as a numeric array");
  }
  std::vector<float> lens(static_cast<size_t>(d.size()));
  for (size_t i = 0; i < lens.size(); ++i) {
    const double x = d.data()[i];
    if (!(x > 0) || std::isinf(x)) {
      lens[i] = static_cast<float>(x);  // NaN, <= 0 (the check refuses < 0), +-inf
      continue;
    }
    const double whole = std::ceil(x);
    if (whole > static_cast<double>(std::numeric_limits<float>::max())) {
      lens[i] = std::numeric_limits<float>::infinity();
      continue;
    }
    float f = static_cast<float>(whole);
    if (static_cast<double>(f) < whole) f = std::nextafter(f, std::numeric_limits<float>::infinity());
    lens[i] = f;
  }
  return ValidLens::from_tensor(Tensor(shape_of(a), std::move(lens)));
}

// A real number (int or float, numpy scalars included), refusing strings,
// None and the like.
inline double real_number(const py::handle& obj, const std::string& op, const std::string& what) {
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) || obj.is_none() ||
      !PyNumber_Check(obj.ptr()) || PyComplex_Check(obj.ptr()))
    fail(kType, op, what, ": ", std::string(py::repr(obj)), " is not a real number");
  const double v = PyFloat_AsDouble(obj.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    fail(kType, op, what, ": ", std::string(py::repr(obj)), " is not a real number");
  }
  return v;
}

// Integers (token ids, class targets) as int32, refusing what int32 cannot
// hold exactly: a fractional or non-finite float, a value past 2^31 - 1.
struct IntValues {
  Shape shape;
  std::vector<int32_t> values;
};

inline IntValues int_values(const py::handle& obj, const std::string& op, const std::string& what) {
  const py::array a = real_array(obj, op, what);
  IntValues out{shape_of(a), {}};
  out.values.resize(static_cast<size_t>(a.size()));
  constexpr double lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  auto refuse = [&](size_t i, const std::string& v, const char* why) {
    fail(op, what, ": entry ", i, " is ", v, ", ", why);
  };
  const char kind = a.dtype().kind();
  if (kind == 'f') {
    const DoubleArray d = DoubleArray::ensure(a);
    for (size_t i = 0; i < out.values.size(); ++i) {
      const double v = d.data()[i];
      if (!std::isfinite(v) || v != std::floor(v)) refuse(i, std::string(py::repr(py::float_(v))), "not an integer");
      if (v < lo || v > hi) refuse(i, std::string(py::repr(py::float_(v))), "outside the 32-bit integers");
      out.values[i] = static_cast<int32_t>(v);
    }
  } else if (kind == 'u' && a.itemsize() == 8) {
    const auto d = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    for (size_t i = 0; i < out.values.size(); ++i) {
      if (d.data()[i] > static_cast<uint64_t>(hi)) refuse(i, std::to_string(d.data()[i]), "outside the 32-bit integers");
      out.values[i] = static_cast<int32_t>(d.data()[i]);
    }
  } else {
    const Int64Array d = Int64Array::ensure(a);
    for (size_t i = 0; i < out.values.size(); ++i) {
      const int64_t v = d.data()[i];
      if (v < lo || v > hi) refuse(i, std::to_string(v), "outside the 32-bit integers");
      out.values[i] = static_cast<int32_t>(v);
    }
  }
  return out;
}

// A list of integers (head numbers, batch rows): a sequence or 1-D array of
// integers, nothing else.
inline std::vector<int64_t> int_list(const py::handle& obj, const std::string& op, const std::string& what) {
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj))
    fail(kType, op, what, ": a string is not a list of integers");
  const IntValues v = int_values(obj, op, what);
  if (v.shape.size() != 1) fail(op, what, ": shape ", shape_str(v.shape), " is not a flat list of integers");
  return std::vector<int64_t>(v.values.begin(), v.values.end());
}

inline py::array_t<float> to_numpy(const Tensor& t) {
  py::array_t<float> out(std::vector<py::ssize_t>(t.shape().begin(), t.shape().end()));
  if (t.numel()) std::memcpy(out.mutable_data(), t.data(), static_cast<size_t>(t.numel()) * 4);
  return out;
}

// Hands the tensor's buffer to numpy without a copy: the array keeps the
// tensor alive. For outputs as large as the inputs this saves a full copy at
// the peak of a call.
inline py::array_t<float> hand_to_numpy(Tensor&& t) {
  auto* owner = new Tensor(std::move(t));
  py::capsule free_owner(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(owner->shape().begin(), owner->shape().end());
  return py::array_t<float>(shape, owner->data(), free_owner);
}

// A tensor the binding owns and gives away (a call's result): handed over.
inline py::array_t<float> to_numpy(Tensor&& t) { return hand_to_numpy(std::move(t)); }

// A dict of arrays by name, the argument `arg` ("state_dict", "grads"); its
// values are named "<arg>['<name>']" in messages.
inline std::map<std::string, Tensor> to_tensors(const py::handle& obj, const std::string& op,
                                                const std::string& arg = "state_dict") {
  if (!py::isinstance<py::dict>(obj))
    fail(kType, op, arg, ": ", std::string(py::str(py::type::of(obj))), " is not a dict");
  std::map<std::string, Tensor> s;
  for (auto [k, v] : py::reinterpret_borrow<py::dict>(obj)) {
    if (!py::isinstance<py::str>(k)) fail(kType, op, arg, ": key ", std::string(py::repr(k)), " is not a string");
    const std::string name = py::cast<std::string>(k);
    s[name] = to_tensor(v, op, arg + "['" + name + "']");
  }
  return s;
}

inline py::dict to_dict(const std::map<std::string, Tensor>& s) {
  py::dict d;
  for (const auto& [k, v] : s) d[py::str(k)] = to_numpy(v);
  return d;
}

// An int-sized count or size taken as int64_t (so that pybind11 never refuses
// it for its width): `value` if it fits an int, else an error with the range.
inline int int_sized(int64_t value, const char* op, const char* name) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
    fail(op, name, ": ", value, " is out of range; wanted at most ", std::numeric_limits<int>::max(), " in magnitude");
  return static_cast<int>(value);
}

// ---- arguments pybind11 could not convert -----------------------------------
//
// When no overload of a bound function accepts a call's arguments, pybind11
// raises a TypeError that prints every argument's repr (whole tensors
// included) and does not say which one is wrong. add_type_help() gives every
// function, method, constructor, static method and property setter of a
// module one more overload, tried last, that names the operation and the
// argument: "[MultiHeadAttention] num_heads: got str, wanted an integer"
// (mha.ArgumentTypeError), or the unknown keyword or the count of arguments
// (TypeError). The wanted types are read from pybind11's own signature of the
// first overload, so a new binding is covered without a line here.

struct Param {
  std::string name, type;
};

// What the last overload checks a call against: the first overload's
// parameters (positional and keyword), and the keywords only other overloads
// take (the cached call's `cache`).
struct Signature {
  std::vector<Param> params;
  std::vector<Param> other_keywords;
};

// Splits `text` at the commas outside brackets.
inline std::vector<std::string> split_top(const std::string& text) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (const char c : text) {
    if (c == '(' || c == '[' || c == '{' || c == '<') ++depth;
    if (c == ')' || c == ']' || c == '}' || c == '>') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  for (std::string& p : parts) {
    const size_t a = p.find_first_not_of(' '), b = p.find_last_not_of(' ');
    p = a == std::string::npos ? std::string() : p.substr(a, b - a + 1);
  }
  return parts;
}

// A parameter's type as pybind11 2 spells it, which the checks below read:
// pybind11 3 (the build's with numpy 2) writes int as "typing.SupportsInt |
// typing.SupportsIndex", float as "typing.SupportsFloat | ...", Optional[T]
// as "T | None", List/Tuple/Dict as "collections.abc.Sequence[...]",
// "tuple[...]", "collections.abc.Mapping[...]" and arrays as
// "typing.Annotated[numpy.typing.ArrayLike, ...]".
inline std::string pybind11_2_type(const std::string& type) {
  std::vector<std::string> parts;  // the union's members, at the top level
  {
    std::string cur;
    int depth = 0;
    for (size_t i = 0; i < type.size(); ++i) {
      const char c = type[i];
      if (c == '[' || c == '(') ++depth;
      if (c == ']' || c == ')') --depth;
      if (depth == 0 && type.compare(i, 3, " | ") == 0) {
        parts.push_back(cur);
        cur.clear();
        i += 2;
        continue;
      }
      cur += c;
    }
    parts.push_back(cur);
  }
  bool optional = false;
  std::vector<std::string> kinds;
  for (const std::string& part : parts) {
    if (part == "None") optional = true;
    else if (part != "typing.SupportsIndex" || parts.size() == 1) kinds.push_back(part);
  }
  std::string t;
  if (kinds.size() != 1) {
    t = "object";  // a union of kinds: left to pybind11
  } else if (kinds[0] == "typing.SupportsInt") {
    t = "int";
  } else if (kinds[0] == "typing.SupportsFloat") {
    t = "float";
  } else if (kinds[0].rfind("typing.Annotated[numpy", 0) == 0 || kinds[0].rfind("numpy.typing.", 0) == 0) {
    t = "numpy.ndarray";
  } else {
    t = kinds[0];
    const size_t open = t.find('[');
    if (open != std::string::npos && t.back() == ']') {
      std::string name = t.substr(0, open);
      if (name == "collections.abc.Sequence" || name == "list") name = "List";
      else if (name == "tuple") name = "Tuple";
      else if (name == "collections.abc.Mapping" || name == "dict") name = "Dict";
      std::string inner;
      for (const std::string& a : split_top(t.substr(open + 1, t.size() - open - 2)))
        inner += (inner.empty() ? "" : ", ") + pybind11_2_type(a);
      t = name + "[" + inner + "]";
    }
  }
  return optional ? "Optional[" + t + "]" : t;
}

// The parameters of one signature line "name(a: int, b: float = 0.0) -> None"
// -> {a: int}, {b: float}; false if the line holds no signature.
inline bool line_params(const std::string& line, std::vector<Param>& out) {
  const size_t open = line.find('(');
  if (open == std::string::npos || line.find("*args") != std::string::npos) return false;
  int depth = 0;
  size_t close = std::string::npos;
  for (size_t i = open; i < line.size() && close == std::string::npos; ++i) {
    if (line[i] == '(' || line[i] == '[' || line[i] == '{' || line[i] == '<') ++depth;
    if (line[i] == ')' || line[i] == ']' || line[i] == '}' || line[i] == '>')
      if (--depth == 0) close = i;
  }
  if (close == std::string::npos) return false;
  out.clear();
  for (const std::string& part : split_top(line.substr(open + 1, close - open - 1))) {
    const size_t colon = part.find(':');
    Param p;
    p.name = part.substr(0, colon);
    if (colon != std::string::npos) {
      std::string type = part.substr(colon + 1);
      const size_t eq = type.find(" = ");
      if (eq != std::string::npos) type = type.substr(0, eq);
      p.type = split_top(type).empty() ? std::string() : pybind11_2_type(type.substr(type.find_first_not_of(' ')));
    }
    out.push_back(p);
  }
  return true;
}

// Every overload's parameters in a pybind11 docstring, first overload first:
// the first signature line, and for an overloaded function each "N. name(...)"
// line (other lines are documentation, whose parentheses are not signatures).
inline std::vector<std::vector<Param>> signature_overloads(const std::string& doc) {
  std::vector<std::vector<Param>> overloads;
  size_t line_start = 0;
  bool overloaded = false;
  while (line_start < doc.size()) {
    size_t line_end = doc.find('\n', line_start);
    if (line_end == std::string::npos) line_end = doc.size();
    const std::string line = doc.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line == "Overloaded function.") overloaded = true;
    size_t digits = 0;
    while (digits < line.size() && std::isdigit(static_cast<unsigned char>(line[digits]))) ++digits;
    const bool numbered = digits > 0 && line.compare(digits, 2, ". ") == 0;
    if (overloaded ? !numbered : !overloads.empty()) continue;
    std::vector<Param> params;
    if (line_params(numbered ? line.substr(digits + 2) : line, params)) overloads.push_back(params);
  }
  return overloads;
}

inline bool is_string(const py::handle& v) { return PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()); }

// Whether pybind11 could read `v` as `type` (a signature's type), as far as
// the kind goes: a value of the right kind that does not fit (an integer past
// 64 bits) is left to pybind11's message.
inline bool fits_kind(const std::string& type, const py::handle& v);
inline bool fits(const std::string& type, const py::handle& v) {
  try {
    return fits_kind(type, v);
  } catch (const py::error_already_set&) {
    return true;  // left to pybind11
  } catch (const py::cast_error&) {
    return true;
  }
}
inline bool fits_kind(const std::string& type, const py::handle& v) {
  auto inner = [&](const char* prefix) { return split_top(type.substr(std::strlen(prefix), type.size() - std::strlen(prefix) - 1)); };
  if (type.empty() || type == "object" || type.rfind("numpy.", 0) == 0) return true;
  if (type.rfind("Optional[", 0) == 0) return v.is_none() || fits(inner("Optional[").at(0), v);
  if (type == "int" || type == "float") {
    if (v.is_none() || is_string(v) || PyComplex_Check(v.ptr()) || !PyNumber_Check(v.ptr())) return false;
    if (type == "int" && PyFloat_Check(v.ptr())) return false;
    if (py::hasattr(v, "dtype") && py::hasattr(v.attr("dtype"), "kind")) {  // numpy scalars and arrays
      const std::string kind = v.attr("dtype").attr("kind").cast<std::string>();
      const bool real = kind == "b" || kind == "i" || kind == "u" || (type == "float" && kind == "f");
      return real && (!py::hasattr(v, "ndim") || v.attr("ndim").cast<int>() == 0);
    }
    return true;
  }
  if (type == "bool") return PyBool_Check(v.ptr()) || type_name(v) == "bool_" || type_name(v) == "bool";
  if (type == "str") return is_string(v);
  if (type == "list") return PyList_Check(v.ptr());
  if (type == "dict") return PyDict_Check(v.ptr());
  if (type.rfind("List[", 0) == 0 || type.rfind("Tuple[", 0) == 0) {
    if (is_string(v) || !PySequence_Check(v.ptr())) return false;
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(v);
    const bool list = type[0] == 'L';
    const std::vector<std::string> types = inner(list ? "List[" : "Tuple[");
    if (!list && types.size() != seq.size()) return false;
    for (size_t i = 0; i < seq.size(); ++i)
      if (!fits(list ? types.at(0) : types.at(i), seq[i])) return false;
    return true;
  }
  if (type.rfind("Dict[", 0) == 0) {
    if (!PyDict_Check(v.ptr())) return false;
    const std::vector<std::string> types = inner("Dict[");
    for (auto [k, x] : py::reinterpret_borrow<py::dict>(v))
      if (!fits(types.at(0), k) || !fits(types.at(1), x)) return false;
    return true;
  }
  if (type.rfind("mha._core.", 0) == 0) {  // a class or enum of this module
    py::object cls = py::module_::import("mha._core");
    for (const std::string& part : split_top(type.substr(10))) {
      size_t from = 0;
      for (size_t dot = part.find('.'); ; dot = part.find('.', from)) {
        const std::string name = part.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
        if (!py::hasattr(cls, name.c_str())) return true;
        cls = cls.attr(name.c_str());
        if (dot == std::string::npos) break;
        from = dot + 1;
      }
    }
    return py::isinstance(v, cls);
  }
  return true;
}

// What a signature's type means, for a message.
inline std::string wanted_of(const std::string& type) {
  if (type == "int") return "an integer";
  if (type == "float") return "a real number (int, float or a numpy number)";
  if (type == "bool") return "True or False";
  if (type == "str") return "a string";
  if (type == "Tuple[float, float]") return "a pair of real numbers";
  if (type == "List[Tuple[int, int]]") return "a list of (int, int) pairs";
  if (type == "List[str]") return "a list of strings";
  if (type == "Dict[str, str]") return "a dict of strings by string";
  if (type.rfind("Optional[", 0) == 0) return wanted_of(type.substr(9, type.size() - 10)) + " or None";
  std::string t = type;
  if (t.rfind("mha._core.", 0) == 0) t = "mha." + t.substr(10);
  return t;
}

// Whether pybind11 reads `v` as `type` only in its second pass, with
// conversions: an int or a numpy number for a float, a numpy integer or bool
// for an int, a numpy bool for a bool, and such elements of a list or tuple.
inline bool needs_conversion(const std::string& type, const py::handle& v) {
  if (type == "float") return !PyFloat_Check(v.ptr());
  if (type == "int") return !PyLong_Check(v.ptr());
  if (type == "bool") return !PyBool_Check(v.ptr());
  const bool list = type.rfind("List[", 0) == 0;
  if ((list || type.rfind("Tuple[", 0) == 0) && PySequence_Check(v.ptr()) && !is_string(v)) {
    const std::vector<std::string> types = split_top(type.substr(list ? 5 : 6, type.size() - (list ? 6 : 7)));
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(v);
    for (size_t i = 0; i < seq.size(); ++i)
      if (!types.empty() && needs_conversion(types.at(list ? 0 : std::min(i, types.size() - 1)), seq[i])) return true;
  }
  return false;
}

// The bindings take integers as int64_t, seeds and dropout keys as uint64_t,
// byte counts as uint64_t (narrower counts are taken as int64_t and checked by
// the library with its own message): an int parameter holding a Python int
// outside that range is refused with the range.
inline void check_integer_range(const std::string& op, const Param& p, const py::handle& v) {
  if (p.type != "int" || !PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) return;
  const bool unsigned_ = p.name == "bytes" || p.name.find("seed") != std::string::npos ||
                         p.name.find("_key") != std::string::npos;
  int overflow = 0;  // -1 below int64, +1 above
  const long long value = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  bool fits = overflow == 0 && !(unsigned_ && value < 0);
  if (unsigned_ && overflow > 0) {  // past int64: within uint64?
    PyLong_AsUnsignedLongLong(v.ptr());
    fits = PyErr_Occurred() == nullptr;
    PyErr_Clear();
  }
  if (fits) return;
  std::string text = py::str(v).cast<std::string>();
  if (text.size() > 40) text = text.substr(0, 20) + "...(" + std::to_string(text.size()) + " digits)";
  fail(op, p.name, ": ", text, " is out of range; wanted an integer in ",
       unsigned_ ? "[0, 18446744073709551615] (64 bits, unsigned)"
                 : "[-9223372036854775808, 9223372036854775807] (64 bits)");
}

// The last overload's body: the unknown keyword, the count of arguments, or
// the argument that is not of the kind wanted.
//
// pybind11 tries every overload without conversions first, this one
// included, then the others with conversions: this one lets a call whose
// arguments are all of the right kind go on to that second pass (an int
// where a float is wanted).
[[noreturn]] inline void argument_error(const std::string& op, const Signature& signature,
                                        const py::args& args, const py::kwargs& kwargs) {
  const std::vector<Param>& params = signature.params;
  std::vector<std::string> names;
  for (const Param& p : params) names.push_back(p.name);
  std::vector<Param> keywords = params;
  keywords.insert(keywords.end(), signature.other_keywords.begin(), signature.other_keywords.end());
  const py::list wanted_list = py::cast(names);
  const std::string wanted = py::str(", ").attr("join")(wanted_list).cast<std::string>();
  for (auto [k, v] : kwargs) {
    const std::string key = py::str(k);
    if (std::none_of(keywords.begin(), keywords.end(), [&](const Param& p) { return p.name == key; }))
      throw py::type_error(py::str("[{}] unexpected keyword argument '{}'; the arguments are {}")
                               .format(op, key, wanted).cast<std::string>());
  }
  if (args.size() > names.size())
    throw py::type_error(py::str("[{}] {} positional arguments given; it takes at most {} ({})")
                             .format(op, args.size(), names.size(), wanted).cast<std::string>());
  auto check = [&](const Param& p, const py::handle& v) {
    if (!fits(p.type, v))
      fail(kType, op, p.name, ": got ", type_name(v), ", wanted ", wanted_of(p.type));
  };
  for (size_t i = 0; i < args.size(); ++i) check(params[i], args[i]);
  for (auto [k, v] : kwargs)
    for (const Param& p : keywords)
      if (p.name == py::str(k).cast<std::string>()) {
        check(p, v);
        break;
      }
  // Every argument is of a kind the real overloads read. When none needs a
  // conversion either (pybind11's first pass would have taken it), an integer
  // that the parameter's type cannot hold is why: say which, with the range.
  bool exact = true;
  for (size_t i = 0; i < args.size(); ++i) exact = exact && !needs_conversion(params[i].type, args[i]);
  for (auto [k, v] : kwargs)
    for (const Param& p : keywords)
      if (p.name == py::str(k).cast<std::string>()) {
        exact = exact && !needs_conversion(p.type, v);
        break;
      }
  if (exact) {
    for (size_t i = 0; i < args.size(); ++i) check_integer_range(op, params[i], args[i]);
    for (auto [k, v] : kwargs)
      for (const Param& p : keywords)
        if (p.name == py::str(k).cast<std::string>()) check_integer_range(op, p, v);
  }
  // Every argument is of a kind the real overload reads: pybind11 tried it
  // without conversions only (its first pass); let it try again with them.
  // (If that fails too, pybind11's own message follows: e.g. an integer past
  // 64 bits.)
  throw py::reference_cast_error();
}

inline Signature params_of(const py::handle& f, bool method) {
  const py::object doc = py::getattr(f, "__doc__", py::str(""));
  std::vector<std::vector<Param>> overloads = signature_overloads(doc.is_none() ? std::string() : py::str(doc).cast<std::string>());
  Signature s;
  for (size_t i = 0; i < overloads.size(); ++i) {
    std::vector<Param>& p = overloads[i];
    if (method && !p.empty()) p.erase(p.begin());  // self
    if (i == 0) {
      s.params = p;
      continue;
    }
    for (const Param& q : p) {
      auto known = [&](const Param& r) { return r.name == q.name; };
      if (q.name != "*" && std::none_of(s.params.begin(), s.params.end(), known) &&
          std::none_of(s.other_keywords.begin(), s.other_keywords.end(), known))
        s.other_keywords.push_back(q);
    }
  }
  return s;
}

// Gives every function of `m` and every constructor, method, static method
// and property setter of its classes the last overload above; `prefix` goes
// before the names in messages ("mha.optim."). Call once, after every binding.
inline void add_type_help(py::module_ m, const std::string& prefix = "") {
  const py::list entries = m.attr("__dict__").attr("items")();  // a copy: the loop adds overloads
  for (const py::handle item : entries) {
    const py::object key = item[py::int_(0)], obj = item[py::int_(1)];
    const std::string name = py::str(key);
    if (name.rfind("__", 0) == 0) continue;
    if (PyCFunction_Check(obj.ptr())) {
      const std::string op = prefix + name;
      m.def(name.c_str(), [op, params = params_of(obj, false)](const py::args& args, const py::kwargs& kwargs) {
        argument_error(op, params, args, kwargs);
      });
    } else if (PyType_Check(obj.ptr()) && !py::hasattr(obj, "__members__") &&
               py::str(obj.attr("__module__")).cast<std::string>().rfind("mha", 0) == 0) {
      const py::object cls = py::reinterpret_borrow<py::object>(obj);
      const std::string cls_op = prefix + py::str(cls.attr("__name__")).cast<std::string>();
      const py::list members = cls.attr("__dict__").attr("items")();
      for (const py::handle mitem : members) {
        const py::object member = mitem[py::int_(1)];
        const std::string attr = py::str(mitem[py::int_(0)]);
        if (attr.rfind("__", 0) == 0 && attr != "__init__" && attr != "__call__") continue;
        if (PyInstanceMethod_Check(member.ptr())) {
          const std::string op = attr == "__init__" ? cls_op : cls_op + "." + (attr == "__call__" ? "forward" : attr);
          const py::handle f = PyInstanceMethod_GET_FUNCTION(member.ptr());
          if (py::str(f.attr("__doc__")).cast<std::string>().find("No constructor defined") != std::string::npos)
            continue;
          py::cpp_function cf(
              [op, params = params_of(f, true)](const py::handle&, const py::args& args, const py::kwargs& kwargs) {
                argument_error(op, params, args, kwargs);
              },
              py::name(attr.c_str()), py::is_method(cls), py::sibling(py::getattr(cls, attr.c_str(), py::none())));
          cls.attr(attr.c_str()) = cf;
        } else if (py::isinstance<py::staticmethod>(member)) {
          const std::string op = cls_op + "." + attr;
          const py::object f = cls.attr(attr.c_str());
          py::cpp_function cf(
              [op, params = params_of(f, false)](const py::args& args, const py::kwargs& kwargs) {
                argument_error(op, params, args, kwargs);
              },
              py::name(attr.c_str()), py::scope(cls), py::sibling(f));
          cls.attr(attr.c_str()) = py::staticmethod(cf);
        } else if (py::isinstance(member, py::module_::import("builtins").attr("property")) &&
                   !member.attr("fset").is_none() && PyCFunction_Check(member.attr("fset").ptr())) {
          const std::string op = cls_op + "." + attr;
          const py::object fset = member.attr("fset");
          Signature params = params_of(fset, true);
          if (!params.params.empty()) params.params[0].name = attr;
          py::cpp_function cf(
              [op, params](const py::handle&, const py::args& args, const py::kwargs& kwargs) {
                argument_error(op, params, args, kwargs);
              },
              py::is_method(cls), py::sibling(fset));
          cls.attr(attr.c_str()) = py::module_::import("builtins").attr("property")(
              member.attr("fget"), cf, py::none(), member.attr("__doc__"));
        }
      }
    } else if (py::isinstance<py::module_>(obj) &&
               py::str(obj.attr("__name__")).cast<std::string>().rfind("mha", 0) == 0) {
      add_type_help(py::reinterpret_borrow<py::module_>(obj), "mha." + name + ".");
    }
  }
}

}  // namespace mha::python
