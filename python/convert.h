// python/convert.h: Python -> mha conversions for every binding file, and
// mha::Tensor -> numpy.
//
// Every value a binding reads as numbers goes through real_array(): numpy
// arrays, nested lists and CPU torch tensors (detached, without a copy, so a
// tensor that requires grad is read as its data) of bool, integer or floating
// dtype. Anything else is a ValueError naming the operation and the argument,
// never a crash and never a silent conversion: strings, bytes, objects,
// ragged lists (nothing to read), complex numbers (the imaginary part would be
// dropped), dates and durations, structured records.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
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

namespace mha::python {

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
  if (py::hasattr(obj, "detach") && py::hasattr(obj, "numpy") && py::hasattr(obj, "requires_grad"))
    return obj.attr("detach")().attr("cpu")().attr("numpy")();
  return py::reinterpret_borrow<py::object>(obj);
}

inline Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

// `obj` as a numpy array of bool, integer or floating dtype (not converted
// yet). `what` names the argument in messages ("queries", "'W_q.weight'").
inline py::array real_array(const py::handle& obj, const std::string& op, const std::string& what) {
  py::array a;
  try {
    a = py::array::ensure(as_numpy(obj));
  } catch (const py::error_already_set&) {
  }
  if (!a) {
    PyErr_Clear();
    fail(op, what, ": cannot be read as a numeric array");
  }
  const char kind = a.dtype().kind();
  if (kind == 'O') fail(op, what, ": cannot be read as a numeric array");
  if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f')
    fail(op, what, ": dtype ", std::string(py::str(a.dtype())),
         " is not a real number type; wanted bool, integer or floating");
  return a;
}

inline FloatArray float_array(const py::handle& obj, const std::string& op, const std::string& what) {
  FloatArray f = FloatArray::ensure(real_array(obj, op, what));
  if (!f) {
    PyErr_Clear();
    fail(op, what, ": cannot be read as a numeric array");
  }
  return f;
}

inline Tensor to_tensor(const FloatArray& a) {
  return Tensor(shape_of(a), std::vector<float>(a.data(), a.data() + a.size()));
}

inline Tensor to_tensor(const py::handle& obj, const std::string& op, const std::string& what) {
  return to_tensor(float_array(obj, op, what));
}

// A real number (int or float, numpy scalars included), refusing strings,
// None and the like.
inline double real_number(const py::handle& obj, const std::string& op, const std::string& what) {
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) || obj.is_none() ||
      !PyNumber_Check(obj.ptr()) || PyComplex_Check(obj.ptr()))
    fail(op, what, ": ", std::string(py::repr(obj)), " is not a real number");
  const double v = PyFloat_AsDouble(obj.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    fail(op, what, ": ", std::string(py::repr(obj)), " is not a real number");
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
    fail(op, what, ": a string is not a list of integers");
  const IntValues v = int_values(obj, op, what);
  if (v.shape.size() != 1) fail(op, what, ": shape ", shape_str(v.shape), " is not a flat list of integers");
  return std::vector<int64_t>(v.values.begin(), v.values.end());
}

inline py::array_t<float> to_numpy(const Tensor& t) {
  py::array_t<float> out(std::vector<py::ssize_t>(t.shape().begin(), t.shape().end()));
  if (t.numel()) std::memcpy(out.mutable_data(), t.data(), static_cast<size_t>(t.numel()) * 4);
  return out;
}

// A dict of arrays by name; the values are named "'<name>'" in messages.
inline std::map<std::string, Tensor> to_tensors(const py::handle& obj, const std::string& op) {
  if (!py::isinstance<py::dict>(obj)) fail(op, "state_dict: ", std::string(py::str(py::type::of(obj))), " is not a dict");
  std::map<std::string, Tensor> s;
  for (auto [k, v] : py::reinterpret_borrow<py::dict>(obj)) {
    if (!py::isinstance<py::str>(k)) fail(op, "state_dict: key ", std::string(py::repr(k)), " is not a string");
    const std::string name = py::cast<std::string>(k);
    s[name] = to_tensor(v, op, "'" + name + "'");
  }
  return s;
}

inline py::dict to_dict(const std::map<std::string, Tensor>& s) {
  py::dict d;
  for (const auto& [k, v] : s) d[py::str(k)] = to_numpy(v);
  return d;
}

// The overload pybind11 tries when a call's arguments do not match the
// real one: a short TypeError naming the unknown keyword (or the count or
// types given) instead of pybind11's, which prints every argument's repr,
// whole tensors included. Register it after the real overload:
//   cls.def("__call__", real, ...);  add_argument_help(cls, "__call__", op, {"queries", ...});
[[noreturn]] inline void argument_error(const std::string& op, const std::vector<std::string>& names,
                                        const py::args& args, const py::kwargs& kwargs) {
  const py::list wanted_list = py::cast(names);
  const std::string wanted = py::str(", ").attr("join")(wanted_list).cast<std::string>();
  for (auto [k, v] : kwargs) {
    const std::string key = py::str(k);
    if (std::find(names.begin(), names.end(), key) == names.end())
      throw py::type_error(py::str("[{}] unexpected keyword argument '{}'; the arguments are {}")
                               .format(op, key, wanted).cast<std::string>());
  }
  if (args.size() > names.size())
    throw py::type_error(py::str("[{}] {} positional arguments given; it takes at most {} ({})")
                             .format(op, args.size(), names.size(), wanted).cast<std::string>());
  py::list given;
  for (size_t i = 0; i < args.size(); ++i)
    given.append(py::str("{}: {}").format(names[i], py::type::of(args[i]).attr("__name__")));
  for (auto [k, v] : kwargs) given.append(py::str("{}: {}").format(k, py::type::of(v).attr("__name__")));
  throw py::type_error(py::str("[{}] arguments ({}) do not match ({}); see help() for their types")
                           .format(op, py::str(", ").attr("join")(given), wanted).cast<std::string>());
}

template <typename Class>
void add_static_argument_help(Class& cls, const char* name, std::string op, std::vector<std::string> names) {
  cls.def_static(name, [op, names](const py::args& args, const py::kwargs& kwargs) { argument_error(op, names, args, kwargs); });
}

template <typename Target>
void add_argument_help(Target& target, const char* name, std::string op, std::vector<std::string> names) {
  if constexpr (std::is_same_v<Target, py::module_>)
    target.def(name, [op, names](const py::args& args, const py::kwargs& kwargs) { argument_error(op, names, args, kwargs); });
  else
    target.def(name, [op, names](const py::object&, const py::args& args, const py::kwargs& kwargs) {
      argument_error(op, names, args, kwargs);
    });
}

}  // namespace mha::python
