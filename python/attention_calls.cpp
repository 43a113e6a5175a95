// python/attention_calls.cpp: FlashAttention-style attention on mha's
// kernels, for mha.torch.attention (python/mha/torch_attention.py), which
// checks and shapes every argument first (flash_attn_func's conventions).
//
//   q:(B,L,H,d) k:(B,S,Hkv,d) v:(B,S,Hkv,dv) (float32, C-contiguous; Hkv divides H)
//   -> out:(B,L,H,dv), and a context from which the backward runs
//
// The layout is FlashAttention's (rows, then heads): the kernels read it as
// strided [B,H,L,d] views, so nothing is transposed. A packed batch is B = 1
// with doc_offsets (cu_seqlens) cutting its L = S rows into documents. The
// masks are FlashAttention's: the window and causal limit aligned to the
// bottom right, masked scores -inf, and a query with no key gets zeros.
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

constexpr const char* kOp = "mha.torch.attention";

// What one call keeps for its backward.
struct AttentionContext {
  // The caller's q (B, L, H, d), k (B, S, Hkv, d), v (B, S, Hkv, dv) and the
  // output (B, L, H*dv), read in place (attention_glue.h forward_result:
  // why); the kernels' (B, L, heads*width) views of them.
  FloatArray in[3];
  py::array_t<float> out_array;
  TensorView qv, kv, vv, outv;
  int64_t H = 1, Hkv = 1;
  std::vector<float> stats;    // [2,B,H,L] of the fused forward, or empty
  std::vector<float> alibi, sinks;     // [H] or empty
  std::vector<int64_t> doc_offsets;    // [documents + 1] or empty
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  float scale_divisor = 1.0f;
  kernels::Dropout dropout;

  kernels::AttentionForward params() {
    kernels::AttentionForward p;
    p.q = qv.split_heads(H);
    p.k = kv.split_heads(Hkv);
    p.v = vv.split_heads(Hkv);
    p.scale_divisor = scale_divisor;
    p.dropout = dropout;
    kernels::MaskOptions& m = p.masks;
    m.causal = causal ? Causal::BottomRight : Causal::None;
    m.window_left = window_left;
    m.window_right = window_right;
    m.softcap = softcap;
    m.alibi_slopes = alibi.empty() ? nullptr : alibi.data();
    m.sinks = sinks.empty() ? nullptr : sinks.data();
    if (!doc_offsets.empty()) {
      m.doc_offsets = doc_offsets.data();
      m.documents = static_cast<int64_t>(doc_offsets.size()) - 1;
    }
    m.fill = kernels::MaskFill::NegInf;
    m.fully_masked = FullyMaskedRows::Zeros;
    return p;
  }
};


std::vector<float> floats_of(const py::object& o) {
  if (o.is_none()) return {};
  FloatArray f = FloatArray::ensure(o);
  return std::vector<float>(f.data(), f.data() + f.size());
}

}  // namespace

void bind_attention(py::module_& core) {
  py::module_ m = core.def_submodule("_attention_calls", "mha.torch.attention's calls (internal)");
  py::class_<AttentionContext, std::shared_ptr<AttentionContext>>(m, "_AttentionContext",
                                                                  "What one call keeps for its backward.");

  m.def(
      "forward",
      [](const py::array& q, const py::array& k, const py::array& v, bool causal, int64_t window_left,
         int64_t window_right, float softcap, const py::object& alibi, const py::object& sinks,
         const py::object& doc_offsets, float scale, float dropout_p, uint64_t dropout_key, bool keep) {
        auto c = std::make_shared<AttentionContext>();
        c->H = q.ndim() == 4 ? q.shape(2) : 1;
        c->Hkv = k.ndim() == 4 ? k.shape(2) : 1;
        attention_glue::hold_qkv(*c, q, k, v, {"q", "k", "v"}, kOp,
                                 [](const FloatArray& a) { return attention_glue::rows_view(a); });
        const int64_t dv = v.shape(3);
        c->causal = causal;
        c->window_left = window_left, c->window_right = window_right;
        c->softcap = softcap;
        c->alibi = floats_of(alibi);
        c->sinks = floats_of(sinks);
        if (!doc_offsets.is_none()) {
          py::array_t<int64_t, py::array::c_style | py::array::forcecast> o(doc_offsets);
          c->doc_offsets.assign(o.data(), o.data() + o.size());
        }
        c->scale_divisor = 1.0f / scale;
        if (dropout_p > 0.0f) c->dropout = {dropout_p, dropout_key};
        const int64_t B = c->qv.size(0), L = c->qv.size(1), H = c->H;
        Tensor out;
        {
          py::gil_scoped_release release;
          out = Tensor({B, L, H * dv});
          kernels::AttentionForward p = c->params();
          p.out = out.view().split_heads(H);
          attention_glue::forward_keeping_stats(p, B * H * L, c->kv.size(1), keep, c->stats);
        }
        return attention_glue::forward_result(out, c, keep);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("window_left"), py::arg("window_right"),
      py::arg("softcap"), py::arg("alibi_slopes"), py::arg("sinks"), py::arg("doc_offsets"), py::arg("scale"),
      py::arg("dropout_p"), py::arg("dropout_key"), py::arg("keep"), "-> (out (B,L,H*dv), context or None)");

  m.def(
      "backward",
      [](const std::shared_ptr<AttentionContext>& c, const py::array& grad_out) {
        const FloatArray g = FloatArray::ensure(grad_out);
        if (!g || g.ndim() != 4) {
          PyErr_Clear();
          fail(kOp, "grad_output: not a 4-D float32 array");
        }
        const TensorView gview = attention_glue::rows_view(g);
        if (gview.shape[0] != c->outv.shape[0] || gview.shape[1] != c->outv.shape[1] ||
            gview.shape[2] != c->outv.shape[2])
          fail(kOp, "grad_output: shape ", shape_str(shape_of(g)), " does not fit the output's ",
               shape_str(shape_of(c->out_array)));
        Tensor gq(Shape{c->qv.shape[0], c->qv.shape[1], c->qv.shape[2]}),
            gk(Shape{c->kv.shape[0], c->kv.shape[1], c->kv.shape[2]}),
            gv(Shape{c->vv.shape[0], c->vv.shape[1], c->vv.shape[2]});
        std::vector<float> gs(c->sinks.size());
        {
          py::gil_scoped_release release;
          kernels::AttentionBackward p;
          p.fwd = c->params();
          p.fwd.out = c->outv.split_heads(c->H);
          p.grad_out = gview.split_heads(c->H);
          p.grad_q = gq.view().split_heads(c->H);
          p.grad_k = gk.view().split_heads(c->Hkv);
          p.grad_v = gv.view().split_heads(c->Hkv);
          p.grad_sinks = gs.empty() ? nullptr : gs.data();
          attention_glue::backward_from_stats(p, c->stats);
        }
        py::object sinks = gs.empty() ? py::object(py::none()) : py::object(py::array_t<float>(
                                                                      static_cast<py::ssize_t>(gs.size()), gs.data()));
        return py::make_tuple(hand_to_numpy(std::move(gq)), hand_to_numpy(std::move(gk)),
                              hand_to_numpy(std::move(gv)), sinks);
      },
      py::arg("context"), py::arg("grad_output"), "-> (grad_q, grad_k, grad_v (rows, heads*width), grad_sinks or None)");
}

}  // namespace mha::python
