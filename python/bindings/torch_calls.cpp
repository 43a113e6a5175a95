// python/bindings/torch_calls.cpp: mha.torch's calls, with the weights passed per
// call (nn/layer_ref.h) and a context per call (mha/context.h), so that no
// module state is shared between calls: any number of calls, from any
// threads, forward and backward in any order, each get their own results.
//
//   calls = _core._torch_calls
//   packs = calls._WeightPacks()                   # one per torch module
//   masks = calls.call_masks(op, key_padding_mask=..., is_causal=..., window=..., softcap=...)
//   settings = calls.call_settings(op, kernel=..., precision=..., for_backward=..., ...)
//   out, w, ctx = calls._torch_mha_forward(packs, layers, query, key, value, E, h, batch_first,
//                                          masks, settings, need_weights, average)
//   (gq, gk, gv), grads, d_bias_k, d_bias_v, d_gates = calls._engine_backward(ctx, layers, grad_out)
//
// layers: ((W, b|None, version) x 4 for q, k, v, o, bias_k|None, bias_v|None,
// zero_row, head_gates|None). W, b are float32 arrays read in place (numpy
// views of the torch Parameters); `version` keys the packing of W in
// `packs` (mha.torch changes it whenever the Parameter may have changed).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "mha/context.h"
#include "mha/error.h"
#include "mha/parameter.h"
#include "nn/attention_engine.h"
#include "nn/layer_ref.h"
#include "nn/module_calls.h"

namespace py = pybind11;

namespace mha::python {

namespace {

using CArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// What one torch module's calls share: its weights' packings, and the large
// buffers of its last finished call (projections, heads, inputs), which the
// next call takes instead of fresh memory. Fresh memory costs page faults:
// measured at one thread, B32 L197 E384 h6 forward, 63-67 ms with reused
// heap memory against 215-268 ms when each call's buffers were mapped anew
// (glibc maps blocks this large and unmaps them when freed).
struct CallState {
  nn::WeightPacks packs;
  std::mutex mutex;
  std::vector<Tensor> spare;

  std::vector<Tensor> take() {
    std::lock_guard<std::mutex> lock(mutex);
    return std::move(spare);
  }
  // Keeps the larger of what it holds and `buffers` (one call's worth; the
  // slots take_buffer emptied are dropped, so the pool never grows).
  void give(std::vector<Tensor>&& buffers) {
    buffers.erase(std::remove_if(buffers.begin(), buffers.end(), [](const Tensor& t) { return t.numel() == 0; }),
                  buffers.end());
    auto bytes = [](const std::vector<Tensor>& v) {
      int64_t n = 0;
      for (const Tensor& t : v) n += t.numel();
      return n;
    };
    std::lock_guard<std::mutex> lock(mutex);
    if (bytes(buffers) > bytes(spare)) spare = std::move(buffers);
  }
};

// The engine's context of a call, whose buffers go back to `state` when the
// last holder lets it go (the autograd node after its backward, or at once
// for a call without one).
std::shared_ptr<const nn::AttentionContext> pooled(std::shared_ptr<nn::AttentionContext> ctx,
                                                   const std::shared_ptr<CallState>& state) {
  nn::AttentionContext* raw = ctx.get();
  return std::shared_ptr<const nn::AttentionContext>(raw, [ctx, state](const nn::AttentionContext*) mutable {
    if (ctx.use_count() == 1) state->give(nn::release_buffers(*ctx));
    ctx.reset();
  });
}

// A tensor of obj's values in a buffer from `reuse` where one fits.
Tensor input_tensor(const py::object& obj, const char* op, const char* what, std::vector<Tensor>* reuse) {
  FloatArray a = float_array(obj, op, what);
  Tensor t = nn::take_buffer(shape_of(a), reuse);
  if (a.size() > 0) std::memcpy(t.data(), a.data(), sizeof(float) * static_cast<size_t>(a.size()));
  return t;
}

// The arrays of one call's layers, held while the call reads them.
struct CallLayers {
  std::vector<CArray> keep;
  nn::EngineLayers layers;
  int64_t kv_width = 0;  // bias_k / bias_v elements
};

const float* hold(CallLayers& c, const py::handle& obj, const char* op, const char* what, py::ssize_t elements) {
  if (obj.is_none()) return nullptr;
  CArray a = CArray::ensure(obj);
  if (!a) {
    PyErr_Clear();
    fail(op, what, ": cannot be read as a float32 array");
  }
  if (elements >= 0 && a.size() != elements)
    fail(op, what, ": ", a.size(), " elements; wanted ", elements);
  c.keep.push_back(a);
  return a.data();
}

CallLayers layers_of(const py::tuple& t, nn::WeightPacks* packs, const char* op) {
  if (t.size() != 8) fail(op, "layers: ", t.size(), " entries; wanted 8");
  CallLayers c;
  c.keep.reserve(12);
  nn::LayerRef* refs[] = {&c.layers.q, &c.layers.k, &c.layers.v, &c.layers.o};
  static const char* names[] = {"W_q", "W_k", "W_v", "W_o"};
  for (int i = 0; i < 4; ++i) {
    const py::tuple l = t[static_cast<size_t>(i)].cast<py::tuple>();
    CArray w = CArray::ensure(l[0]);
    if (!w || w.ndim() != 2) {
      PyErr_Clear();
      fail(op, names[i], ": the weight is not a 2-D float32 array");
    }
    c.keep.push_back(w);
    const float* b = hold(c, l[1], op, names[i], w.shape(0));
    const uint64_t version = l[2].cast<uint64_t>();
    *refs[i] = nn::LayerRef(w.data(), b, w.shape(0), w.shape(1), packs, i, version);
  }
  c.kv_width = c.layers.k.out_features();
  c.layers.bias_k = hold(c, t[4], op, "bias_k", c.kv_width);
  c.layers.bias_v = hold(c, t[5], op, "bias_v", c.kv_width);
  c.layers.zero_row = t[6].cast<bool>();
  c.layers.head_gates = hold(c, t[7], op, "head_gates", -1);
  return c;
}

// query, key, value as tensors; one array passed twice is one tensor (the
// engine projects it once: self-attention runs one product per layer).
struct Inputs {
  Tensor q, k, v;
  const Tensor* rk = nullptr;
  const Tensor* rv = nullptr;
};
void read_inputs(Inputs& in, const py::object& q, const py::object& k, const py::object& v, const char* op,
                 const char* names[3], std::vector<Tensor>* reuse) {
  in.q = input_tensor(q, op, names[0], reuse);
  if (k.ptr() != q.ptr()) in.k = input_tensor(k, op, names[1], reuse);
  in.rk = k.ptr() == q.ptr() ? &in.q : &in.k;
  if (v.ptr() != q.ptr() && v.ptr() != k.ptr()) in.v = input_tensor(v, op, names[2], reuse);
  in.rv = v.ptr() == q.ptr() ? &in.q : v.ptr() == k.ptr() ? in.rk : &in.v;
}

nn::CallSettings settings_of(AttentionKernel kernel, Precision precision, bool for_backward, float dropout_p,
                             uint64_t dropout_key, bool keep_for_weights) {
  nn::CallSettings s;
  s.kernel = kernel;
  s.precision = precision;
  s.keep_for_backward = for_backward;
  s.keep_for_weights = keep_for_weights;
  if (dropout_p > 0.0f) s.dropout = {dropout_p, dropout_key};
  return s;
}

// Zero gradients shaped as the layer's parameters (null where there is none).
struct OwnedGrads {
  Tensor w[4], b[4], bias_k, bias_v, gates;
  nn::EngineGrads grads;
};
void make_grads(OwnedGrads& g, const nn::EngineLayers& l, int64_t H) {
  const nn::LayerRef* all[] = {&l.q, &l.k, &l.v, &l.o};
  nn::LinearGrads* lg[] = {&g.grads.q, &g.grads.k, &g.grads.v, &g.grads.o};
  for (int i = 0; i < 4; ++i) {
    g.w[i] = Tensor({all[i]->out_features(), all[i]->in_features()});
    lg[i]->weight = &g.w[i];
    if (all[i]->has_bias()) {
      g.b[i] = Tensor({all[i]->out_features()});
      lg[i]->bias = &g.b[i];
    }
  }
  if (l.bias_k) {
    g.bias_k = Tensor({l.k.out_features()});
    g.bias_v = Tensor({l.k.out_features()});
    g.grads.bias_k = &g.bias_k;
    g.grads.bias_v = &g.bias_v;
  }
  if (l.head_gates) {  // the gates' gradient only when the call has gates
    g.gates = Tensor({H});
    g.grads.head_gates = &g.gates;
  }
}

py::object grad_or_none(Tensor& t) { return t.empty() ? py::object(py::none()) : py::object(hand_to_numpy(std::move(t))); }

}  // namespace

void bind_torch_calls(py::module_& core) {
  // A submodule: plumbing of mha.torch, which checks every argument before
  // it calls these (its modules' errors are the ones users see).
  py::module_ m = core.def_submodule("_torch_calls", "mha.torch's calls (internal: use mha.torch)");
  py::class_<CallState, std::shared_ptr<CallState>>(
      m, "_CallState",
      "What one torch module's calls share: packings of its weights by slot and version, spare buffers.")
      .def(py::init<>())
      .def("clear", [](CallState& s) { s.packs.clear(); }, "Forget every packing: the next call packs again.")
      .def_property_readonly(
          "spare_buffers",
          [](CallState& s) {
            std::lock_guard<std::mutex> lock(s.mutex);
            return s.spare.size();
          },
          "How many spare buffers the pool holds (one call's worth at most).");

  m.def("_next_param_version", [] { return ParamVersion().get(); },
        "A parameter version never used before in this process (for _torch_mha_forward's layers).");

  // The calls' values, each made once at the Python edge by one
  // keyword-only converter (checked there, in the caller's words) and
  // carried whole: what a call masks and scores with (mha::CallMasks), and
  // how it runs (nn::CallSettings).
  py::class_<CallMasks>(m, "CallMasks",
                        "One call's masks and score options, checked (made by call_masks).");
  m.def(
      "call_masks",
      [](const std::string& op, const py::object& key_padding_mask, const py::object& attn_mask,
         const py::object& is_causal, const py::object& window, const py::object& softcap,
         const py::object& alibi_slopes, const py::object& sinks, FullyMaskedRows fully_masked_rows) {
        CallMasks masks = to_call_masks(key_padding_mask, attn_mask, is_causal, window, op.c_str());
        masks.scores = to_scores(softcap, alibi_slopes, op.c_str(), sinks);
        masks.fully_masked_rows = fully_masked_rows;
        return masks;
      },
      py::arg("op"), py::kw_only(), py::arg("key_padding_mask") = py::none(), py::arg("attn_mask") = py::none(),
      py::arg("is_causal") = false, py::arg("window") = py::none(), py::arg("softcap") = py::none(),
      py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
      py::arg("fully_masked_rows") = FullyMaskedRows::Uniform,
      "A call's masks (nn.MultiheadAttention's convention: True = masked out), causal masking, window\n"
      "and score options, converted and checked once, errors naming `op` -> CallMasks.");
  py::class_<nn::CallSettings>(m, "CallSettings", "How one call runs (made by call_settings).");
  m.def(
      "call_settings",
      [](const std::string& op, AttentionKernel kernel, const std::string& precision, bool for_backward,
         float dropout_p, uint64_t dropout_key, bool keep_context, const std::optional<mha::Rotary>& rotary) {
        nn::CallSettings s =
            settings_of(kernel, parse_precision(op.c_str(), precision), for_backward, dropout_p, dropout_key, keep_context);
        if (rotary) {
          check_rotary(op.c_str(), *rotary);
          s.rotary = *rotary;
        }
        return s;
      },
      py::arg("op"), py::kw_only(), py::arg("kernel"), py::arg("precision"), py::arg("for_backward"),
      py::arg("dropout_p"), py::arg("dropout_key"), py::arg("keep_context"), py::arg("rotary") = py::none(),
      "A call's kernel, number format, what its context keeps (for_backward: training; keep_context:\n"
      "the weights later), dropout and rotary embedding -> CallSettings.");

  m.def(
      "_torch_mha_forward",
      [](const std::shared_ptr<CallState>& state, const py::tuple& layers_t, const py::object& query,
         const py::object& key, const py::object& value, int64_t embed_dim, int64_t num_heads, bool batch_first,
         const CallMasks& masks, const nn::CallSettings& s, bool need_weights, bool average_attn_weights) {
        static const char* op = "mha.torch.MultiheadAttention";
        static const char* names[3] = {"query", "key", "value"};
        CallLayers c = layers_of(layers_t, &state->packs, op);
        std::vector<Tensor> spare = state->take();
        Inputs in;
        read_inputs(in, query, key, value, op, names, &spare);
        TorchMhaCall call;
        call.key_padding_mask = masks.key_padding_mask;
        call.attn_mask = masks.attn_mask;
        call.causal = masks.causal;
        call.window = masks.window;
        call.scores = masks.scores;
        call.need_weights = need_weights;
        call.average_attn_weights = average_attn_weights;
        if (num_heads <= 0 || embed_dim % num_heads != 0)
          fail(op, "num_heads: ", num_heads, " does not divide embed_dim ", embed_dim);
        const int64_t d = embed_dim / num_heads;
        const int64_t H = c.layers.q.out_features() / d;
        const int64_t Hkv = c.layers.k.out_features() / d;
        nn::TorchMhaShape shape{embed_dim, H, Hkv, d, batch_first, masks.fully_masked_rows};
        if (s.rotary.enabled()) check_rotary(op, s.rotary, d);  // per head of width d (mha/rotary.h)
        nn::TorchMhaForward f;
        {
          py::gil_scoped_release release;
          f = nn::torch_mha_forward(op, shape, c.layers, in.q, *in.rk, *in.rv, call, s, &spare);
          for (Tensor* t : {&in.q, &in.k, &in.v})
            if (!t->empty()) spare.push_back(std::move(*t));
          state->give(std::move(spare));
        }
        py::object w = f.result.weights ? py::object(hand_to_numpy(std::move(*f.result.weights))) : py::object(py::none());
        py::object ctx = s.keep_for_weights || s.keep_for_backward
                             ? py::cast(ForwardContext(pooled(std::move(f.context), state)))
                             : py::object(py::none());
        if (ctx.is_none()) {
          py::gil_scoped_release release;
          pooled(std::move(f.context), state).reset();
        }
        return py::make_tuple(hand_to_numpy(std::move(f.result.output)), w, ctx);
      },
      py::arg("state"), py::arg("layers"), py::arg("query"), py::arg("key"), py::arg("value"),
      py::arg("embed_dim"), py::arg("num_heads"), py::arg("batch_first"), py::arg("masks"), py::arg("settings"),
      py::arg("need_weights"), py::arg("average_attn_weights"),
      "nn.MultiheadAttention's forward on the weights given, with the call's masks (call_masks) and\n"
      "settings (call_settings) -> (output, weights or None, context or None)");

  m.def(
      "_chapter_forward",
      [](const std::shared_ptr<CallState>& state, const py::tuple& layers_t, const py::object& queries,
         const py::object& keys, const py::object& values, const py::object& valid_lens, int64_t num_heads,
         const CallMasks& masks, const nn::CallSettings& s) {
        static const char* op = "mha.torch.MultiHeadAttention";
        static const char* names[3] = {"queries", "keys", "values"};
        CallLayers c = layers_of(layers_t, &state->packs, op);
        std::vector<Tensor> spare = state->take();
        Inputs in;
        read_inputs(in, queries, keys, values, op, names, &spare);
        const ValidLens lens = to_valid_lens(valid_lens, op);
        const int64_t inner = c.layers.q.out_features();
        if (num_heads <= 0 || inner % num_heads != 0)
          fail(op, "num_heads: ", num_heads, " does not divide W_q's ", inner, " outputs");
        if (s.rotary.enabled()) check_rotary(op, s.rotary, inner / num_heads);  // per head (mha/rotary.h)
        nn::EngineOutput r;
        {
          py::gil_scoped_release release;
          nn::EngineCall call = nn::chapter_call(op, in.q, *in.rk, *in.rv, lens, masks, num_heads,
                                                 inner / num_heads, c.layers.o.out_features(), s);
          nn::check_chapter_widths(op, c.layers, in.q, *in.rk, *in.rv);
          core::MemoryPlan plan(op);
          nn::add_call_memory(plan, call, c.layers, c.layers.o.out_features());
          plan.check();
          r = nn::attention_forward(in.q, *in.rk, *in.rv, c.layers, std::move(call), &spare);
          for (Tensor* t : {&in.q, &in.k, &in.v})
            if (!t->empty()) spare.push_back(std::move(*t));
          state->give(std::move(spare));
        }
        py::object ctx = s.keep_for_weights || s.keep_for_backward
                             ? py::cast(ForwardContext(pooled(std::move(r.context), state)))
                             : py::object(py::none());
        if (ctx.is_none()) {
          py::gil_scoped_release release;
          pooled(std::move(r.context), state).reset();
        }
        return py::make_tuple(hand_to_numpy(std::move(r.output)), ctx);
      },
      py::arg("state"), py::arg("layers"), py::arg("queries"), py::arg("keys"), py::arg("values"),
      py::arg("valid_lens"), py::arg("num_heads"), py::arg("masks"), py::arg("settings"),
      "The d2l chapter's forward on the weights given, with the call's window and score options\n"
      "(call_masks; the chapter's lengths beside them) and settings (call_settings) -> (output, context or None)");

  m.def(
      "_engine_backward",
      [](const std::shared_ptr<CallState>& state, const ForwardContext& context, const py::tuple& layers_t,
         const py::object& grad_output) {
        static const char* op = "mha.torch backward";
        if (context.empty()) fail(op, "context: empty (no forward call)");
        const nn::AttentionContext& ctx = *context.get();
        if (!ctx.for_backward) fail(op, "context: the call ran without gradients (evaluation mode)");
        CallLayers c = layers_of(layers_t, nullptr, op);
        const Tensor g = to_tensor(grad_output, op, "grad_output");
        const Shape& out_shape = ctx.queries.shape();
        Shape want = out_shape;
        want.back() = c.layers.o.out_features();
        if (g.shape() != want)
          fail(op, "grad_output: shape ", shape_str(g.shape()), " is not the output's ", shape_str(want));
        OwnedGrads og;
        make_grads(og, c.layers, ctx.H);
        nn::EngineInputGrads in;
        {
          py::gil_scoped_release release;
          std::vector<Tensor> spare = state->take();
          in = nn::attention_backward(ctx, c.layers, g, og.grads, &spare);
          state->give(std::move(spare));
        }
        py::tuple params = py::make_tuple(grad_or_none(og.w[0]), grad_or_none(og.b[0]), grad_or_none(og.w[1]),
                                          grad_or_none(og.b[1]), grad_or_none(og.w[2]), grad_or_none(og.b[2]),
                                          grad_or_none(og.w[3]), grad_or_none(og.b[3]));
        return py::make_tuple(
            py::make_tuple(hand_to_numpy(std::move(in.queries)), hand_to_numpy(std::move(in.keys)), hand_to_numpy(std::move(in.values))),
            params, grad_or_none(og.bias_k), grad_or_none(og.bias_v), grad_or_none(og.gates), grad_or_none(in.sinks));
      },
      py::arg("state"), py::arg("context"), py::arg("layers"), py::arg("grad_output"),
      "The backward of the call of `context` with the same weights -> ((gq, gk, gv), (dW_q, db_q, ..., dW_o, "
      "db_o), d bias_k, d bias_v, d head_gates, d sinks)");
}

}  // namespace mha::python
