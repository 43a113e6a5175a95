// python/attention_glue.h: what the calls of mha.torch's two attention
// functions share (python/attention_calls.cpp for mha.torch.attention,
// python/sdpa_calls.cpp for mha.torch.scaled_dot_product_attention): arrays
// read in place, the fused forward that writes its row statistics into an
// array for the backward, and the backward from them.
//
// The calls are stateless: a forward returns (out, stats), and the backward
// takes the inputs, the output and the statistics back. So the same calls
// serve torch.library operators (whose autograd saves tensors, never an
// opaque context) and the autograd Function of torch without torch.library
// (python/mha/_torch_ops.py).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "convert.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "mha/tensor.h"

namespace mha::python::attention_glue {

namespace py = pybind11;

// f: a 4-D float32 C-contiguous array (B, L, heads, width) -> a
// (B, L, heads*width) view of its memory, no copy (f must outlive the view).
// Inputs are read in place: a packed batch's copies cost more than its
// attention (measured: bench/attention_variants.py's packed forward 6.0x its
// sequences one by one with q, k, v and out copied, each copy a fresh
// allocation that glibc returns to the system after the call and the next
// call faults in again).
inline TensorView rows_view(float* data, int64_t B, int64_t L, int64_t width) {
  TensorView v;
  v.data = data;
  v.rank = 3;
  v.shape[0] = B, v.shape[1] = L, v.shape[2] = width;
  v.stride[2] = 1, v.stride[1] = width, v.stride[0] = L * width;
  return v;
}
inline TensorView rows_view(const FloatArray& f) {
  return rows_view(const_cast<float*>(f.data()), f.shape(0), f.shape(1), f.shape(2) * f.shape(3));
}
inline TensorView rows_view(Tensor& t) {
  return rows_view(t.data(), t.shape()[0], t.shape()[1], t.shape()[2] * t.shape()[3]);
}

// f: a float32 C-contiguous array of rank <= 4 -> a view of its memory of
// the same shape, no copy (f must outlive the view; rows_view: why).
inline TensorView array_view_any(const py::array& f) {
  TensorView v;
  v.data = static_cast<float*>(const_cast<void*>(f.data()));
  v.rank = static_cast<int>(f.ndim());
  int64_t step = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[i] = f.shape(i);
    v.stride[i] = step;
    step *= v.shape[i];
  }
  return v;
}

// a as a float32 C-contiguous array of rank `rank` (read in place when it
// is one), else a failure naming op and name.
inline FloatArray float_input(const py::handle& a, int rank, const char* op, const char* name) {
  FloatArray f = FloatArray::ensure(a);
  if (!f || f.ndim() != rank) {
    PyErr_Clear();
    fail(op, name, ": not a ", rank, "-D float32 array");
  }
  return f;
}

// None -> an empty array (size 0); else a 1-D float32 array of n values (held, read
// in place), or a failure naming op and name.
inline FloatArray optional_floats(const py::object& a, int64_t n, const char* op, const char* name) {
  if (a.is_none()) return FloatArray();
  FloatArray f = float_input(a, 1, op, name);
  if (f.shape(0) != n) fail(op, name, ": ", f.shape(0), " values; wanted ", n);
  return f;
}

// (A default FloatArray is an empty array, not a null handle.)
inline const float* data_or_null(const FloatArray& f) { return f.size() > 0 ? f.data() : nullptr; }

// The fused forward of p (p.out set) over `rows` = B*H query rows and
// `keys` keys, the GIL released. Where the fused kernel runs, its row
// statistics go to a fresh [2, rows] array, returned; else None (the
// backward then recomputes the weights).
inline py::object forward_with_stats(kernels::AttentionForward p, int64_t rows, int64_t keys) {
  py::object stats = py::none();
  if (kernels::runs_fused(AttentionKernel::Fused, keys)) {
    py::array_t<float> s(std::vector<py::ssize_t>{2, static_cast<py::ssize_t>(rows)});
    p.stats = {s.mutable_data(), s.mutable_data() + rows};
    stats = s;
  }
  py::gil_scoped_release release;
  if (kernels::attention_forward(AttentionKernel::Fused, p).empty()) {
    py::gil_scoped_acquire acquire;
    stats = py::none();
  }
  return stats;
}

// The backward of p (every view set), the GIL released, from the statistics
// forward_with_stats returned (an array [2, rows], or None: recomputed).
inline void backward_with_stats(kernels::AttentionBackward p, const py::object& stats, int64_t rows,
                                const char* op) {
  FloatArray s;
  if (!stats.is_none()) {
    s = float_input(stats, 2, op, "stats");
    if (s.shape(0) != 2 || s.shape(1) != rows) fail(op, "stats: shape ", shape_str(shape_of(s)), "; wanted (2, ", rows, ")");
    float* d = const_cast<float*>(s.data());
    p.fwd.stats = {d, d + rows};
  }
  py::gil_scoped_release release;
  kernels::attention_backward(AttentionKernel::Fused, p);
}

// grad_output as a float32 C-contiguous array of shape `want` (read in
// place), else a failure naming op.
inline FloatArray grad_array(const char* op, const py::array& grad_out, const Shape& want) {
  FloatArray g = FloatArray::ensure(grad_out);
  if (!g) {
    PyErr_Clear();
    fail(op, "grad_output: not a float32 array");
  }
  if (shape_of(g) != want) fail(op, "grad_output: shape ", shape_str(shape_of(g)), " is not the output's ", shape_str(want));
  return g;
}

// A (heads,) gradient as a numpy array, or None when the call had no such
// input (g empty).
inline py::object optional_grad(const std::vector<float>& g) {
  if (g.empty()) return py::none();
  return py::array_t<float>(static_cast<py::ssize_t>(g.size()), g.data());
}

}  // namespace mha::python::attention_glue
