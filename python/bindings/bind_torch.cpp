// python/bindings/bind_torch.cpp: the PyTorch drop-in part of mha._core: masks,
// their enums, and TorchMultiheadAttention. Called from module.cpp.
//
// Arrays may be numpy arrays or CPU torch tensors (read through .numpy()).
// A plain boolean array passed as a mask to TorchMultiheadAttention means
// what it means to nn.MultiheadAttention (True = masked out); an mha.Mask
// says its meaning itself.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>

#include "bindings.h"
#include "convert.h"
#include "object_lock.h"
#include "mha/error.h"
#include "mha/masks.h"
#include "mha/torch_mha.h"

namespace py = pybind11;

namespace {

using BoolArray = py::array_t<bool, py::array::c_style | py::array::forcecast>;

using mha::python::as_numpy;
using mha::python::shape_of;
using mha::python::to_numpy;
using mha::python::to_tensor;
using mha::python::hand_to_numpy;
using mha::python::locked;

std::vector<uint8_t> bits_of(const py::array& a) {
  BoolArray b = BoolArray::ensure(a);
  std::vector<uint8_t> bits(static_cast<size_t>(b.size()));
  for (py::ssize_t i = 0; i < b.size(); ++i) bits[static_cast<size_t>(i)] = b.data()[i] ? 1 : 0;
  return bits;
}

// Which boolean convention a plain array follows.
enum class Convention { TorchMha, Sdpa, Keep };

// None, an mha.Mask, or an array: bool (read in `convention`) or floating
// (additive). `uint8_ok`: nn.MultiheadAttention still reads a uint8
// attn_mask as boolean (deprecated); it refuses one for key_padding_mask.
mha::Mask to_mask(const py::object& obj, const char* op, const char* arg, Convention convention,
                  bool uint8_ok) {
  if (obj.is_none()) return {};
  if (py::isinstance<mha::Mask>(obj)) return obj.cast<mha::Mask>();
  py::array a = py::array::ensure(as_numpy(obj));
  if (!a) {
    PyErr_Clear();
    mha::python::fail(mha::python::kType, op, arg, ": cannot be read as an array");
  }
  const char kind = a.dtype().kind();
  if (kind == 'f') return mha::Mask::additive(to_tensor(a, op, arg));
  if (kind == 'b' || (uint8_ok && a.dtype().is(py::dtype::of<uint8_t>()))) {
    switch (convention) {
      case Convention::TorchMha: return mha::mask_from_torch_mha(shape_of(a), bits_of(a));
      case Convention::Sdpa: return mha::mask_from_sdpa(shape_of(a), bits_of(a));
      case Convention::Keep: return mha::Mask::keep(shape_of(a), bits_of(a));
    }
  }
  mha::python::fail(mha::python::kType, op, arg, ": dtype ", std::string(py::str(a.dtype())),
            " is neither bool nor floating (use .astype(bool) for a boolean mask)");
}

// is_causal as nn.MultiheadAttention takes it: a bool (True = TopLeft) or an mha.Causal.
mha::Causal to_causal(const py::object& is_causal, const char* op) {
  if (py::isinstance<mha::Causal>(is_causal)) return is_causal.cast<mha::Causal>();
  if (py::isinstance<py::bool_>(is_causal)) return is_causal.cast<bool>() ? mha::Causal::TopLeft : mha::Causal::None;
  mha::python::fail(mha::python::kType, op, "is_causal: ", std::string(py::str(py::type::of(is_causal))),
                    " is neither a bool nor an mha.Causal");
}

// kdim, vdim, num_kv_heads: None (0 inside: "not given") or a positive
// integer; 0 given is refused rather than read as "not given".
int64_t optional_positive(const py::object& v, const char* name) {
  const char* op = "TorchMultiheadAttention.from_state_dict";
  if (v.is_none()) return 0;
  const bool array = py::hasattr(v, "ndim") && py::hasattr(v, "dtype");  // numpy: only a 0-d integer
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()) ||
      (array && (v.attr("ndim").cast<int>() != 0 || v.attr("dtype").attr("kind").cast<std::string>() == "b")))
    mha::python::fail(mha::python::kType, op, name, ": ", std::string(py::repr(v)),
                      " is not an integer (None: as the state dict says)");
  int64_t n = 0;
  try {
    n = v.cast<int64_t>();
  } catch (const py::cast_error&) {
    mha::fail(op, name, ": ", std::string(py::repr(v)), " is outside the 64-bit integers");
  }
  if (n <= 0) mha::fail(op, name, ": ", n, " is not positive (None: as the state dict says)");
  return n;
}

mha::TorchMhaOptions make_options(bool batch_first, const py::object& kdim, const py::object& vdim,
                                  bool add_zero_attn, const py::object& num_kv_heads, mha::python::Real dropout,
                                  mha::FullyMaskedRows rows, uint64_t seed) {
  mha::TorchMhaOptions o;
  o.batch_first = batch_first;
  o.kdim = optional_positive(kdim, "kdim");
  o.vdim = optional_positive(vdim, "vdim");
  o.add_zero_attn = add_zero_attn;
  o.num_kv_heads = optional_positive(num_kv_heads, "num_kv_heads");
  o.dropout = dropout;
  o.fully_masked_rows = rows;
  o.seed = seed;
  return o;
}

mha::StateDict to_state_dict(const py::handle& d, const char* op) {
  if (!py::isinstance<py::dict>(d))
    mha::python::fail(mha::python::kType, op, "state_dict: ", std::string(py::str(py::type::of(d))), " is not a dict");
  mha::StateDict s;
  for (auto [k, v] : py::reinterpret_borrow<py::dict>(d)) {
    if (!py::isinstance<py::str>(k))
      mha::python::fail(mha::python::kType, op, "state_dict: key ", std::string(py::repr(k)), " is not a string");
    const std::string name = py::cast<std::string>(k);
    s[name] = to_tensor(v, op, "state_dict['" + name + "']");
  }
  return s;
}

const char* kOptionsDoc = R"doc(
    num_heads: heads of the PyTorch module (it must divide embed_dim)
    batch_first: layout of query/key/value/output: (B, L, E) when True,
        (L, B, E) when False (the default, as PyTorch's)
    kdim, vdim: checked against the state dict when given
    add_zero_attn: as the PyTorch module was built (not in the state dict)
    num_kv_heads: grouped-query attention (mha extension); None = num_heads
    dropout: on the attention weights, in training mode only
    fully_masked_rows: mha.FullyMaskedRows.ZEROS (default) or UNIFORM: what a
        row whose every key is masked gets (PyTorch gives NaN)
    seed: of the dropout masks)doc";

// TorchMultiheadAttention's __call__ (with_context: forward_with_context's).
py::object call_torch(mha::TorchMultiheadAttention& self, const py::object& query, const py::object& key, const py::object& value,
            const py::object& key_padding_mask, bool need_weights, const py::object& attn_mask,
            bool average_attn_weights, const py::object& is_causal, const py::object& window, const py::object& softcap,
            const py::object& alibi_slopes, const py::object& sinks, bool with_context) {
  const char* op = "TorchMultiheadAttention.forward";
  // One array passed twice is one tensor, so that the module projects it
  // once (self-attention: one product for the packed in_proj) and it is
  // copied in once, as the chapter module's call does.
  mha::Tensor q = to_tensor(query, op, "query");
  mha::Tensor tk = key.ptr() == query.ptr() ? mha::Tensor() : to_tensor(key, op, "key");
  mha::Tensor tv = value.ptr() == query.ptr() || value.ptr() == key.ptr() ? mha::Tensor() : to_tensor(value, op, "value");
  const mha::Tensor& k = key.ptr() == query.ptr() ? q : tk;
  const mha::Tensor& v = value.ptr() == query.ptr() ? q : value.ptr() == key.ptr() ? k : tv;
  mha::TorchMhaCall call;
  call.key_padding_mask = to_mask(key_padding_mask, op, "key_padding_mask", Convention::TorchMha, false);
  call.attn_mask = to_mask(attn_mask, op, "attn_mask", Convention::TorchMha, true);
  call.need_weights = need_weights;
  call.average_attn_weights = average_attn_weights;
  call.causal = to_causal(is_causal, op);
  call.window = mha::python::to_window(window, op);
  call.scores = mha::python::to_scores(softcap, alibi_slopes, op, sinks);
  call.keep_context = with_context;
  mha::TorchMhaResult r;
  {
    py::gil_scoped_release release;
    r = self.forward(q, k, v, call);
  }
  py::object w = r.weights ? py::object(hand_to_numpy(std::move(*r.weights))) : py::object(py::none());
  if (with_context) return py::make_tuple(hand_to_numpy(std::move(r.output)), w, r.context);
  return py::make_tuple(hand_to_numpy(std::move(r.output)), w);
}

}  // namespace

namespace mha::python {

mha::CallMasks to_call_masks(const py::object& key_padding_mask, const py::object& attn_mask,
                             const py::object& is_causal, const py::object& window, const char* op) {
  mha::CallMasks masks;
  masks.key_padding_mask = to_mask(key_padding_mask, op, "key_padding_mask", Convention::TorchMha, false);
  masks.attn_mask = to_mask(attn_mask, op, "attn_mask", Convention::TorchMha, true);
  masks.causal = to_causal(is_causal, op);
  masks.window = to_window(window, op);
  return masks;
}

py::tuple input_grads(const mha::Tensor& queries, const mha::Tensor& keys, const mha::Tensor& values,
                      const mha::Tensor& sinks) {
  if (sinks.empty()) return py::make_tuple(to_numpy(queries), to_numpy(keys), to_numpy(values));
  return py::make_tuple(to_numpy(queries), to_numpy(keys), to_numpy(values), to_numpy(sinks));
}

mha::ScoreOptions to_scores(const py::object& softcap, const py::object& alibi_slopes, const char* op,
                            const py::object& sinks) {
  mha::ScoreOptions s;
  if (!softcap.is_none()) {
    py::detail::make_caster<Real> cap;
    if (!cap.load(softcap, false))
      fail(kType, op, "softcap: ", std::string(py::repr(softcap)), " is not None or a real number");
    s.softcap = static_cast<float>(py::detail::cast_op<Real>(cap).value);
  }
  if (!alibi_slopes.is_none()) {
    FloatArray a = float_array(alibi_slopes, op, "alibi_slopes");
    if (a.ndim() != 1)
      fail(op, "alibi_slopes: ", a.ndim(), " dimensions; wanted one slope per head, shape (num_heads,)");
    s.alibi_slopes.assign(a.data(), a.data() + a.size());
  }
  if (!sinks.is_none()) {
    FloatArray a = float_array(sinks, op, "sinks");
    if (a.ndim() != 1)
      fail(op, "sinks: ", a.ndim(), " dimensions; wanted one logit per head, shape (num_heads,)");
    s.sinks.assign(a.data(), a.data() + a.size());
  }
  return s;
}

mha::Window to_window(const py::object& window, const char* op) {
  if (window.is_none()) return {};
  const bool pair = (py::isinstance<py::tuple>(window) || py::isinstance<py::list>(window)) && py::len(window) == 2;
  if (!pair || !is_integer(window[py::int_(0)]) || !is_integer(window[py::int_(1)]))
    fail(kType, op, "window: ", std::string(py::repr(window)),
         " is not None or a pair (left, right) of integers (-1: unbounded)");
  return {integer_arg(window[py::int_(0)], op, "window", "an integer"),
          integer_arg(window[py::int_(1)], op, "window", "an integer")};
}

mha::Rotary to_rotary(const py::handle& value, const char* op, int64_t head_dim) {
  mha::Rotary r;
  if (value.is_none() || (py::isinstance<py::bool_>(value) && !value.cast<bool>())) return r;
  if (py::isinstance<py::bool_>(value)) {  // True: every entry of each head, base 10000, rotate_half
    r.dims = head_dim;
  } else if (py::isinstance<mha::Rotary>(value)) {
    r = value.cast<mha::Rotary>();
  } else if (py::isinstance<py::dict>(value)) {  // dims (default: the head width), base, interleaved
    r.dims = head_dim;
    for (const auto& kv : value.cast<py::dict>()) {
      const std::string key = py::isinstance<py::str>(kv.first) ? kv.first.cast<std::string>() : "";
      const py::handle v = kv.second;
      auto integer = [&] { return py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v); };
      if (key == "dims" && (v.is_none() || integer())) {
        if (!v.is_none()) {
          int overflow = 0;
          r.dims = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
          if (overflow != 0)
            fail(op, "rotary dims: ", std::string(py::repr(v)), "; wanted an even number in [0, head_dim = ", head_dim,
                 "] (the rotated entries of each head)");
        }
      } else if (key == "base" && (py::isinstance<py::float_>(v) || integer())) {
        double base = PyFloat_AsDouble(v.ptr());  // an int too large for a double: infinite (refused below)
        if (PyErr_Occurred()) PyErr_Clear(), base = HUGE_VAL;
        r.base = static_cast<float>(base);
      } else if (key == "interleaved" && py::isinstance<py::bool_>(v)) {
        r.layout = v.cast<bool>() ? mha::Rotary::Layout::Interleaved : mha::Rotary::Layout::Half;
      } else {
        fail(kType, op, "rotary: entry ", std::string(py::repr(kv.first)), ": ", std::string(py::repr(v)),
             "; wanted dims (an even integer or None: the head width), base (a number > 1) or interleaved (a bool)");
      }
    }
  } else {
    fail(kType, op, "rotary: ", std::string(py::repr(value)),
         " is not None, a bool, an mha.Rotary or a dict of dims, base and interleaved");
  }
  check_rotary(op, r, head_dim);
  return r;
}

}  // namespace mha::python

void mha::python::bind_torch(py::module_& m) {
  m.def(
      "_to_rotary",
      [](const py::object& rotary, const std::string& op, int64_t head_dim) -> std::optional<mha::Rotary> {
        const mha::Rotary r = to_rotary(rotary, op.c_str(), head_dim);
        return r.enabled() ? std::optional<mha::Rotary>(r) : std::nullopt;
      },
      py::arg("rotary"), py::arg("op"), py::arg("head_dim"),
      "A rotary= argument (None, a bool, an mha.Rotary or a dict) checked against heads of width head_dim "
      "-> mha.Rotary or None (internal: the modules' rotary=)");
  py::enum_<mha::Causal>(m, "Causal", "Causal masking; TOP_LEFT is PyTorch's is_causal=True.")
      .value("NONE", mha::Causal::None)
      .value("TOP_LEFT", mha::Causal::TopLeft, "query i sees keys j <= i")
      .value("BOTTOM_RIGHT", mha::Causal::BottomRight, "query i sees keys j <= i + K - Q");
  py::enum_<mha::FullyMaskedRows>(m, "FullyMaskedRows",
                                  "What a row whose every key is masked gets (never NaN).")
      .value("UNIFORM", mha::FullyMaskedRows::Uniform, "weights 1/K: d2l's -1e6 fill")
      .value("ZEROS", mha::FullyMaskedRows::Zeros, "weights and output 0, as scaled_dot_product_attention");

  py::class_<mha::Mask> mask(m, "Mask", R"doc(
A boolean or additive attention mask with its meaning attached.

Boolean masks are stored in mha's convention: True = the key takes part.
Build one with the function named after the convention of your array:
  mha.mask_from_torch_mha(a)   nn.MultiheadAttention: True = masked out
  mha.mask_from_sdpa(a)        scaled_dot_product_attention: True = takes part
  mha.Mask.keep(a)             mha: True = takes part
  mha.Mask.additive(a)         floats added to the scores (-inf removes a key)
)doc");
  py::enum_<mha::Mask::Kind>(mask, "Kind")
      .value("NONE", mha::Mask::Kind::None)
      .value("KEEP", mha::Mask::Kind::Keep)
      .value("ADDITIVE", mha::Mask::Kind::Additive);
  mask.def_static(
          "keep", [](const py::object& a) { return to_mask(a, "Mask.keep", "keep", Convention::Keep, false); },
          py::arg("keep"), "Boolean mask in mha's convention: True = takes part.")
      .def_static(
          "additive",
          [](const py::object& a) { return mha::Mask::additive(to_tensor(a, "Mask.additive", "bias")); },
          py::arg("bias"), "Additive mask: floats added to the scaled scores; -inf removes a pair.")
      .def_property_readonly("kind", &mha::Mask::kind)
      .def_property_readonly("shape", [](const mha::Mask& s) { return py::tuple(py::cast(s.shape())); })
      .def_property_readonly(
          "values",
          [](const mha::Mask& s) -> py::object {
            if (s.is_keep()) {
              BoolArray out(std::vector<py::ssize_t>(s.shape().begin(), s.shape().end()));
              for (size_t i = 0; i < s.keep_values().size(); ++i) out.mutable_data()[i] = s.keep_values()[i];
              return out;
            }
            if (s.is_additive()) return to_numpy(mha::Tensor(s.shape(), s.bias_values()));
            return py::none();
          },
          "keep mask: bool array (True = takes part); additive: float32 array; none: None")
      .def("__repr__", [](const mha::Mask& s) {
        const char* k = s.is_keep() ? "keep" : s.is_additive() ? "additive" : "none";
        return std::string("mha.Mask(") + k + ", shape " + mha::shape_str(s.shape()) + ")";
      });

  m.def(
      "mask_from_torch_mha",
      [](const py::object& a) {
        return to_mask(a, "mask_from_torch_mha", "mask", Convention::TorchMha, false);
      },
      py::arg("mask"),
      "nn.MultiheadAttention's boolean convention (True = masked out) -> mha.Mask.\n"
      "A floating array becomes an additive mask, as PyTorch reads it.");
  m.def(
      "mask_from_sdpa",
      [](const py::object& a) { return to_mask(a, "mask_from_sdpa", "mask", Convention::Sdpa, false); },
      py::arg("mask"),
      "scaled_dot_product_attention's boolean convention (True = takes part) -> mha.Mask.\n"
      "A floating array becomes an additive mask, as PyTorch reads it.");
  auto bool_array = [](const mha::Mask& s, std::vector<uint8_t> bits) {
    BoolArray out(std::vector<py::ssize_t>(s.shape().begin(), s.shape().end()));
    for (size_t i = 0; i < bits.size(); ++i) out.mutable_data()[i] = bits[i] != 0;
    return out;
  };
  m.def(
      "mask_to_torch_mha", [=](const mha::Mask& s) { return bool_array(s, mha::mask_to_torch_mha(s)); },
      py::arg("mask"), "A boolean mha.Mask as nn.MultiheadAttention reads it (True = masked out).");
  m.def(
      "mask_to_sdpa", [=](const mha::Mask& s) { return bool_array(s, mha::mask_to_sdpa(s)); },
      py::arg("mask"), "A boolean mha.Mask as scaled_dot_product_attention reads it (True = takes part).");

  using TMHA = mha::TorchMultiheadAttention;
  py::class_<TMHA>(m, "TorchMultiheadAttention", R"doc(
torch.nn.MultiheadAttention, built from its state dict.

  attn = mha.TorchMultiheadAttention.from_state_dict(
      {k: v.numpy() for k, v in torch_module.state_dict().items()}, num_heads=8,
      batch_first=torch_module.batch_first)
  attn.eval()
  out, weights = attn(query, key, value, key_padding_mask=None, need_weights=True,
                      attn_mask=None, average_attn_weights=True, is_causal=False)

Shapes as PyTorch's (E embed_dim, h heads, L queries, S keys):
  query (B, L, E) if batch_first else (L, B, E), or unbatched (L, E);
  key (.., S, kdim) and value (.., S, vdim) in the same layout;
  key_padding_mask (B, S) or (S,); attn_mask (L, S) or (B*h, L, S);
  output like query; weights (B, L, S') averaged or (B, h, L, S') per head,
  S' = S (+1 with bias_k/bias_v, +1 with add_zero_attn); None without need_weights.
A boolean mask array means True = masked out (PyTorch's nn.MultiheadAttention
convention); a floating one is added to the scores; an mha.Mask carries its own
meaning. is_causal=True applies torch.ones(L, S).tril() (mha.Causal.TOP_LEFT)
and always combines with attn_mask; is_causal may also be an mha.Causal.
window=(left, right) (keyword) is a sliding window as FlashAttention's
window_size, aligned to the bottom right: query i sees key j iff
i + S - L - left <= j <= i + S - L + right, -1 unbounded; it combines with
every mask. softcap=c (keyword, > 0) caps each scaled score s to c*tanh(s/c)
(Gemma 2) and alibi_slopes (keyword, one per head) subtracts
slope[h]*|i + S - L - j| (ALiBi), both before the masks (FlashAttention's
softcap and alibi_slopes). Rows with every key masked get fully_masked_rows, never NaN.
)doc")
      .def_static(
          "from_state_dict",
          [](const py::object& state, int64_t num_heads, bool batch_first, const py::object& kdim,
             const py::object& vdim, bool add_zero_attn, const py::object& num_kv_heads, mha::python::Real dropout,
             mha::FullyMaskedRows rows, uint64_t seed) {
            const char* op = "TorchMultiheadAttention.from_state_dict";
            return TMHA::from_state_dict(
                to_state_dict(state, op), num_heads,
                make_options(batch_first, kdim, vdim, add_zero_attn, num_kv_heads, dropout, rows, seed));
          },
          py::arg("state_dict"), py::arg("num_heads"), py::arg("batch_first").noconvert() = false,
          py::arg("kdim") = py::none(), py::arg("vdim") = py::none(), py::arg("add_zero_attn").noconvert() = false,
          py::arg("num_kv_heads") = py::none(), py::arg("dropout") = 0.0f,
          py::arg("fully_masked_rows") = mha::FullyMaskedRows::Zeros, py::arg("seed") = 0,
          (std::string("From a dict of arrays (or tensors) by PyTorch's names.\n") + kOptionsDoc).c_str())
      .def_static(
          "from_safetensors",
          [](const std::string& path, int64_t num_heads, bool batch_first, const py::object& kdim,
             const py::object& vdim, bool add_zero_attn, const py::object& num_kv_heads, mha::python::Real dropout,
             mha::FullyMaskedRows rows, uint64_t seed) {
            return TMHA::from_safetensors(
                path, num_heads,
                make_options(batch_first, kdim, vdim, add_zero_attn, num_kv_heads, dropout, rows, seed));
          },
          py::arg("path"), py::arg("num_heads"), py::arg("batch_first").noconvert() = false,
          py::arg("kdim") = py::none(), py::arg("vdim") = py::none(), py::arg("add_zero_attn").noconvert() = false,
          py::arg("num_kv_heads") = py::none(), py::arg("dropout") = 0.0f,
          py::arg("fully_masked_rows") = mha::FullyMaskedRows::Zeros, py::arg("seed") = 0,
          (std::string("From a safetensors file of F32 tensors by PyTorch's names.\n") + kOptionsDoc).c_str())
      .def(
          "__call__",
          [](TMHA& self, const py::object& query, const py::object& key, const py::object& value,
             const py::object& kpm, bool need_weights, const py::object& attn_mask, bool average, const py::object& is_causal,
             const py::object& window, const py::object& softcap, const py::object& alibi_slopes,
             const py::object& sinks) {
            return call_torch(self, query, key, value, kpm, need_weights, attn_mask, average, is_causal, window, softcap,
                              alibi_slopes, sinks, false);
          },
          py::arg("query"), py::arg("key"), py::arg("value"), py::arg("key_padding_mask") = py::none(),
          py::arg("need_weights").noconvert() = true, py::arg("attn_mask") = py::none(),
          py::arg("average_attn_weights").noconvert() = true, py::arg("is_causal") = false, py::kw_only(),
          py::arg("window") = py::none(), py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(),
          py::arg("sinks") = py::none(),
          "(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,\n"
          " average_attn_weights=True, is_causal=False, *, window=None, softcap=None, alibi_slopes=None,\n"
          " sinks=None)\n"
          " -> (output, weights or None)")
      .def(
          "forward_with_context",
          [](TMHA& self, const py::object& query, const py::object& key, const py::object& value,
             const py::object& kpm, bool need_weights, const py::object& attn_mask, bool average, const py::object& is_causal,
             const py::object& window, const py::object& softcap, const py::object& alibi_slopes,
             const py::object& sinks) {
            return call_torch(self, query, key, value, kpm, need_weights, attn_mask, average, is_causal, window, softcap,
                              alibi_slopes, sinks, true);
          },
          py::arg("query"), py::arg("key"), py::arg("value"), py::arg("key_padding_mask") = py::none(),
          py::arg("need_weights").noconvert() = true, py::arg("attn_mask") = py::none(),
          py::arg("average_attn_weights").noconvert() = true, py::arg("is_causal") = false, py::kw_only(),
          py::arg("window") = py::none(), py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(),
          py::arg("sinks") = py::none(),
          "The same call, returning (output, weights or None, context): the call's mha.ForwardContext,\n"
          "from which its weights and (training mode) its backward come.")
      .def("state_dict", [](const TMHA& s) {
             py::dict d;
             for (const auto& [k, v] : s.state_dict()) d[py::str(k)] = to_numpy(v);
             return d;
           }, "Parameters by PyTorch's names, as float32 arrays.")
      .def("train", [](TMHA& s, bool on) -> TMHA& { s.train(on); return s; }, py::arg("mode").noconvert() = true,
           py::return_value_policy::reference, "Training mode (dropout on); returns self.")
      .def("eval", [](TMHA& s) -> TMHA& { s.eval(); return s; }, py::return_value_policy::reference,
           "Evaluation mode (dropout off); returns self.")
      .def_property_readonly("training", &TMHA::training)
      .def_property("kernel", &TMHA::kernel, &TMHA::set_kernel, "The attention implementation (mha.Kernel)")
      .def_property(
          "rotary",
          [](const TMHA& s) -> std::optional<mha::Rotary> {
            return s.rotary().enabled() ? std::optional<mha::Rotary>(s.rotary()) : std::nullopt;
          },
          [](TMHA& s, const py::object& r) { s.set_rotary(to_rotary(r, "TorchMultiheadAttention.set_rotary", s.head_dim())); },
          "Rotary position embeddings on q and k: None/False (default), True (every entry of each head,\n"
          "base 10000, rotate_half pairs), an mha.Rotary or a dict of dims, base, interleaved; the appended bias_k\n"
          "and zero key rows are not rotated.")
      .def_property(
          "precision", [](const TMHA& s) { return std::string(mha::to_string(s.precision())); },
          [](TMHA& s, const std::string& p) {
            s.set_precision(mha::parse_precision("TorchMultiheadAttention.precision", p));
          },
          "'float32' (default) or 'bfloat16' ('bf16'). bfloat16: the projections' products (and their\n"
          "backward) round both inputs to bfloat16 and sum in float32, and q, k, v are rounded to\n"
          "bfloat16; attention itself, parameters, gradients and optimiser steps stay float32.")
      .def_property("fully_masked_rows", &TMHA::fully_masked_rows, &TMHA::set_fully_masked_rows)
      .def_property_readonly("embed_dim", &TMHA::embed_dim)
      .def_property_readonly("num_heads", &TMHA::num_heads)
      .def_property_readonly("num_kv_heads", &TMHA::num_kv_heads)
      .def_property_readonly("kdim", &TMHA::kdim)
      .def_property_readonly("vdim", &TMHA::vdim)
      .def_property_readonly("batch_first", &TMHA::batch_first)
      .def_property_readonly("add_zero_attn", &TMHA::add_zero_attn)
      .def_property_readonly("bias", &TMHA::has_bias)
      .def_property_readonly("bias_kv", &TMHA::has_bias_kv)
      .def_property_readonly("dropout", &TMHA::dropout)
      .def("__repr__",
           [](const TMHA& s) {
             return py::str("mha.TorchMultiheadAttention(embed_dim={}, num_heads={}, num_kv_heads={}, kdim={}, vdim={}, "
                            "bias={}, add_bias_kv={}, add_zero_attn={}, dropout={:g}, batch_first={})")
                 .format(s.embed_dim(), s.num_heads(), s.num_kv_heads(), s.kdim(), s.vdim(), s.has_bias() ? "True" : "False",
                         s.has_bias_kv() ? "True" : "False", s.add_zero_attn() ? "True" : "False", s.dropout(),
                         s.batch_first() ? "True" : "False")
                 .cast<std::string>();
           })
      .def(
          "backward",
          [](TMHA& self, const py::object& grad_output) {
            const mha::Tensor g = to_tensor(grad_output, "TorchMultiheadAttention.backward", "grad_output");
            TMHA::InputGrads grads;
            auto accumulated = locked(&self, [&] {
              grads = self.backward(g);
              return self.grads();
            });
            py::dict params;
            for (auto& [k, v] : accumulated) params[py::str(k)] = hand_to_numpy(std::move(v));
            return py::make_tuple(input_grads(grads.query, grads.key, grads.value, grads.sinks), params);
          },
          py::arg("grad_output"),
          "backward(grad_output) -> ((grad_query, grad_key, grad_value), param_grads)\n\n"
          "After a training-mode call: grad_output shaped like that call's output; the\n"
          "gradients of its query, key and value, shaped as they were given (and of its\n"
          "sinks (num_heads,) as a fourth entry when the call took sinks=). The\n"
          "parameters' gradients are added to the accumulated ones (until zero_grad());\n"
          "param_grads is their dict by PyTorch's names, shaped like state_dict().\n"
          "The call's masks, policy and dropout mask are reused; never NaN.")
      .def("zero_grad", [](TMHA& s) { locked(&s, [&] { s.zero_grad(); }); }, "Set every accumulated gradient to zero.")
      .def("grads", [](TMHA& s) {
             py::dict d;
             for (auto& [k, v] : locked(&s, [&] { return s.grads(); })) d[py::str(k)] = hand_to_numpy(std::move(v));
             return d;
           }, "The accumulated parameter gradients by PyTorch's names (like state_dict()).")
      .def_property_readonly(
          "last_dropout_mask", [](const TMHA& s) { return to_numpy(s.last_dropout_mask()); },
          "(B, num_heads, L, S') dropout multipliers of the last training-mode call:\n"
          "0 or 1/(1-p), all 1 without dropout (batch-major, whatever the layout)");
}
