// python/bindings/attention_glue.h: what the calls of mha.torch's two attention
// functions share (python/bindings/attention_calls.cpp for mha.torch.attention,
// python/bindings/sdpa_calls.cpp for mha.torch.scaled_dot_product_attention): arrays
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

// What a backward reads and writes besides the call's inputs: grad_output and
// the forward's output (float32 arrays of the output's shape, read in place),
// gradients shaped like q, k, v, and the sinks' gradient (as many as the call
// has sinks: none without).
struct BackwardBuffers {
  FloatArray grad_out, out;
  Tensor grad_q, grad_k, grad_v;
  std::vector<float> grad_sinks;

  BackwardBuffers(const char* op, const py::array& grad_output, const py::array& output, const Shape& out_shape,
                  const FloatArray (&in)[3], const FloatArray& sinks)
      : grad_out(grad_array(op, grad_output, out_shape)),
        out(float_input(output, 4, op, "out")),
        grad_q(shape_of(in[0])),
        grad_k(shape_of(in[1])),
        grad_v(shape_of(in[2])),
        grad_sinks(static_cast<size_t>(sinks.size())) {
    if (shape_of(out) != out_shape) fail(op, "out: shape ", shape_str(shape_of(out)), "; wanted ", shape_str(out_shape));
  }

  float* sinks_grad() { return grad_sinks.empty() ? nullptr : grad_sinks.data(); }

  // (grad_q, grad_k, grad_v, grad_sinks or None), the tensors handed to numpy.
  py::tuple result() {
    py::object gs = py::none();
    if (!grad_sinks.empty()) gs = py::array_t<float>(static_cast<py::ssize_t>(grad_sinks.size()), grad_sinks.data());
    return py::make_tuple(hand_to_numpy(std::move(grad_q)), hand_to_numpy(std::move(grad_k)),
                          hand_to_numpy(std::move(grad_v)), gs);
  }
};

}  // namespace mha::python::attention_glue
