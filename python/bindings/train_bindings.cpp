// python/bindings/train_bindings.cpp: training in Python: MultiHeadAttention's
// backward and gradients, and the optimisers (mha.optim).
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "object_lock.h"
#include "mha/mha.h"
#include "mha/plot.h"

namespace mha::python {

namespace {

// Anything with parameters(): the optimisers take the module itself and keep
// it alive, so the parameter pointers they hold stay valid.
ParamList params_of(py::object module) {
  if (py::isinstance<MultiHeadAttention>(module)) return module.cast<MultiHeadAttention&>().parameters();
  if (py::isinstance<AttentionModel>(module)) return module.cast<AttentionModel&>().parameters();
  if (py::isinstance<TorchMultiheadAttention>(module))
    return module.cast<TorchMultiheadAttention&>().parameters();
  fail(kType, "mha.optim", "module: expected mha.MultiHeadAttention, mha.AttentionModel or ",
       "mha.TorchMultiheadAttention, got ", std::string(py::str(py::type::of(module))));
}

// tokens (B, T) of integers (any dtype; floats only with integral values) -> ids, B, T.
std::vector<int32_t> to_ids(const py::object& obj, const char* op, const char* what, int64_t& B, int64_t& T) {
  IntValues v = int_values(obj, op, what);
  if (v.shape.size() != 2) fail(op, what, ": shape ", shape_str(v.shape), " is not (B, T)");
  B = v.shape[0];
  T = v.shape[1];
  return std::move(v.values);
}

py::array_t<int32_t> ids_to_numpy(const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  py::array_t<int32_t> out({B, T});
  std::copy(ids.begin(), ids.end(), out.mutable_data());
  return out;
}

ValidLens lens_of(const py::object& obj, const char* op) { return to_valid_lens(obj, op); }

py::dict task_config_dict(const OffsetPairTaskConfig& c) {
  py::dict d;
  d["vocab"] = c.vocab;
  d["near"] = c.near;
  d["far"] = c.far;
  d["min_len"] = c.min_len;
  d["max_len"] = c.max_len;
  return d;
}

// Adam and AdamW share their arguments; AdamW's weight_decay defaults to 1e-2.
// betas: a tuple or list of two real numbers (pybind11's pair caster would
// read bytes b"12" as (49, 50)).
std::pair<double, double> real_pair(const py::object& obj, const std::string& op, const char* what) {
  if (is_string(obj) || !(py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) || py::len(obj) != 2)
    fail(kType, op, what, ": got ", type_name(obj), ", wanted a pair of real numbers");
  return {real_number(obj[py::int_(0)], op, std::string(what) + "[0]"),
          real_number(obj[py::int_(1)], op, std::string(what) + "[1]")};
}

template <typename Opt>
std::unique_ptr<Opt> make_adam(py::object module, Real lr, const py::object& betas_obj, Real eps,
                               Real weight_decay, bool amsgrad) {
  const std::string op = std::is_same_v<Opt, optim::AdamW> ? "mha.optim.AdamW" : "mha.optim.Adam";
  const std::pair<double, double> betas = real_pair(betas_obj, op, "betas");
  return std::make_unique<Opt>(params_of(module),
                               optim::AdamOptions{lr, betas.first, betas.second, eps, weight_decay, amsgrad});
}

// For mha.torch (python/mha/torch.py): writable numpy views of a module's
// parameter buffers, so that torch.nn.Parameters can share their memory
// (no copy of the weights per call), the dropout stream's seed (to redraw a
// call's dropout mask), and the dropout probability (off while an eval-mode
// call is kept for backward). The views keep the module alive; they stay
// valid while nothing replaces the module's parameters (load_state_dict,
// prune_heads), which mha.torch never calls after taking them.
template <typename Module>
py::dict parameter_views(py::object self) {
  py::dict d;
  for (const ParamRef& p : self.cast<Module&>().parameters()) {
    const Shape& s = p.value->shape();
    d[py::str(p.name)] = py::array_t<float>(std::vector<py::ssize_t>(s.begin(), s.end()),
                                            p.value->data(), self);
  }
  return d;
}

void bind_torch_module_support(py::module_& m) {
  auto mha_class = py::reinterpret_borrow<py::class_<MultiHeadAttention>>(m.attr("MultiHeadAttention"));
  mha_class
      .def("_parameter_views", &parameter_views<MultiHeadAttention>,
           "Writable float32 views of the parameters' buffers by state-dict name (no copy).")
      .def("_reseed", [](MultiHeadAttention& s, uint64_t seed) { s.seed(seed); }, py::arg("seed"),
           "Restart the generator of dropout masks (one draw per training-mode call).")
      .def("_set_dropout", &MultiHeadAttention::set_dropout, py::arg("p"))
      .def("_parameters_written", &MultiHeadAttention::parameters_written,
           "The parameters were written through the views: repack the weights before the next call.");
  auto tmha = py::reinterpret_borrow<py::class_<TorchMultiheadAttention>>(m.attr("TorchMultiheadAttention"));
  tmha.def("_parameter_views", &parameter_views<TorchMultiheadAttention>,
           "Writable float32 views of the parameters' buffers by parameters() name (no copy).")
      .def("_reseed", [](TorchMultiheadAttention& s, uint64_t seed) { s.seed(seed); }, py::arg("seed"),
           "Restart the generator of dropout masks (one draw per training-mode call).")
      .def("_set_dropout", &TorchMultiheadAttention::set_dropout, py::arg("p"))
      .def("_parameters_written", &TorchMultiheadAttention::parameters_written,
           "The parameters were written through the views: repack the weights before the next call.");

  // Line charts for Python scripts (examples/torch_encoder): panels as dicts
  // {"title", "xlabel", "ylabel", "log_y", "series": [(name, x, y), ...]}.
  m.def(
      "_render_line_chart",
      [](const py::list& panels, const std::string& title, int64_t plot_width, int64_t plot_height) {
        const char* op = "plot.render_line_chart";
        std::vector<plot::LinePanel> ps;
        // Each value checked before it is read: a panel that is not a dict, a
        // series that is not (name, x, y), x and y that are not numbers.
        auto text = [&](const py::dict& d, const char* key, const std::string& where) {
          if (!d.contains(key)) return std::string();
          const py::object v = d[key];
          if (!py::isinstance<py::str>(v)) fail(kType, op, where, "['", key, "']: got ", type_name(v), ", wanted a string");
          return v.cast<std::string>();
        };
        auto numbers = [&](const py::handle& v, const std::string& where) {
          const DoubleArray a = DoubleArray::ensure(real_array(v, op, where));
          if (a.ndim() != 1) fail(op, where, ": shape ", shape_str(shape_of(a)), " is not a flat list of numbers");
          return std::vector<double>(a.data(), a.data() + a.size());
        };
        for (size_t i = 0; i < panels.size(); ++i) {
          const std::string where = "panels[" + std::to_string(i) + "]";
          if (!py::isinstance<py::dict>(panels[i]))
            fail(kType, op, where, ": got ", type_name(panels[i]), ", wanted a dict");
          const py::dict d = py::reinterpret_borrow<py::dict>(panels[i]);
          plot::LinePanel p;
          p.title = text(d, "title", where);
          p.xlabel = text(d, "xlabel", where);
          p.ylabel = text(d, "ylabel", where);
          if (d.contains("log_y")) {
            if (!PyBool_Check(py::object(d["log_y"]).ptr()))
              fail(kType, op, where, "['log_y']: got ", type_name(d["log_y"]), ", wanted True or False");
            p.log_y = py::cast<bool>(d["log_y"]);
          }
          const py::object series = d.contains("series") ? py::object(d["series"]) : py::object(py::list());
          if (!py::isinstance<py::list>(series) && !py::isinstance<py::tuple>(series))
            fail(kType, op, where, "['series']: got ", type_name(series), ", wanted a list of (name, x, y)");
          const py::sequence seq = py::reinterpret_borrow<py::sequence>(series);
          for (size_t j = 0; j < seq.size(); ++j) {
            const std::string sw = where + "['series'][" + std::to_string(j) + "]";
            const py::object item = seq[j];
            if (!(py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) || py::len(item) != 3 ||
                !py::isinstance<py::str>(item[py::int_(0)]))
              fail(kType, op, sw, ": got ", type_name(item), ", wanted (name, x, y)");
            plot::Series s;
            s.name = item[py::int_(0)].cast<std::string>();
            s.x = numbers(item[py::int_(1)], sw + " x");
            s.y = numbers(item[py::int_(2)], sw + " y");
            p.series.push_back(std::move(s));
          }
          ps.push_back(std::move(p));
        }
        plot::LineChartOptions o;
        o.title = title;
        o.plot_width = int_sized(plot_width, op, "plot_width");
        o.plot_height = int_sized(plot_height, op, "plot_height");
        const plot::Image im = plot::render_line_chart(ps, o).image;
        py::array_t<uint8_t> out({py::ssize_t{im.height}, py::ssize_t{im.width}, py::ssize_t{4}});
        std::copy(im.rgba.begin(), im.rgba.end(), out.mutable_data());
        return out;
      },
      py::arg("panels"), py::arg("title") = "", py::arg("plot_width") = 460, py::arg("plot_height") = 300,
      "Low-level: line chart panels -> (H, W, 4) uint8 RGBA (mha::plot::render_line_chart).");
}

}  // namespace

void bind_training(py::module_& m) {
  auto mha_class = py::reinterpret_borrow<py::class_<MultiHeadAttention>>(m.attr("MultiHeadAttention"));
  mha_class
      .def(
          "backward",
          [](MultiHeadAttention& self, const py::object& grad_output) {
            const Tensor g = to_tensor(grad_output, "MultiHeadAttention.backward", "grad_output");
            MultiHeadAttention::InputGrads grads;
            StateDict params = locked(&self, [&] {
              grads = self.backward(g);
              return self.grads();
            });
            return py::make_tuple(input_grads(grads.queries, grads.keys, grads.values, grads.sinks), to_dict(params));
          },
          py::arg("grad_output"),
          "backward(grad_output (B,Q,num_hiddens)) -> ((grad_queries, grad_keys, grad_values), param_grads)\n\n"
          "After a training-mode call: the gradients of that call's queries (B,Q,Dq), keys\n"
          "(B,K,Dk) and values (B,K,Dv), and of its sinks (num_heads,) as a fourth entry when the\n"
          "call took sinks=. The parameters' gradients are added to the\n"
          "accumulated ones (until zero_grad()); param_grads is their dict by state-dict name.")
      .def("zero_grad", [](MultiHeadAttention& s) { locked(&s, [&] { s.zero_grad(); }); },
           "Set every accumulated gradient to zero.")
      .def("grads", [](MultiHeadAttention& s) { return to_dict(locked(&s, [&] { return s.grads(); })); },
           "The accumulated parameter gradients by state-dict name.")
      .def("set_grads",
           [](MultiHeadAttention& s, const py::object& d) {
             const StateDict grads = to_tensors(d, "MultiHeadAttention.set_grads", "grads");
             locked(&s, [&] { s.set_grads(grads); });
           },
           py::arg("grads"), "Replace accumulated gradients by name (shapes as the parameters').")
      .def("initialize", &MultiHeadAttention::initialize, py::arg("dq"), py::arg("dk"), py::arg("dv"),
           "Fix the lazy input widths as a first call with these widths would.")
      .def_property_readonly(
          "last_dropout_mask", [](const MultiHeadAttention& s) { return to_numpy(s.last_dropout_mask()); },
          "(B, num_heads, Q, K) dropout multipliers of the last call: 0 or 1/(1-p), all 1 without dropout");

  py::enum_<PositionKind>(m, "Positions", "How AttentionModel encodes positions.")
      .value("LEARNED", PositionKind::Learned, "a trained (max_len, D) table")
      .value("SINUSOIDAL", PositionKind::Sinusoidal, "d2l's fixed sin/cos encoding");

  py::class_<AttentionModel>(m, "AttentionModel", R"doc(
Token embedding + positions + num_layers MultiHeadAttention self-attention
layers (residual when more than one) + a linear read-out (mha/model.h).

AttentionModel(vocab_size, num_classes, max_len, num_hiddens=64, num_heads=4,
               num_layers=1, dropout=0.0, bias=False, positions=Positions.LEARNED, seed=0)

Called as model(tokens (B,T) ints, valid_lens=None|(B,)|(B,T)) -> logits (B,T,num_classes).
)doc")
      .def(py::init([](int64_t vocab_size, int64_t num_classes, int64_t max_len, int64_t num_hiddens,
                       int64_t num_heads, int64_t num_layers, Real dropout, bool bias,
                       PositionKind positions, uint64_t seed) {
             ModelConfig c{vocab_size, num_classes, max_len, num_hiddens, num_heads, num_layers, dropout, bias, positions};
             return std::make_unique<AttentionModel>(c, seed);
           }),
           py::arg("vocab_size"), py::arg("num_classes"), py::arg("max_len"), py::arg("num_hiddens") = 64,
           py::arg("num_heads") = 4, py::arg("num_layers") = 1, py::arg("dropout") = 0.0f,
           py::arg("bias").noconvert() = false, py::arg("positions") = PositionKind::Learned, py::arg("seed") = 0)
      .def(
          "__call__",
          [](AttentionModel& self, const py::object& tokens, const py::object& vl) {
            int64_t B = 0, T = 0;
            const std::vector<int32_t> ids = to_ids(tokens, "AttentionModel.forward", "tokens", B, T);
            const ValidLens lens = lens_of(vl, "AttentionModel.forward");
            return hand_to_numpy(locked(&self, [&] { return self.forward(ids, B, T, lens); }));
          },
          py::arg("tokens"), py::arg("valid_lens") = py::none(), "(tokens (B,T), valid_lens) -> logits (B,T,C)")
      .def(
          "backward",
          [](AttentionModel& self, const py::object& grad_logits) {
            const Tensor g = to_tensor(grad_logits, "AttentionModel.backward", "grad_logits");
            return to_dict(locked(&self, [&] {
              self.backward(g);
              return self.grads();
            }));
          },
          py::arg("grad_logits"),
          "backward(grad_logits (B,T,C)) -> param_grads: accumulates and returns every parameter's gradient")
      .def("zero_grad", [](AttentionModel& s) { locked(&s, [&] { s.zero_grad(); }); })
      .def("grads", [](AttentionModel& s) { return to_dict(locked(&s, [&] { return s.grads(); })); })
      .def("state_dict", [](AttentionModel& s) { return to_dict(locked(&s, [&] { return s.state_dict(); })); })
      .def("load_state_dict", [](AttentionModel& s, const py::object& d) {
             const StateDict sd = to_tensors(d, "AttentionModel.load_state_dict");
             locked(&s, [&] { s.load_state_dict(sd); });
           },
           py::arg("state_dict"))
      .def("train", [](AttentionModel& s, bool on) -> AttentionModel& { locked(&s, [&] { s.train(on); }); return s; },
           py::arg("mode").noconvert() = true, py::return_value_policy::reference)
      .def("eval", [](AttentionModel& s) -> AttentionModel& { locked(&s, [&] { s.eval(); }); return s; },
           py::return_value_policy::reference)
      .def_property_readonly("training", &AttentionModel::training)
      .def("layer", py::overload_cast<int64_t>(&AttentionModel::layer), py::arg("index"),
           py::return_value_policy::reference_internal,
           "The index-th MultiHeadAttention (its attention_weights are the last call's)")
      .def_property_readonly("num_layers", &AttentionModel::num_layers)
      .def("__repr__",
           [](const AttentionModel& s) {
             const ModelConfig& c = s.config();
             return py::str("mha.AttentionModel(vocab_size={}, num_classes={}, max_len={}, num_hiddens={}, "
                            "num_heads={}, num_layers={}, dropout={:g}, bias={}, positions={})")
                 .format(c.vocab_size, c.num_classes, c.max_len, c.num_hiddens, c.num_heads, c.num_layers, c.dropout,
                         c.bias ? "True" : "False",
                         c.positions == PositionKind::Learned ? "Positions.LEARNED" : "Positions.SINUSOIDAL")
                 .cast<std::string>();
           })
      .def_property_readonly("positions", [](const AttentionModel& s) { return to_numpy(s.positions()); },
                             "(max_len, D) position table (learned or sinusoidal)");

  m.def(
      "cross_entropy",
      [](const py::object& logits, const py::object& targets) {
        const Tensor l = to_tensor(logits, "cross_entropy", "logits");
        const std::vector<int32_t> t = int_values(targets, "cross_entropy", "targets").values;
        const CrossEntropy ce = cross_entropy(l, t);
        return py::make_tuple(ce.loss, to_numpy(ce.grad.reshape(l.shape())), ce.correct, ce.scored);
      },
      py::arg("logits"), py::arg("targets"),
      "cross_entropy(logits (...,C), targets (...) ints, -100 ignored) -> (loss, grad_logits, correct, scored)\n\n"
      "The mean cross-entropy over scored rows, as torch's cross_entropy(ignore_index=-100).");

  py::class_<OffsetPairTask>(m, "OffsetPairTask", R"doc(
The synthetic task of mha/task.h: target[t] = token[t-near] * vocab + token[t-far]
for t >= far (else -100), lengths uniform in [min_len, max_len], padded with token `vocab`.
)doc")
      .def(py::init([](int64_t vocab, int64_t near, int64_t far, int64_t min_len, int64_t max_len) {
             return OffsetPairTask({vocab, near, far, min_len, max_len});
           }),
           py::arg("vocab") = 8, py::arg("near") = 1, py::arg("far") = 10, py::arg("min_len") = 12,
           py::arg("max_len") = 32)
      .def(
          "sample",
          [](const OffsetPairTask& task, int64_t batch_size, uint64_t seed) {
            Generator gen(seed);
            const TokenBatch b = task.sample(batch_size, gen);
            py::dict d;
            d["tokens"] = ids_to_numpy(b.tokens, b.batch, b.length);
            d["targets"] = ids_to_numpy(b.targets, b.batch, b.length);
            d["valid_lens"] = to_numpy(Tensor({b.batch}, b.lengths));
            return d;
          },
          py::arg("batch_size"), py::arg("seed"),
          "A batch drawn from Generator(seed): dict of tokens (B,T), targets (B,T), valid_lens (B,)")
      .def_property_readonly("config", [](const OffsetPairTask& t) { return task_config_dict(t.config()); })
      .def_property_readonly("input_vocab", &OffsetPairTask::input_vocab)
      .def_property_readonly("num_classes", &OffsetPairTask::num_classes)
      .def_property_readonly("pad_token", &OffsetPairTask::pad_token);

  m.def(
      "load_checkpoint",
      [](const std::string& path) {
        const Checkpoint ck = read_checkpoint(path);
        return py::make_tuple(load_model(ck), OffsetPairTask(ck.config.task), ck.metadata);
      },
      py::arg("path"),
      "load_checkpoint(path) -> (model, task, metadata): a checkpoint written by `mha train`,\n"
      "the model in evaluation mode.");


  py::module_ optim = m.def_submodule("optim", "Optimisers with PyTorch's update rules.");
  py::class_<optim::Optimizer>(optim, "Optimizer")
      .def("step", [](optim::Optimizer& o) { locked(&o, [&] { o.step(); }); },
           "One update of every parameter from its gradient.")
      .def("zero_grad", [](optim::Optimizer& o) { locked(&o, [&] { o.zero_grad(); }); },
           "Zero every parameter's gradient.")
      .def_property("lr", &optim::Optimizer::lr, [](optim::Optimizer& o, Real lr) { locked(&o, [&] { o.set_lr(lr); }); })
      .def_property_readonly("steps", [](optim::Optimizer& o) { return locked(&o, [&] { return o.steps(); }); })
      .def("state", [](optim::Optimizer& o) { return to_dict(locked(&o, [&] { return o.state(); })); },
           "State buffers by '<parameter>.<buffer>' (e.g. 'W_q.weight.exp_avg').");
  py::class_<optim::SGD, optim::Optimizer>(optim, "SGD", "torch.optim.SGD's update rule.")
      .def(py::init([](py::object module, Real lr, Real momentum, Real dampening, Real weight_decay,
                       bool nesterov) {
             return std::make_unique<optim::SGD>(
                 params_of(module), optim::SGDOptions{lr, momentum, dampening, weight_decay, nesterov});
           }),
           py::arg("module"), py::arg("lr"), py::arg("momentum") = 0.0, py::arg("dampening") = 0.0,
           py::arg("weight_decay") = 0.0, py::arg("nesterov").noconvert() = false, py::keep_alive<1, 2>());
  py::class_<optim::Adam, optim::Optimizer>(optim, "Adam", "torch.optim.Adam's update rule.")
      .def(py::init(&make_adam<optim::Adam>), py::arg("module"), py::arg("lr") = 1e-3,
           py::arg("betas") = py::make_tuple(0.9, 0.999), py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 0.0, py::arg("amsgrad").noconvert() = false, py::keep_alive<1, 2>());
  py::class_<optim::AdamW, optim::Adam>(optim, "AdamW", "torch.optim.AdamW's update rule.")
      .def(py::init(&make_adam<optim::AdamW>), py::arg("module"), py::arg("lr") = 1e-3,
           py::arg("betas") = py::make_tuple(0.9, 0.999), py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 1e-2, py::arg("amsgrad").noconvert() = false, py::keep_alive<1, 2>());
  optim.def(
      "clip_grad_norm",
      [](py::object module, Real max_norm, Real norm_type) {
        return optim::clip_grad_norm(params_of(module), max_norm, norm_type);
      },
      py::arg("module"), py::arg("max_norm"), py::arg("norm_type") = 2.0,
      "Scale the module's gradients so their global norm is at most max_norm (as\n"
      "torch.nn.utils.clip_grad_norm_); returns the norm before clipping.");
  bind_torch_module_support(m);
}

}  // namespace mha::python
