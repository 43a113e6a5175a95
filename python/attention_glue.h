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

// The caller's q, k, v (float32 4-D C-contiguous arrays, as mha.torch
// passes them) read in place: held in c.in, the kernels' views of them
// (view(array)) in c.qv, c.kv, c.vv; any other array fails naming op and
// names[i].
template <class Context, class View>
void hold_qkv(Context& c, const py::array& q, const py::array& k, const py::array& v, const char* const (&names)[3],
              const char* op, View view) {
  const py::array* arrays[] = {&q, &k, &v};
  for (int x = 0; x < 3; ++x) {
    c.in[x] = FloatArray::ensure(*arrays[x]);
    if (!c.in[x] || c.in[x].ndim() != 4) {
      PyErr_Clear();
      fail(op, names[x], ": not a 4-D float32 array");
    }
  }
  c.qv = view(c.in[0]);
  c.kv = view(c.in[1]);
  c.vv = view(c.in[2]);
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

// grad_output as a float32 C-contiguous array of the output's shape (read
// in place), else a failure naming op.
inline FloatArray grad_array(const char* op, const py::array& grad_out, const py::array& out) {
  FloatArray g = FloatArray::ensure(grad_out);
  if (!g) {
    PyErr_Clear();
    fail(op, "grad_output: not a float32 array");
  }
  if (shape_of(g) != shape_of(out))
    fail(op, "grad_output: shape ", shape_str(shape_of(g)), " is not the output's ", shape_str(shape_of(out)));
  return g;
}

// What a forward returns: (out, the context) when kept for a backward, else
// (out, None). The output is handed to numpy (no copy); a context keeps that
// array and a view of it (c->out_array, c->outv) for its backward.
//
// A context reads its inputs and output where the caller's arrays hold them,
// never copies (each copy a fresh allocation, faulted in on every call on a
// VM): mha.torch saves the tensors for the backward, so that one changed in
// place in between fails there as PyTorch's own functions do.
template <class Context>
py::tuple forward_result(Tensor& out, const std::shared_ptr<Context>& c, bool keep) {
  py::array_t<float> a = hand_to_numpy(std::move(out));
  if (!keep) return py::make_tuple(a, py::none());
  c->out_array = a;
  c->outv = array_view_any(c->out_array);
  return py::make_tuple(a, py::cast(c));
}

}  // namespace mha::python::attention_glue
