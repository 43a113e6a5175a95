// python/bindings/prune_bindings.cpp: head gates, head pruning, pruned files and the
// head importance measures (mha/prune.h, mha/importance.h).
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "mha/mha.h"

namespace mha::python {

namespace {

// A batch as task.sample() returns it: tokens (B,T), targets (B,T), valid_lens (B,).
TokenBatch batch_from_dict(const py::dict& d, size_t index) {
  static const char* op = "importance";
  for (const char* key : {"tokens", "targets", "valid_lens"})
    if (!d.contains(key))
      fail(kType, op, "batches: entry ", index, " has no '", key,
           "' (wanted a dict as OffsetPairTask.sample returns)");
  const std::string entry = "batches: entry " + std::to_string(index);
  IntValues tokens = int_values(d["tokens"], op, entry + " 'tokens'");
  IntValues targets = int_values(d["targets"], op, entry + " 'targets'");
  const FloatArray lens = float_array(d["valid_lens"], op, entry + " 'valid_lens'");
  const Shape ls = shape_of(lens);
  if (tokens.shape.size() != 2 || targets.shape != tokens.shape || ls.size() != 1 || ls[0] != tokens.shape[0])
    fail(op, entry, " has tokens ", shape_str(tokens.shape), ", targets ", shape_str(targets.shape), ", valid_lens ",
         shape_str(ls), "; wanted (B, T), (B, T) and (B,)");
  TokenBatch b;
  b.batch = tokens.shape[0];
  b.length = tokens.shape[1];
  b.tokens = std::move(tokens.values);
  b.targets = std::move(targets.values);
  b.lengths.assign(lens.data(), lens.data() + lens.size());
  return b;
}

std::vector<TokenBatch> batches_from(const py::object& obj) {
  std::vector<TokenBatch> out;
  if (py::isinstance<py::dict>(obj)) {
    out.push_back(batch_from_dict(obj.cast<py::dict>(), 0));
    return out;
  }
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj))
    fail(kType, "importance", "batches: got ", type_name(obj),
         ", wanted a dict or a list of dicts as OffsetPairTask.sample returns");
  size_t i = 0;
  for (const py::handle item : obj) {
    if (!py::isinstance<py::dict>(item))
      fail(kType, "importance", "batches: entry ", i, " is ", type_name(item), ", not a dict");
    out.push_back(batch_from_dict(item.cast<py::dict>(), i++));
  }
  return out;
}

py::dict batch_to_dict(const TokenBatch& b) {
  py::dict d;
  py::array_t<int32_t> tokens({b.batch, b.length}), targets({b.batch, b.length});
  std::copy(b.tokens.begin(), b.tokens.end(), tokens.mutable_data());
  std::copy(b.targets.begin(), b.targets.end(), targets.mutable_data());
  d["tokens"] = tokens;
  d["targets"] = targets;
  d["valid_lens"] = to_numpy(Tensor({b.batch}, b.lengths));
  return d;
}

// One float64 array of scores per layer.
py::list scores_to_list(const HeadScores& s) {
  py::list out;
  for (const auto& layer : s) out.append(py::array_t<double>(static_cast<py::ssize_t>(layer.size()), layer.data()));
  return out;
}

}  // namespace

// Head gates, their gradients and pruning, bound the same way on both modules.
template <typename Module>
void bind_heads(py::class_<Module>& cls, const std::string& name, const char* projections) {
  const std::string set_gates = name + ".set_head_gates", prune = name + ".prune_heads";
  cls.def_property(
         "head_gates",
         [](const Module& s) {
           const std::vector<float> g = s.head_gates();
           return py::array_t<float>(static_cast<py::ssize_t>(g.size()), g.data());
         },
         [set_gates](Module& s, const py::object& obj) {
           const FloatArray g = float_array(obj, set_gates.c_str(), "gates");
           if (g.ndim() != 1)
             fail(set_gates.c_str(), "gates: shape ", shape_str(Shape(g.shape(), g.shape() + g.ndim())), " is not (",
                  s.num_heads(), ",)");
           s.set_head_gates(std::vector<float>(g.data(), g.data() + g.size()));
         },
         ("(num_heads,) float32: each head's output is multiplied by its gate before " + std::string(projections) +
          " (default 1).\nNot a parameter: not in state_dict(), grads() or what optimisers move. Assign a new array\n"
          "(m.head_gates = a); editing the returned copy changes nothing.").c_str())
      .def_property_readonly(
          "head_gate_grad", [](const Module& s) { return to_numpy(s.head_gate_grad()); },
          "(num_heads,) dL/dgate accumulated by backward() (zeroed by zero_grad()): each head's gradient importance")
      .def(
          "prune_heads", [prune](Module& s, const py::object& heads) { s.prune_heads(int_list(heads, prune.c_str(), "heads")); },
          py::arg("heads"),
          ("Remove heads for good (numbered as the module was built): their rows of the query, key and\n"
           "value projections and columns of " + std::string(projections) + ". The output keeps its width; at least one head\n"
           "must remain.").c_str())
      .def_property_readonly("kept_heads", &Module::kept_heads, "Heads still there, numbered as the module was built")
      .def_property_readonly("original_num_heads", &Module::original_num_heads)
      .def_property_readonly("head_dim", &Module::head_dim);
}

void bind_pruning(py::module_& m) {
  auto mha_class = py::reinterpret_borrow<py::class_<MultiHeadAttention>>(m.attr("MultiHeadAttention"));
  bind_heads(mha_class, "MultiHeadAttention", "W_o");
  mha_class.def_property_readonly("inner_dim", &MultiHeadAttention::inner_dim,
                                  "num_heads * head_dim: the width of q, k, v (num_hiddens unless pruned)");
  auto torch_class = py::reinterpret_borrow<py::class_<TorchMultiheadAttention>>(m.attr("TorchMultiheadAttention"));
  bind_heads(torch_class, "TorchMultiheadAttention", "out_proj");

  m.def("save_attention", &save_attention, py::arg("path"), py::arg("module"),
        "Write a module's parameters and head layout (pruned heads) to a safetensors file.");
  m.def("load_attention", &load_attention, py::arg("path"), py::arg("num_heads") = 0,
        "A module from a safetensors file (save_attention's, or d2l's names), in eval mode;\n"
        "num_heads (as built) from the file's metadata when 0.");
  m.def(
      "prune_model_heads",
      [](AttentionModel& model, const std::vector<std::pair<int64_t, int64_t>>& heads) {
        prune_model_heads(model, heads);
      },
      py::arg("model"), py::arg("heads"), "Remove heads of a model, given as (layer, head) pairs.");
  m.def(
      "held_out_set",
      [](const OffsetPairTask& task, int64_t size, uint64_t seed) {
        py::list out;
        for (const TokenBatch& b : held_out_set(task, size, seed)) out.append(batch_to_dict(b));
        return out;
      },
      py::arg("task"), py::arg("size"), py::arg("seed"),
      "`size` sequences from Generator(seed) in batches of at most 256, as dicts like task.sample's\n"
      "(the set mha train evaluates on, with seed = the checkpoint's train.held_out_seed).");

  m.def(
      "gradient_importance",
      [](AttentionModel& model, const py::object& batches) {
        const std::vector<TokenBatch> b = batches_from(batches);
        GradientImportance g;
        {
          py::gil_scoped_release release;
          g = gradient_importance(model, b);
        }
        py::dict d;
        d["normalised"] = scores_to_list(g.normalised);
        d["raw"] = scores_to_list(g.raw);
        d["sequences"] = g.sequences;
        return d;
      },
      py::arg("model"), py::arg("batches"),
      "Michel et al. 2019: per layer, one score per head: the mean over sequences of |dL/dgate|\n"
      "('raw') and that divided by the layer's L2 norm ('normalised'). batches: a list of dicts\n"
      "as task.sample returns. Leaves the model's gradients at zero.");
  m.def(
      "ablation_importance",
      [](AttentionModel& model, const py::object& batches) {
        const std::vector<TokenBatch> b = batches_from(batches);
        AblationImportance a;
        {
          py::gil_scoped_release release;
          a = ablation_importance(model, b);
        }
        py::dict d;
        d["loss_increase"] = scores_to_list(a.loss_increase);
        d["accuracy_drop"] = scores_to_list(a.accuracy_drop);
        d["loss"] = a.all_heads.loss;
        d["accuracy"] = a.all_heads.accuracy;
        return d;
      },
      py::arg("model"), py::arg("batches"),
      "Per layer, one score per head: the loss increase and accuracy drop when that head alone is\n"
      "gated off; 'loss' and 'accuracy' with every head on.");
  m.def(
      "attention_statistics",
      [](AttentionModel& model, const py::object& batches) {
        const std::vector<TokenBatch> b = batches_from(batches);
        AttentionStatistics s;
        {
          py::gil_scoped_release release;
          s = attention_statistics(model, b);
        }
        py::dict d;
        d["confidence"] = scores_to_list(s.confidence);
        d["entropy"] = scores_to_list(s.entropy);
        d["queries"] = s.queries;
        return d;
      },
      py::arg("model"), py::arg("batches"),
      "Voita et al. 2019: per layer, one score per head: the mean over valid queries of the largest\n"
      "attention weight ('confidence') and of the weights' entropy in nats ('entropy').");
}

}  // namespace mha::python
