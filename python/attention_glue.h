// python/attention_glue.h: what the calls of mha.torch's two attention
// functions share (python/attention_calls.cpp for mha.torch.attention,
// python/sdpa_calls.cpp for mha.torch.scaled_dot_product_attention): the
// fused forward that keeps its row statistics for the backward, the backward
// from them, a float32 array copied into a Tensor, and the (out, context)
// pair a forward returns. Each call's context is its own (one per autograd
// node), so calls share nothing.
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

// a: a float32 array -> a copy of its values: of its own shape, or with
// rows, a 4-D (B, L, heads, width) array as (B, L, heads*width); anything
// else fails naming op and what. The Python functions shape every array
// first, so a failure here is an internal self-check.
inline Tensor copy_floats(const py::array& a, const char* op, const char* what, bool rows = false) {
  FloatArray f = FloatArray::ensure(a);
  if (!f || (rows && f.ndim() != 4)) {
    PyErr_Clear();
    fail(op, what, rows ? ": not a 4-D float32 array" : ": not a float32 array");
  }
  Tensor t(rows ? Shape{f.shape(0), f.shape(1), f.shape(2) * f.shape(3)} : shape_of(f));
  if (f.size() > 0) std::memcpy(t.data(), f.data(), sizeof(float) * static_cast<size_t>(f.size()));
  return t;
}

// f: a 4-D float32 C-contiguous array (B, L, heads, width) -> a
// (B, L, heads*width) view of its memory, no copy (f must outlive the view).
// A forward that keeps nothing for a backward reads its inputs in place: a
// packed batch's copies cost more than its attention (measured: bench/
// attention_variants.py's packed forward 6.0x its sequences one by one with
// q, k, v and out copied, each copy a fresh allocation that glibc returns to
// the system after the call and the next call faults in again).
inline TensorView rows_view(const FloatArray& f) {
  TensorView v;
  v.data = const_cast<float*>(f.data());
  v.rank = 3;
  v.shape[0] = f.shape(0), v.shape[1] = f.shape(1), v.shape[2] = f.shape(2) * f.shape(3);
  v.stride[2] = 1, v.stride[1] = v.shape[2], v.stride[0] = v.shape[1] * v.shape[2];
  return v;
}

// f: a 4-D float32 C-contiguous array -> a view of its memory of the same
// shape, no copy (f must outlive the view; rows_view: why).
inline TensorView array_view(const FloatArray& f) {
  TensorView v;
  v.data = const_cast<float*>(f.data());
  v.rank = 4;
  int64_t step = 1;
  for (int i = 3; i >= 0; --i) {
    v.shape[i] = f.shape(i);
    v.stride[i] = step;
    step *= v.shape[i];
  }
  return v;
}

// The fused forward of p (p.out set; GIL released by the caller) over
// `rows` = B*H query rows and `keys` keys; with keep, where the fused kernel
// runs, its statistics ([2, rows]) are kept in stats for the backward, else
// stats is left empty (the backward then recomputes the weights).
inline void forward_keeping_stats(kernels::AttentionForward p, int64_t rows, int64_t keys, bool keep,
                                  std::vector<float>& stats) {
  if (keep && kernels::runs_fused(AttentionKernel::Fused, keys)) {
    stats.resize(static_cast<size_t>(2 * rows));
    p.stats = {stats.data(), stats.data() + rows};
  }
  if (kernels::attention_forward(AttentionKernel::Fused, p).empty()) stats.clear();
}

// The backward of p (every view set; GIL released by the caller) from the
// statistics forward_keeping_stats kept, if any.
inline void backward_from_stats(kernels::AttentionBackward p, std::vector<float>& stats) {
  if (!stats.empty()) {
    const size_t n = stats.size() / 2;
    p.fwd.stats = {stats.data(), stats.data() + n};
  }
  kernels::attention_backward(AttentionKernel::Fused, p);
}

// grad_output's shape is the output's, else a failure naming op.
inline void check_grad_shape(const char* op, const Tensor& g, const Tensor& out) {
  if (g.shape() != out.shape())
    fail(op, "grad_output: shape ", shape_str(g.shape()), " is not the output's ", shape_str(out.shape()));
}

// What a forward returns: (out, the context) when kept for a backward, else (out, None).
// Without a backward the output is handed to numpy (no copy); with one the
// context keeps its own.
template <class Context>
py::tuple forward_result(Tensor& out, const std::shared_ptr<Context>& c, bool keep) {
  if (!keep) return py::make_tuple(hand_to_numpy(std::move(out)), py::none());
  return py::make_tuple(to_numpy(static_cast<const Tensor&>(out)), py::cast(c));
}

}  // namespace mha::python::attention_glue
