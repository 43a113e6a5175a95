// python/bindings/context_bindings.cpp: mha.ForwardContext (mha/context.h) and the
// modules' backward(context, grad_output).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "object_lock.h"
#include "mha/context.h"
#include "mha/multihead.h"
#include "mha/torch_mha.h"

namespace py = pybind11;

namespace mha::python {

namespace {

py::tuple inputs_of(const MultiHeadAttention::InputGrads& g) {
  return input_grads(g.queries, g.keys, g.values, g.sinks);
}
py::tuple inputs_of(const TorchMultiheadAttention::InputGrads& g) {
  return input_grads(g.query, g.key, g.value, g.sinks);
}

// The gradients of a call's inputs and the module's accumulated parameter
// gradients, as backward(grad_output) returns them.
template <typename Module>
py::tuple backward_of(Module& self, const ForwardContext& ctx, const py::object& grad_output, const char* op) {
  const Tensor g = to_tensor(grad_output, op, "grad_output");
  typename Module::InputGrads grads;
  auto accumulated = locked(&self, [&] {
    grads = self.backward(ctx, g);
    return self.grads();
  });
  py::dict params;
  for (auto& [k, v] : accumulated) params[py::str(k)] = hand_to_numpy(std::move(v));
  return py::make_tuple(inputs_of(grads), params);
}

}  // namespace

void bind_contexts(py::module_& m) {
  py::class_<ForwardContext>(m, "ForwardContext", R"doc(
What one forward call kept: its attention weights and, when it ran in
training mode, its backward come from it alone (module.forward_with_context
returns one). Immutable; the module keeps nothing of the call.

  out, ctx = m.forward_with_context(X, X, X, valid_lens)
  w = ctx.attention_weights([0], [1, 3])   # batch row 0, heads 1 and 3
  (gq, gk, gv), grads = m.backward(ctx, grad_output)
)doc")
      .def_property_readonly("batch_size", &ForwardContext::batch_size)
      .def_property_readonly("num_heads", &ForwardContext::num_heads)
      .def_property_readonly("num_queries", &ForwardContext::num_queries)
      .def_property_readonly("num_keys", &ForwardContext::num_keys, "K, with any appended keys")
      .def_property_readonly("differentiable", &ForwardContext::differentiable,
                             "True when the call ran in training mode (its backward can run)")
      .def(
          "attention_weights",
          [](const ForwardContext& c, const py::object& rows, const py::object& heads) {
            static const char* op = "ForwardContext.attention_weights";
            Tensor w;
            if (rows.is_none() && heads.is_none()) {
              w = c.attention_weights();
            } else {
              auto indices = [&](const py::object& o, int64_t n, const char* what) {
                std::vector<int64_t> v;
                if (o.is_none())
                  for (int64_t i = 0; i < n; ++i) v.push_back(i);
                else
                  v = int_list(o, op, what);
                return v;
              };
              w = c.attention_weights(indices(rows, c.batch_size(), "batch_rows"),
                                      indices(heads, c.num_heads(), "heads"));
            }
            return to_numpy(w);
          },
          py::arg("batch_rows") = py::none(), py::arg("heads") = py::none(),
          "(rows, heads, Q, K) softmax weights (before dropout) of those batch rows and heads\n"
          "(None: all), computed from the call's statistics with the fused kernel")
      .def_property_readonly(
          "dropout_mask", [](const ForwardContext& c) { return to_numpy(c.dropout_mask()); },
          "(B, num_heads, Q, K) the call's dropout multipliers, 0 or 1/(1-p)");

  // Before the modules' other backward overloads (prepended): a context first.
  py::reinterpret_borrow<py::class_<MultiHeadAttention>>(m.attr("MultiHeadAttention"))
      .def(
          "backward",
          [](MultiHeadAttention& self, const ForwardContext& ctx, const py::object& grad_output) {
            return backward_of(self, ctx, grad_output, "MultiHeadAttention.backward");
          },
          py::arg("context"), py::arg("grad_output"), py::prepend(),
          "backward(context, grad_output) -> ((grad_queries, grad_keys, grad_values), param_grads):\n"
          "the backward of the call whose context forward_with_context returned (training mode);\n"
          "grad_sinks (num_heads,) is a fourth input gradient when that call took sinks=");
  py::reinterpret_borrow<py::class_<TorchMultiheadAttention>>(m.attr("TorchMultiheadAttention"))
      .def(
          "backward",
          [](TorchMultiheadAttention& self, const ForwardContext& ctx, const py::object& grad_output) {
            return backward_of(self, ctx, grad_output,
                                                                    "TorchMultiheadAttention.backward");
          },
          py::arg("context"), py::arg("grad_output"), py::prepend(),
          "backward(context, grad_output) -> ((grad_query, grad_key, grad_value), param_grads):\n"
          "the backward of the call whose context forward_with_context returned (training mode);\n"
          "grad_sinks (num_heads,) is a fourth input gradient when that call took sinks=");
}

}  // namespace mha::python
