// python/train_bindings.cpp: training in Python: MultiHeadAttention's
// backward and gradients, and the optimisers (mha.optim).
#include <pybind11/stl.h>

#include "convert.h"
#include "mha/mha.h"
#include "mha/optim.h"

namespace mha::python {

namespace {

// Anything with parameters(): the optimisers take the module itself and keep
// it alive, so the parameter pointers they hold stay valid.
ParamList params_of(py::object module) {
  if (py::isinstance<MultiHeadAttention>(module)) return module.cast<MultiHeadAttention&>().parameters();
  throw Error("[mha.optim] params: expected a module with parameters (e.g. mha.MultiHeadAttention), got " +
              std::string(py::str(py::type::of(module))));
}

// Adam and AdamW share their arguments; AdamW's weight_decay defaults to 1e-2.
template <typename Opt>
std::unique_ptr<Opt> make_adam(py::object module, double lr, std::pair<double, double> betas,
                               double eps, double weight_decay, bool amsgrad) {
  return std::make_unique<Opt>(params_of(module),
                               optim::AdamOptions{lr, betas.first, betas.second, eps, weight_decay, amsgrad});
}

}  // namespace

void bind_training(py::module_& m) {
  auto mha_class = py::reinterpret_borrow<py::class_<MultiHeadAttention>>(m.attr("MultiHeadAttention"));
  mha_class
      .def(
          "backward",
          [](MultiHeadAttention& self, const FloatArray& grad_output) {
            const Tensor g = to_tensor(grad_output);
            MultiHeadAttention::InputGrads grads;
            {
              py::gil_scoped_release release;
              grads = self.backward(g);
            }
            return py::make_tuple(
                py::make_tuple(to_numpy(grads.queries), to_numpy(grads.keys), to_numpy(grads.values)),
                to_dict(self.grads()));
          },
          py::arg("grad_output"),
          "backward(grad_output (B,Q,num_hiddens)) -> ((grad_queries, grad_keys, grad_values), param_grads)\n\n"
          "After a training-mode call: the gradients of that call's queries (B,Q,Dq), keys\n"
          "(B,K,Dk) and values (B,K,Dv). The parameters' gradients are added to the\n"
          "accumulated ones (until zero_grad()); param_grads is their dict by state-dict name.")
      .def("zero_grad", &MultiHeadAttention::zero_grad, "Set every accumulated gradient to zero.")
      .def("grads", [](MultiHeadAttention& s) { return to_dict(s.grads()); },
           "The accumulated parameter gradients by state-dict name.")
      .def("set_grads", [](MultiHeadAttention& s, const py::dict& d) { s.set_grads(to_tensors(d)); },
           py::arg("grads"), "Replace accumulated gradients by name (shapes as the parameters').")
      .def("initialize", &MultiHeadAttention::initialize, py::arg("dq"), py::arg("dk"), py::arg("dv"),
           "Fix the lazy input widths as a first call with these widths would.")
      .def_property_readonly(
          "last_dropout_mask", [](const MultiHeadAttention& s) { return to_numpy(s.last_dropout_mask()); },
          "(B, num_heads, Q, K) dropout multipliers of the last call: 0 or 1/(1-p), all 1 without dropout");

  py::module_ optim = m.def_submodule("optim", "Optimisers with PyTorch's update rules.");
  py::class_<optim::Optimizer>(optim, "Optimizer")
      .def("step", &optim::Optimizer::step, "One update of every parameter from its gradient.")
      .def("zero_grad", &optim::Optimizer::zero_grad, "Zero every parameter's gradient.")
      .def_property("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_property_readonly("steps", &optim::Optimizer::steps)
      .def("state", [](const optim::Optimizer& o) { return to_dict(o.state()); },
           "State buffers by '<parameter>.<buffer>' (e.g. 'W_q.weight.exp_avg').");
  py::class_<optim::SGD, optim::Optimizer>(optim, "SGD", "torch.optim.SGD's update rule.")
      .def(py::init([](py::object module, double lr, double momentum, double dampening,
                       double weight_decay, bool nesterov) {
             return std::make_unique<optim::SGD>(
                 params_of(module), optim::SGDOptions{lr, momentum, dampening, weight_decay, nesterov});
           }),
           py::arg("module"), py::arg("lr"), py::arg("momentum") = 0.0, py::arg("dampening") = 0.0,
           py::arg("weight_decay") = 0.0, py::arg("nesterov") = false, py::keep_alive<1, 2>());
  py::class_<optim::Adam, optim::Optimizer>(optim, "Adam", "torch.optim.Adam's update rule.")
      .def(py::init(&make_adam<optim::Adam>), py::arg("module"), py::arg("lr") = 1e-3,
           py::arg("betas") = std::pair<double, double>{0.9, 0.999}, py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 0.0, py::arg("amsgrad") = false, py::keep_alive<1, 2>());
  py::class_<optim::AdamW, optim::Adam>(optim, "AdamW", "torch.optim.AdamW's update rule.")
      .def(py::init(&make_adam<optim::AdamW>), py::arg("module"), py::arg("lr") = 1e-3,
           py::arg("betas") = std::pair<double, double>{0.9, 0.999}, py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 1e-2, py::arg("amsgrad") = false, py::keep_alive<1, 2>());
  optim.def(
      "clip_grad_norm",
      [](py::object module, double max_norm, double norm_type) {
        return optim::clip_grad_norm(params_of(module), max_norm, norm_type);
      },
      py::arg("module"), py::arg("max_norm"), py::arg("norm_type") = 2.0,
      "Scale the module's gradients so their global norm is at most max_norm (as\n"
      "torch.nn.utils.clip_grad_norm_); returns the norm before clipping.");
}

}  // namespace mha::python
