// python/convert.h: numpy <-> mha::Tensor conversions for the binding files.
// Arrays come in as any real dtype (converted to float32, C order) and go out
// as new float32 arrays.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <map>
#include <string>

#include "mha/tensor.h"

namespace mha::python {

namespace py = pybind11;
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

inline Tensor to_tensor(const FloatArray& a) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  return Tensor(std::move(shape), std::vector<float>(a.data(), a.data() + a.size()));
}

inline py::array_t<float> to_numpy(const Tensor& t) {
  py::array_t<float> out(std::vector<py::ssize_t>(t.shape().begin(), t.shape().end()));
  if (t.numel()) std::memcpy(out.mutable_data(), t.data(), static_cast<size_t>(t.numel()) * 4);
  return out;
}

inline std::map<std::string, Tensor> to_tensors(const py::dict& d) {
  std::map<std::string, Tensor> s;
  for (auto [k, v] : d) s[py::cast<std::string>(k)] = to_tensor(FloatArray::ensure(v));
  return s;
}

inline py::dict to_dict(const std::map<std::string, Tensor>& s) {
  py::dict d;
  for (const auto& [k, v] : s) d[py::str(k)] = to_numpy(v);
  return d;
}

}  // namespace mha::python
