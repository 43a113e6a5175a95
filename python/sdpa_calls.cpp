// python/sdpa_calls.cpp: scaled dot-product attention on mha's kernels, for
// mha.torch.scaled_dot_product_attention (python/mha/torch_sdpa.py), which
// checks and shapes every argument first (PyTorch 2.x's semantics).
//
//   q:[B,H,L,E] k:[B,Hkv,S,E] v:[B,Hkv,S,Ev] (float32, C-contiguous; Hkv divides H)
//   mask: none, or [b,h,L,S] with b in {1,B}, h in {1,H}: bool (1 = takes part) or additive
//   -> out:[B,H,L,Ev], and a context from which the backward runs
//
// The kernels (kernels/dispatch.h) take exactly this: grouped heads, a pair
// mask with broadcast strides, top-left causal masking, the scale as a
// divisor, counter-based dropout; masked scores are -inf and a row with no
// key left gets zeros (PyTorch >= 2.5's math path), never NaN.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
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

// What one call keeps for its backward.
struct SdpaContext {
  // The caller's q [B,H,L,E], k [B,Hkv,S,E], v [B,Hkv,S,Ev] and the output
  // [B,H,L,Ev], read in place (attention_glue.h forward_result: why).
  FloatArray in[3];
  py::array_t<float> out_array;
  TensorView qv, kv, vv, outv;
  std::vector<float> stats;  // [2,B,H,L] of the fused forward, or empty
  std::vector<uint8_t> keep;  // the pair mask, bool ...
  std::vector<float> bias;    // ... or additive
  int64_t stride_b = 0, stride_h = 0;
  Causal causal = Causal::None;
  float scale_divisor = 1.0f;
  kernels::Dropout dropout;

  kernels::AttentionForward params() {
    kernels::AttentionForward p;
    p.q = qv;
    p.k = kv;
    p.v = vv;
    p.scale_divisor = scale_divisor;
    p.dropout = dropout;
    p.masks.pair_keep = keep.empty() ? nullptr : keep.data();
    p.masks.pair_bias = bias.empty() ? nullptr : bias.data();
    p.masks.pair_stride_b = stride_b;
    p.masks.pair_stride_h = stride_h;
    p.masks.causal = causal;
    p.masks.fill = kernels::MaskFill::NegInf;
    p.masks.fully_masked = FullyMaskedRows::Zeros;
    return p;
  }
};


}  // namespace

void bind_sdpa(py::module_& core) {
  py::module_ m = core.def_submodule("_sdpa_calls", "mha.torch.scaled_dot_product_attention's calls (internal)");
  py::class_<SdpaContext, std::shared_ptr<SdpaContext>>(m, "_SdpaContext", "What one call keeps for its backward.");

  m.def(
      "forward",
      [](const py::array& q, const py::array& k, const py::array& v, const py::object& mask, int64_t stride_b,
         int64_t stride_h, bool causal, float scale, float dropout_p, uint64_t dropout_key, bool keep) {
        auto c = std::make_shared<SdpaContext>();
        attention_glue::hold_qkv(*c, q, k, v, {"query", "key", "value"}, kOp,
                                 [](const FloatArray& a) { return attention_glue::array_view_any(a); });
        if (!mask.is_none()) {
          py::array a = py::array::ensure(mask);
          if (a.dtype().kind() == 'b') {
            py::array_t<uint8_t, py::array::c_style | py::array::forcecast> b(a);
            c->keep.assign(b.data(), b.data() + b.size());
          } else {
            FloatArray f = FloatArray::ensure(a);
            c->bias.assign(f.data(), f.data() + f.size());
          }
        }
        c->stride_b = stride_b, c->stride_h = stride_h;
        c->causal = causal ? Causal::TopLeft : Causal::None;
        c->scale_divisor = 1.0f / scale;
        if (dropout_p > 0.0f) c->dropout = {dropout_p, dropout_key};
        const int64_t B = c->qv.size(0), H = c->qv.size(1), L = c->qv.size(2), Ev = c->vv.size(3);
        Tensor out;
        {
          py::gil_scoped_release release;
          out = Tensor({B, H, L, Ev});
          kernels::AttentionForward p = c->params();
          p.out = out.view();
          attention_glue::forward_keeping_stats(p, B * H * L, c->kv.size(2), keep, c->stats);
        }
        return attention_glue::forward_result(out, c, keep);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("stride_b"), py::arg("stride_h"),
      py::arg("causal"), py::arg("scale"), py::arg("dropout_p"), py::arg("dropout_key"), py::arg("keep"),
      "-> (out [B,H,L,Ev], context or None)");

  m.def(
      "backward",
      [](const std::shared_ptr<SdpaContext>& c, const py::array& grad_out) {
        const FloatArray g = attention_glue::grad_array(kOp, grad_out, c->out_array);
        Tensor gq(shape_of(c->in[0])), gk(shape_of(c->in[1])), gv(shape_of(c->in[2]));
        {
          py::gil_scoped_release release;
          kernels::AttentionBackward p;
          p.fwd = c->params();
          p.fwd.out = c->outv;
          p.grad_out = attention_glue::array_view_any(g);
          p.grad_q = gq.view();
          p.grad_k = gk.view();
          p.grad_v = gv.view();
          attention_glue::backward_from_stats(p, c->stats);
        }
        return py::make_tuple(hand_to_numpy(std::move(gq)), hand_to_numpy(std::move(gk)), hand_to_numpy(std::move(gv)));
      },
      py::arg("context"), py::arg("grad_output"), "-> (grad_q, grad_k, grad_v)");
}

}  // namespace mha::python
