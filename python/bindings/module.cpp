// python/bindings/module.cpp: the mha Python module (mha._core), a thin layer over the
// C++ library. Arrays come in as numpy arrays of any real dtype (converted to
// float32, C order) and go out as new float32 numpy arrays. mha::Error becomes
// ValueError; an argument of the wrong kind, mha.ArgumentTypeError (a
// TypeError and a ValueError).
#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.h"
#include "convert.h"
#include "cpu/gemm/fma_peak.h"
#include "mha/mha.h"

namespace py = pybind11;

namespace {

using mha::python::FloatArray;
using mha::python::to_dict;
using mha::python::to_numpy;
using mha::python::to_tensor;

using mha::python::hand_to_numpy;


py::array raw_to_numpy(const mha::RawTensor& raw, const std::string& name) {
  std::vector<py::ssize_t> shape(raw.shape.begin(), raw.shape.end());
  auto make = [&](auto tag) {
    using T = decltype(tag);
    py::array_t<T> out(shape);
    if (!raw.bytes.empty()) std::memcpy(out.mutable_data(), raw.bytes.data(), raw.bytes.size());
    return py::array(out);
  };
  switch (raw.dtype) {
    case mha::DType::F64: return make(double{});
    case mha::DType::F32: return make(float{});
    case mha::DType::I64: return make(int64_t{});
    case mha::DType::I32: return make(int32_t{});
    case mha::DType::I16: return make(int16_t{});
    case mha::DType::I8: return make(int8_t{});
    case mha::DType::U8: return make(uint8_t{});
    case mha::DType::BOOL: return make(bool{});
    case mha::DType::F16:
    case mha::DType::BF16: return to_numpy(mha::to_float_tensor(raw, name));
  }
  return py::none();
}

}  // namespace

namespace mha::python {

}  // namespace mha::python

using mha::python::to_valid_lens;

// MultiHeadAttention's __call__ (with_context: forward_with_context's).
py::object call_textbook(mha::MultiHeadAttention& self, const py::object& q, const py::object& k, const py::object& v,
                         const py::object& vl, const py::object& kpm, const py::object& am,
                         const py::object& is_causal, const py::object& window, const py::object& softcap,
                         const py::object& alibi_slopes, const py::object& sinks, bool with_context) {
  const char* op = "MultiHeadAttention.forward";
  mha::CallMasks masks = mha::python::to_call_masks(kpm, am, is_causal, window, op);
  masks.scores = mha::python::to_scores(softcap, alibi_slopes, op, sinks);
  // One array passed twice is one tensor here too, so that the
  // module projects it once (self-attention: one product for
  // W_q, W_k, W_v) and it is copied in once.
  mha::Tensor tq = to_tensor(q, op, "queries");
  mha::Tensor tk = k.ptr() == q.ptr() ? mha::Tensor() : to_tensor(k, op, "keys");
  mha::Tensor tv = v.ptr() == q.ptr() || v.ptr() == k.ptr() ? mha::Tensor() : to_tensor(v, op, "values");
  const mha::Tensor& rk = k.ptr() == q.ptr() ? tq : tk;
  const mha::Tensor& rv = v.ptr() == q.ptr() ? tq : v.ptr() == k.ptr() ? rk : tv;
  mha::ValidLens lens = to_valid_lens(vl, "MultiHeadAttention.forward");
  mha::MultiHeadAttention::ForwardResult r;
  {
    py::gil_scoped_release release;
    if (with_context) r = self.forward_with_context(tq, rk, rv, lens, masks);
    else r.output = self.forward(tq, rk, rv, lens, masks);
  }
  if (!with_context) return hand_to_numpy(std::move(r.output));
  return py::make_tuple(hand_to_numpy(std::move(r.output)), r.context);
}

PYBIND11_MODULE(_core, m) {
  m.doc() = "mha: multi-head attention from Dive into Deep Learning (d2l.ai, chapter 11.5) in C++";
  m.attr("__version__") = mha::kVersion;

  // An argument of the wrong kind (a string for an array, a float for a
  // count): a TypeError, and a ValueError as every mha error is.
  {
    const py::tuple bases = py::make_tuple(py::handle(PyExc_TypeError), py::handle(PyExc_ValueError));
    mha::python::argument_type_error_class = PyErr_NewExceptionWithDoc(
        "mha.ArgumentTypeError",
        "An argument of the wrong kind: a string, None or an object where numbers are wanted.\n"
        "Both a TypeError and a ValueError (mha's error for every bad input).",
        bases.ptr(), nullptr);
    if (!mha::python::argument_type_error_class) throw py::error_already_set();
    m.attr("ArgumentTypeError") = py::handle(mha::python::argument_type_error_class);
    py::register_exception_translator([](std::exception_ptr p) {
      try {
        if (p) std::rethrow_exception(p);
      } catch (const mha::python::ArgumentTypeError& e) {
        PyErr_SetString(mha::python::argument_type_error_class, e.what());
      }
    });
  }

  py::enum_<mha::AttentionKernel>(m, "Kernel", "Which implementation computes attention.")
      .value("REFERENCE", mha::AttentionKernel::Reference, "plain loops, the yardstick")
      .value("BLAS", mha::AttentionKernel::Blas, "per-head BLAS products through a (Q, K) matrix")
      .value("FUSED", mha::AttentionKernel::Fused,
             "online softmax over key tiles: linear memory, padding skipped (every module's default)");

  m.def("set_num_threads", &mha::set_num_threads, py::arg("n"),
        "Threads for attention (OpenMP) and projections (OpenBLAS, process-wide).");
  m.def("get_num_threads", &mha::num_threads, "Threads mha computes with.");
  m.def(
      "_fma_peak",
      [](int64_t threads, double seconds) {
        const int n = threads < 1 || threads > mha::max_num_threads() ? 0 : static_cast<int>(threads);
        if (n == 0)
          mha::fail("measure_fma_peak", "threads: ", threads, "; wanted 1 <= threads <= ", mha::max_num_threads());
        mha::cpu::FmaPeak p;
        {
          py::gil_scoped_release release;
          p = mha::cpu::measure_fma_peak(n, seconds);
        }
        py::dict d;
        d["isa"] = mha::cpu::gemm_isa_name(p.isa);
        d["threads"] = p.threads;
        d["gflops"] = p.gflops;
        return d;
      },
      py::arg("threads"), py::arg("seconds") = 0.2,
      "For benchmarks: the measured float32 FMA peak (a register-only loop on the GEMM's\n"
      "instruction set, cpu/gemm/fma_peak.h) -> {'isa', 'threads', 'gflops'}.");
  m.def("max_num_threads", &mha::max_num_threads,
        "The most threads set_num_threads takes: 4x the machine's hardware threads, at least 4.");

  m.def(
      "masked_softmax",
      [](const py::object& X, const py::object& valid_lens) {
        return to_numpy(mha::masked_softmax(to_tensor(X, "masked_softmax", "X"),
                                            to_valid_lens(valid_lens, "masked_softmax")));
      },
      py::arg("X"), py::arg("valid_lens") = py::none(),
      "masked_softmax(X, valid_lens=None) -> (N, Q, K)\n\n"
      "X: (N, Q, K) scores; valid_lens: None, (N,) or (N, Q). Keys k with k >= length\n"
      "are replaced by -1e6 before the softmax over the last axis (d2l's rule).");

  py::class_<mha::DotProductAttention>(m, "DotProductAttention",
                                       "d2l's scaled dot-product attention with dropout.")
      .def(py::init([](mha::python::Real dropout, uint64_t seed) { return mha::DotProductAttention(dropout, seed); }),
           py::arg("dropout") = 0.0f, py::arg("seed") = 0)
      .def(
          "__call__",
          [](mha::DotProductAttention& self, const py::object& q, const py::object& k,
             const py::object& v, const py::object& vl) {
            const char* op = "DotProductAttention.forward";
            mha::Tensor tq = to_tensor(q, op, "queries"), tk = to_tensor(k, op, "keys"), tv = to_tensor(v, op, "values");
            mha::ValidLens lens = to_valid_lens(vl, "DotProductAttention.forward");
            mha::Tensor out;
            {
              py::gil_scoped_release release;
              out = self.forward(tq, tk, tv, lens);
            }
            return to_numpy(out);
          },
          py::arg("queries"), py::arg("keys"), py::arg("values"), py::arg("valid_lens") = py::none(),
          "(queries (N,Q,d), keys (N,K,d), values (N,K,dv), valid_lens None|(N,)|(N,Q)) -> (N,Q,dv)")
      .def("train", [](mha::DotProductAttention& s, bool on) -> mha::DotProductAttention& { s.train(on); return s; },
           py::arg("mode").noconvert() = true, py::return_value_policy::reference)
      .def("eval", [](mha::DotProductAttention& s) -> mha::DotProductAttention& { s.eval(); return s; },
           py::return_value_policy::reference)
      .def_property_readonly("training", &mha::DotProductAttention::training)
      .def_property_readonly("attention_weights",
                             [](const mha::DotProductAttention& s) {
                               mha::Tensor w = s.attention_weights();
                               if (w.dim() == 0)
                                 mha::fail("DotProductAttention.attention_weights",
                                           "no forward call yet: there are no weights to show");
                               return hand_to_numpy(std::move(w));
                             },
                             "(N, Q, K) weights of the last call, before dropout");

  py::class_<mha::Rotary>(m, "Rotary", R"doc(Rotary position embeddings on the projected queries and keys.

mha.Rotary(dims, base=10000.0, interleaved=False): the first `dims` entries
of each head (even, at most the head width) form pairs that turn by
position * base**(-2m/dims); interleaved=False pairs (x[m], x[m + dims/2])
as Hugging Face's rotate_half (LLaMA, GPT-NeoX, Mistral), True pairs
(x[2m], x[2m+1]) as GPT-J and Meta's LLaMA. Set it on a module with
module.rotary = mha.Rotary(...) or rotary= when made (None: off; True: every
entry of each head, base 10000, interleaved=False; a dict such as
{"dims": 32, "base": 500000.0, "interleaved": True}, dims defaulting to the
head width, is read as these arguments); cached calls number positions
from each row's cached length. The backward rotates the gradients back.
)doc")
      .def(py::init([](int64_t dims, mha::python::Real base, bool interleaved) {
             mha::Rotary r;
             r.dims = dims;
             r.base = base;
             r.layout = interleaved ? mha::Rotary::Layout::Interleaved : mha::Rotary::Layout::Half;
             mha::check_rotary("Rotary", r);
             return r;
           }),
           py::arg("dims"), py::arg("base") = 10000.0f, py::arg("interleaved").noconvert() = false)
      .def_property_readonly("dims", [](const mha::Rotary& r) { return r.dims; })
      .def_property_readonly("base", [](const mha::Rotary& r) { return r.base; })
      .def_property_readonly("interleaved", [](const mha::Rotary& r) { return r.layout == mha::Rotary::Layout::Interleaved; })
      .def(py::self == py::self)
      .def("__repr__", [](const mha::Rotary& r) {
        return py::str("mha.Rotary(dims={}, base={:g}, interleaved={})")
            .format(r.dims, r.base, r.layout == mha::Rotary::Layout::Interleaved ? "True" : "False");
      });

  py::class_<mha::MultiHeadAttention>(m, "MultiHeadAttention", R"doc(
Multi-head attention as Dive into Deep Learning (d2l, chapter 11.5) defines it.

MultiHeadAttention(num_hiddens, num_heads, dropout=0.0, bias=False, seed=0)

Called as m(queries, keys, values, valid_lens=None) with
  queries (B, Q, Dq), keys (B, K, Dk), values (B, K, Dv)   (any real dtype, used as float32)
  valid_lens None, (B,) or (B, Q)
it returns the output (B, Q, num_hiddens) as float32. Keyword arguments add
nn.MultiheadAttention's masks beside valid_lens: key_padding_mask (B, K) and
attn_mask (Q, K) or (B*num_heads, Q, K), boolean (True = masked out, as
PyTorch reads them) or additive floats, is_causal (True or an
mha.Causal) and window=(left, right), a sliding window as FlashAttention's
window_size (query i sees key j iff i + K - Q - left <= j <= i + K - Q + right,
-1 unbounded); softcap=c caps each scaled score s to c*tanh(s/c) (Gemma 2)
and alibi_slopes (one per head) subtracts slope[h]*|i + K - Q - j| (ALiBi),
both before the masks and not masks themselves; sinks (one logit per head,
gpt-oss's attention sinks) join every row's softmax denominator with no
value (backward then returns their gradient as a fourth input gradient). With a mask, masked scores are -inf (lengths included) and a
query with no key left attends uniformly, as a length of 0 does. The input widths are
fixed by the first call (lazy layers). A new module is in training mode, as a
torch.nn.Module is: dropout acts on the attention weights until .eval().
)doc")
      .def(py::init([](int64_t num_hiddens, int64_t num_heads, mha::python::Real dropout, bool bias, uint64_t seed,
                       const std::string& precision, const py::object& rotary) {
             const mha::Precision p = mha::parse_precision("MultiHeadAttention", precision);
             auto m = std::make_unique<mha::MultiHeadAttention>(num_hiddens, num_heads, dropout, bias, seed);
             m->set_precision(p);
             m->set_rotary(mha::python::to_rotary(rotary, "MultiHeadAttention", m->head_dim()));
             return m;
           }),
           py::arg("num_hiddens"), py::arg("num_heads"), py::arg("dropout") = 0.0f, py::arg("bias").noconvert() = false,
           py::arg("seed") = 0, py::arg("precision") = "float32", py::arg("rotary") = py::none())
      .def(
          "__call__",
          [](mha::MultiHeadAttention& self, const py::object& q, const py::object& k, const py::object& v,
             const py::object& vl, const py::object& kpm, const py::object& am, const py::object& is_causal,
             const py::object& window, const py::object& softcap, const py::object& alibi_slopes,
             const py::object& sinks) {
            return call_textbook(self, q, k, v, vl, kpm, am, is_causal, window, softcap, alibi_slopes, sinks, false);
          },
          py::arg("queries"), py::arg("keys"), py::arg("values"), py::arg("valid_lens") = py::none(), py::kw_only(),
          py::arg("key_padding_mask") = py::none(), py::arg("attn_mask") = py::none(), py::arg("is_causal") = false,
          py::arg("window") = py::none(), py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(),
          py::arg("sinks") = py::none(),
          "(queries (B,Q,Dq), keys (B,K,Dk), values (B,K,Dv), valid_lens None|(B,)|(B,Q), *,\n"
          " key_padding_mask None|(B,K), attn_mask None|(Q,K)|(B*h,Q,K), is_causal False,\n"
          " window None|(left, right), softcap None|c, alibi_slopes None|(h,), sinks None|(h,))\n"
          " -> (B,Q,num_hiddens)")
      .def(
          "forward_with_context",
          [](mha::MultiHeadAttention& self, const py::object& q, const py::object& k, const py::object& v,
             const py::object& vl, const py::object& kpm, const py::object& am, const py::object& is_causal,
             const py::object& window, const py::object& softcap, const py::object& alibi_slopes,
             const py::object& sinks) {
            return call_textbook(self, q, k, v, vl, kpm, am, is_causal, window, softcap, alibi_slopes, sinks, true);
          },
          py::arg("queries"), py::arg("keys"), py::arg("values"), py::arg("valid_lens") = py::none(), py::kw_only(),
          py::arg("key_padding_mask") = py::none(), py::arg("attn_mask") = py::none(), py::arg("is_causal") = false,
          py::arg("window") = py::none(), py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(),
          py::arg("sinks") = py::none(),
          "The same call, returning (output, context): the call's mha.ForwardContext, from which its\n"
          "attention weights and (training mode) its backward come; the module keeps nothing of the call.")
      .def("train", [](mha::MultiHeadAttention& s, bool on) -> mha::MultiHeadAttention& { s.train(on); return s; },
           py::arg("mode").noconvert() = true, py::return_value_policy::reference, "Training mode (dropout on); returns self.")
      .def("eval", [](mha::MultiHeadAttention& s) -> mha::MultiHeadAttention& { s.eval(); return s; },
           py::return_value_policy::reference, "Evaluation mode (dropout off); returns self.")
      .def_property_readonly("training", &mha::MultiHeadAttention::training)
      .def_property_readonly(
          "attention_weights",
          [](const mha::MultiHeadAttention& s) {
            mha::Tensor w = s.attention_weights();
            // C++ gives an empty tensor when there is no last call; Python
            // says why (none yet, or prune_heads discarded it), as the
            // selecting overload does.
            if (w.dim() == 0) s.attention_weights(std::vector<int64_t>{0}, std::vector<int64_t>{0});
            if (w.dim() == 0) mha::fail("MultiHeadAttention.attention_weights", "no forward call yet: there are no weights to show");
            return hand_to_numpy(std::move(w));
          },
          "(B, num_heads, Q, K) softmax weights of the last call, before dropout.\n"
          "With the fused kernel they are computed on first access (about half the call's\n"
          "attention work) from what the call kept: projected q and k, 2 floats per query.")
      .def(
          "attention_weights_of",
          [](const mha::MultiHeadAttention& s, const py::object& rows, const py::object& heads) {
            auto indices = [](const py::object& o, int64_t n, const char* what) {
              std::vector<int64_t> v;
              if (o.is_none())
                for (int64_t i = 0; i < n; ++i) v.push_back(i);
              else
                v = mha::python::int_list(o, "MultiHeadAttention.attention_weights", what);
              return v;
            };
            const std::vector<int64_t> r = indices(rows, s.last_batch_size(), "batch_rows");
            const std::vector<int64_t> h = indices(heads, s.num_heads(), "heads");
            mha::Tensor out;
            {
              py::gil_scoped_release release;
              out = s.attention_weights(r, h);
            }
            return hand_to_numpy(std::move(out));
          },
          py::arg("batch_rows") = py::none(), py::arg("heads") = py::none(),
          "attention_weights_of(batch_rows=None, heads=None) -> (len(rows), len(heads), Q, K)\n\n"
          "The last call's weights for those batch rows and heads only (None: all), in\n"
          "the order given, computed without forming the others.")
      .def("state_dict", [](const mha::MultiHeadAttention& s) { return to_dict(s.state_dict()); },
           "Parameters by d2l's names ('W_q.weight', ..., weights (out, in)) as float32 arrays.")
      .def("load_state_dict",
           [](mha::MultiHeadAttention& s, const py::object& d) {
             s.load_state_dict(mha::python::to_tensors(d, "MultiHeadAttention.load_state_dict"));
           },
           py::arg("state_dict"),
           "Load parameters by d2l's names; every name must be present, shapes must fit.")
      .def_property("kernel", &mha::MultiHeadAttention::kernel, &mha::MultiHeadAttention::set_kernel,
                    "The attention implementation (mha.Kernel)")
      .def_property(
          "precision", [](const mha::MultiHeadAttention& s) { return std::string(mha::to_string(s.precision())); },
          [](mha::MultiHeadAttention& s, const std::string& p) {
            s.set_precision(mha::parse_precision("MultiHeadAttention.precision", p));
          },
          "'float32' (default) or 'bfloat16' ('bf16'). bfloat16: the projections' products (and their\n"
          "backward) round both inputs to bfloat16 and sum in float32, and q, k, v are rounded to\n"
          "bfloat16; attention itself, parameters, gradients and optimiser steps stay float32.")
      .def_property(
          "rotary",
          [](const mha::MultiHeadAttention& s) -> std::optional<mha::Rotary> {
            const mha::Rotary r = s.rotary();
            return r.enabled() ? std::optional<mha::Rotary>(r) : std::nullopt;
          },
          [](mha::MultiHeadAttention& s, const py::object& r) {
            s.set_rotary(mha::python::to_rotary(r, "MultiHeadAttention.set_rotary", s.head_dim()));
          },
          "Rotary position embeddings on q and k: None/False (default), True (every entry of each head,\n"
          "base 10000, rotate_half pairs), an mha.Rotary or a dict of dims, base, interleaved.")
      .def_property_readonly("num_hiddens", &mha::MultiHeadAttention::num_hiddens)
      .def_property_readonly("num_heads", &mha::MultiHeadAttention::num_heads)
      .def_property_readonly("dropout", &mha::MultiHeadAttention::dropout)
      .def_property_readonly("bias", &mha::MultiHeadAttention::has_bias)
      .def("__repr__", [](const mha::MultiHeadAttention& s) {
        std::string r = py::str("mha.MultiHeadAttention(num_hiddens={}, num_heads={}, dropout={:g}, bias={}")
                            .format(s.num_hiddens(), s.original_num_heads(), s.dropout(), s.has_bias() ? "True" : "False")
                            .cast<std::string>();
        if (s.precision() != mha::Precision::Float32) r += std::string(", precision='") + mha::to_string(s.precision()) + "'";
        if (s.rotary().enabled()) r += ", rotary=" + py::repr(py::cast(s.rotary())).cast<std::string>();
        r += ")";
        if (s.num_heads() < s.original_num_heads())
          r += py::str(" with heads {} kept").format(py::cast(s.kept_heads())).cast<std::string>();
        return r;
      });

  m.def(
      "save_safetensors",
      [](const std::string& path, const py::object& tensors, const std::map<std::string, std::string>& meta) {
        mha::save_safetensors(path, mha::python::to_tensors(tensors, "save_safetensors", "tensors"), meta);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata") = std::map<std::string, std::string>{},
      "Write a dict of arrays (stored as float32) to a safetensors file, atomically.");
  m.def(
      "load_safetensors",
      [](const std::string& path) {
        const mha::SafetensorsFile f = mha::read_safetensors(path);
        py::dict d;
        for (const auto& [name, raw] : f.tensors) d[py::str(name)] = raw_to_numpy(raw, name);
        return d;
      },
      py::arg("path"), "Read every tensor of a safetensors file as numpy arrays (F16/BF16 as float32).");
  mha::python::add_plot_bindings(m);
  m.def("set_memory_limit", &mha::set_memory_limit, py::arg("bytes"),
        "Most bytes one call may allocate (0: the default, the machine's physical memory).\n"
        "A call that would need more raises ValueError before allocating.");
  m.def("memory_limit", &mha::memory_limit, "The current memory limit in bytes.");
  m.def(
      "safetensors_metadata", [](const std::string& path) { return mha::read_safetensors(path).metadata; },
      py::arg("path"), "The __metadata__ of a safetensors file as a dict of strings.");

  mha::python::bind_torch(m);
  mha::python::bind_training(m);
  mha::python::bind_pruning(m);
  mha::python::bind_inspect(m);
  mha::python::bind_decode(m);
  mha::python::bind_contexts(m);
  mha::python::bind_torch_calls(m);
  mha::python::bind_sdpa(m);
  mha::python::bind_attention(m);
  mha::python::bind_ring(m);
  mha::python::bind_caches(m);
  // Last: every function, method and setter above gets the overload that
  // names an argument pybind11 could not convert (python/bindings/convert.h).
  mha::python::add_type_help(m);
}
