// python/bindings/sdpa_calls.cpp: scaled dot-product attention on mha's kernels, for
// mha.torch.scaled_dot_product_attention and the Hugging Face backend
// (python/mha/torch_sdpa.py, python/mha/hf.py, through the operators of
// python/mha/_torch_ops.py), which check and shape every argument first
// (PyTorch 2.x's semantics).
//
//   q:[B,H,L,E] k:[B,Hkv,S,E] v:[B,Hkv,S,Ev] (float32, C-contiguous; Hkv divides H)
//   options = (mask, causal, scale, softcap, sinks, dropout_p, dropout_key):
//     mask: None, or [b,h,L,S] with b in {1,B}, h in {1,H}: bool (True = takes
//           part) or float32 (added to the scaled scores)
//     causal: top-left (query i sees keys j <= i); scale: multiplies q k^T;
//     softcap: 0 or > 0 (s -> softcap * tanh(s / softcap)); sinks: None or [H]
//   forward(q, k, v, options) -> (out [B,H,L,Ev], stats [2, B*H*L] or None)
//   backward(grad_out, q, k, v, out, stats, options) -> (grad_q, grad_k, grad_v, grad_sinks or None)
//
// The kernels (kernels/dispatch.h) take exactly this: grouped heads, a pair
// mask with broadcast strides, top-left causal masking, the scale as a
// divisor, counter-based dropout; masked scores are -inf and a row with no
// key left gets zeros (PyTorch >= 2.5's math path), never NaN.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "attention_glue.h"
#include "bindings.h"
#include "convert.h"
#include "kernels/dispatch.h"
#include "mha/error.h"

namespace py = pybind11;

namespace mha::python {

namespace {

constexpr const char* kOp = "mha.torch.scaled_dot_product_attention";

// One call's inputs, read in place, and its kernel parameters (without out).
struct SdpaCall {
  FloatArray in[3];  // q [B,H,L,E], k [B,Hkv,S,E], v [B,Hkv,S,Ev]
  py::array mask;    // held: the parameters point into it
  FloatArray sinks;  // [H] or empty
  kernels::AttentionForward p;

  SdpaCall(const py::handle& q, const py::handle& k, const py::handle& v, const py::tuple& options) {
    const char* names[] = {"query", "key", "value"};
    const py::handle arrays[] = {q, k, v};
    for (int x = 0; x < 3; ++x) in[x] = attention_glue::float_input(arrays[x], 4, kOp, names[x]);
    p.q = attention_glue::array_view_any(in[0]);
    p.k = attention_glue::array_view_any(in[1]);
    p.v = attention_glue::array_view_any(in[2]);
    if (options.size() != 7) fail(kOp, "options: ", options.size(), " entries; wanted 7");
    const int64_t B = p.q.size(0), H = p.q.size(1), L = p.q.size(2), S = p.k.size(2);
    kernels::MaskOptions& m = p.masks;
    if (!options[0].is_none()) {
      py::array a = py::array::ensure(options[0]);
      if (!a || a.ndim() != 4) {
        PyErr_Clear();
        fail(kOp, "attn_mask: not a 4-D array");
      }
      const int64_t b = a.shape(0), h = a.shape(1);
      if ((b != 1 && b != B) || (h != 1 && h != H) || a.shape(2) != L || a.shape(3) != S)
        fail(kOp, "attn_mask: shape ", shape_str(shape_of(a)), " does not fit (", B, ", ", H, ", ", L, ", ", S, ")");
      if (a.dtype().kind() == 'b') {
        // numpy's bool is one byte of 0 or 1: the kernels' keep mask as it is.
        mask = py::array::ensure(a, py::array::c_style);
        m.pair_keep = static_cast<const uint8_t*>(mask.data());
      } else {
        mask = attention_glue::float_input(a, 4, kOp, "attn_mask");
        m.pair_bias = static_cast<const float*>(mask.data());
      }
      m.pair_stride_h = h == 1 ? 0 : L * S;
      m.pair_stride_b = b == 1 ? 0 : h * L * S;
    }
    m.causal = options[1].cast<bool>() ? Causal::TopLeft : Causal::None;
    p.scale_divisor = 1.0f / options[2].cast<float>();
    m.softcap = options[3].cast<float>();
    sinks = attention_glue::optional_floats(py::reinterpret_borrow<py::object>(options[4]), H, kOp, "sinks");
    m.sinks = attention_glue::data_or_null(sinks);
    const float dropout_p = options[5].cast<float>();
    if (dropout_p > 0.0f) p.dropout = {dropout_p, options[6].cast<uint64_t>()};
    m.fill = kernels::MaskFill::NegInf;
    m.fully_masked = FullyMaskedRows::Zeros;
  }

  int64_t rows() const { return p.q.size(0) * p.q.size(1) * p.q.size(2); }
};

}  // namespace

void bind_sdpa(py::module_& core) {
  py::module_ m = core.def_submodule("_sdpa_calls", "mha.torch.scaled_dot_product_attention's calls (internal)");

  m.def(
      "forward",
      [](const py::array& q, const py::array& k, const py::array& v, const py::tuple& options) {
        SdpaCall c(q, k, v, options);
        Tensor out({c.p.q.size(0), c.p.q.size(1), c.p.q.size(2), c.p.v.size(3)});
        c.p.out = out.view();
        py::object stats = attention_glue::forward_with_stats(c.p, c.rows(), c.p.k.size(2));
        return py::make_tuple(hand_to_numpy(std::move(out)), stats);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("options"), "-> (out [B,H,L,Ev], stats [2,B*H*L] or None)");

  m.def(
      "backward",
      [](const py::array& grad_out, const py::array& q, const py::array& k, const py::array& v, const py::array& out,
         const py::object& stats, const py::tuple& options) {
        SdpaCall c(q, k, v, options);
        const Shape out_shape{c.p.q.size(0), c.p.q.size(1), c.p.q.size(2), c.p.v.size(3)};
        attention_glue::BackwardBuffers b(kOp, grad_out, out, out_shape, c.in, c.sinks);
        kernels::AttentionBackward p;
        p.fwd = c.p;
        p.fwd.out = attention_glue::array_view_any(b.out);
        p.grad_out = attention_glue::array_view_any(b.grad_out);
        p.grad_q = b.grad_q.view();
        p.grad_k = b.grad_k.view();
        p.grad_v = b.grad_v.view();
        p.grad_sinks = b.sinks_grad();
        attention_glue::backward_with_stats(p, stats, c.rows(), kOp);
        return b.result();
      },
      py::arg("grad_output"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("stats"),
      py::arg("options"), "-> (grad_q, grad_k, grad_v, grad_sinks or None)");
}

}  // namespace mha::python
