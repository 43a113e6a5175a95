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
  Tensor q, k, v, out;       // [B,H,L,E], [B,Hkv,S,E], [B,Hkv,S,Ev], [B,H,L,Ev]
  TensorView qv, kv, vv;     // q, k, v's views, or the inputs' own memory when nothing is kept
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

Tensor tensor_of(const py::array& a, const char* what) { return attention_glue::copy_floats(a, kOp, what); }

}  // namespace

void bind_sdpa(py::module_& core) {
  py::module_ m = core.def_submodule("_sdpa_calls", "mha.torch.scaled_dot_product_attention's calls (internal)");
  py::class_<SdpaContext, std::shared_ptr<SdpaContext>>(m, "_SdpaContext", "What one call keeps for its backward.");

  m.def(
      "forward",
      [](const py::array& q, const py::array& k, const py::array& v, const py::object& mask, int64_t stride_b,
         int64_t stride_h, bool causal, float scale, float dropout_p, uint64_t dropout_key, bool keep) {
        auto c = std::make_shared<SdpaContext>();
        FloatArray in[3];  // without keep: read in place (alive until the call returns)
        if (keep) {
          c->q = tensor_of(q, "query");
          c->k = tensor_of(k, "key");
          c->v = tensor_of(v, "value");
          c->qv = c->q.view(), c->kv = c->k.view(), c->vv = c->v.view();
        } else {
          // Copies here would be fresh allocations that glibc hands back
          // after the call and the next call faults in again (measured B8
          // h12 L512 d64, no grad: 160 ms a call with them, the kernel's
          // ~40 ms without; attention_glue.h rows_view).
          const py::array* arrays[] = {&q, &k, &v};
          const char* names[] = {"query", "key", "value"};
          for (int x = 0; x < 3; ++x) {
            in[x] = FloatArray::ensure(*arrays[x]);
            if (!in[x] || in[x].ndim() != 4) {
              PyErr_Clear();
              fail(kOp, names[x], ": not a 4-D float32 array");
            }
          }
          c->qv = attention_glue::array_view(in[0]);
          c->kv = attention_glue::array_view(in[1]);
          c->vv = attention_glue::array_view(in[2]);
        }
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
        {
          py::gil_scoped_release release;
          c->out = Tensor({B, H, L, Ev});
          kernels::AttentionForward p = c->params();
          p.out = c->out.view();
          attention_glue::forward_keeping_stats(p, B * H * L, c->kv.size(2), keep, c->stats);
        }
        return attention_glue::forward_result(c->out, c, keep);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("stride_b"), py::arg("stride_h"),
      py::arg("causal"), py::arg("scale"), py::arg("dropout_p"), py::arg("dropout_key"), py::arg("keep"),
      "-> (out [B,H,L,Ev], context or None)");

  m.def(
      "backward",
      [](const std::shared_ptr<SdpaContext>& c, const py::array& grad_out) {
        Tensor g = tensor_of(grad_out, "grad_output");
        attention_glue::check_grad_shape(kOp, g, c->out);
        Tensor gq(c->q.shape()), gk(c->k.shape()), gv(c->v.shape());
        {
          py::gil_scoped_release release;
          kernels::AttentionBackward p;
          p.fwd = c->params();
          p.fwd.out = c->out.view();
          p.grad_out = g.view();
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
