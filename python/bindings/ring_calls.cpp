// python/bindings/ring_calls.cpp: the compute of mha.torch.distributed's ring
// (python/mha/torch_ring.py) on mha's fused kernel: one rank's query rows
// over key/value blocks that Python passes round the ring with
// torch.distributed (nn/ring_rows.h). Internal: the Python side checks
// every argument and keeps the arrays alive while a call reads them.
//
//   q, out, grad_out: (B, Q_r, H*d) float32 C-contiguous
//   k, v, dk, dv:     (B, K_b, H*d) float32 C-contiguous
//   pieces: [(global begin, size), ...] of the rows, in order
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "nn/ring_rows.h"
#include "mha/error.h"

namespace py = pybind11;

namespace mha::python {

namespace {

constexpr const char* kOp = "mha.torch.distributed ring";

using Floats = py::array_t<float, py::array::c_style>;
using PieceList = std::vector<std::pair<int64_t, int64_t>>;

std::vector<nn::Piece> pieces_of(const PieceList& list) {
  std::vector<nn::Piece> out;
  for (const auto& [begin, size] : list) out.push_back({begin, size});
  return out;
}

const float* floats(const Floats& a, int64_t want, const char* what) {
  if (a.size() != want) fail(kOp, what, ": ", a.size(), " floats; wanted ", want);
  return a.data();
}

// The ring's options, by keyword (the Python side checked them; every
// option a call leaves out keeps its default):
//   lens (B,) float32, causal bool (top left), key_keep (B, K) uint8,
//   window (left, right), softcap float, alibi_slopes and sinks (one per
//   head of the module), doc_offsets [documents + 1], seed_fill bool (the
//   chapter's -1e6; else -inf), zeros bool (fully masked rows get zeros),
//   dropout_p, dropout_key, bfloat16 bool, first_head, all_heads.
nn::RingRowsSpec ring_spec(int64_t B, int64_t H, int64_t d, int64_t Q, int64_t K, const PieceList& q_pieces,
                           const py::kwargs& options) {
  nn::RingRowsSpec s;
  s.B = B, s.H = H, s.d = d, s.Q = Q, s.K = K;
  s.q_pieces = pieces_of(q_pieces);
  s.scale_divisor = std::sqrt(static_cast<float>(d));
  float dropout_p = 0.0f;
  uint64_t dropout_key = 0;
  for (const auto& [key, value] : options) {
    const std::string name = py::str(key);
    if (value.is_none()) continue;
    if (name == "lens") {
      Floats l(py::reinterpret_borrow<py::object>(value));
      s.lens = ValidLens::per_batch(std::vector<float>(floats(l, B, "lens"), l.data() + B));
    } else if (name == "causal") {
      s.masks.causal = value.cast<bool>() ? Causal::TopLeft : Causal::None;
    } else if (name == "key_keep") {
      py::array_t<uint8_t, py::array::c_style | py::array::forcecast> keep(py::reinterpret_borrow<py::object>(value));
      if (keep.size() != B * K) fail(kOp, "key_keep: ", keep.size(), " entries; wanted ", B * K);
      s.masks.key_padding_mask = Mask::keep({B, K}, std::vector<uint8_t>(keep.data(), keep.data() + B * K));
    } else if (name == "window") {
      const auto w = value.cast<std::pair<int64_t, int64_t>>();
      s.masks.window = {w.first, w.second};
    } else if (name == "softcap") {
      s.masks.scores.softcap = value.cast<float>();
    } else if (name == "alibi_slopes") {
      s.masks.scores.alibi_slopes = value.cast<std::vector<float>>();
    } else if (name == "sinks") {
      s.masks.scores.sinks = value.cast<std::vector<float>>();
    } else if (name == "doc_offsets") {
      s.doc_offsets = value.cast<std::vector<int64_t>>();
    } else if (name == "seed_fill") {
      s.fill = value.cast<bool>() ? kernels::MaskFill::Seed : kernels::MaskFill::NegInf;
    } else if (name == "zeros") {
      s.masks.fully_masked_rows = value.cast<bool>() ? FullyMaskedRows::Zeros : FullyMaskedRows::Uniform;
    } else if (name == "dropout_p") {
      dropout_p = value.cast<float>();
    } else if (name == "dropout_key") {
      dropout_key = value.cast<uint64_t>();
    } else if (name == "bfloat16") {
      s.precision = value.cast<bool>() ? Precision::BFloat16 : Precision::Float32;
    } else if (name == "first_head") {
      s.first_head = value.cast<int64_t>();
    } else if (name == "all_heads") {
      s.all_heads = value.cast<int64_t>();
    } else {
      fail(kOp, name, ": not an option of the ring's compute (an internal call's error)");
    }
  }
  if (dropout_p > 0.0f) s.dropout = {dropout_p, dropout_key};
  return s;
}

// One call's rows: made per call, so that threads never share one.
struct RingCall {
  int64_t B, Hd;
  nn::RingRows rows;
  Floats q, out, grad_out;
  explicit RingCall(nn::RingRowsSpec spec) : B(spec.B), Hd(spec.H * spec.d), rows(std::move(spec)) {}
  int64_t kv_size(const PieceList& pieces) const {
    int64_t n = 0;
    for (const auto& p : pieces) n += p.second;
    return B * n * Hd;
  }
};

}  // namespace

void bind_ring(py::module_& core) {
  py::module_ m = core.def_submodule("_ring_calls", "mha.torch.distributed's ring compute (internal)");
  py::class_<RingCall, std::shared_ptr<RingCall>>(m, "RingCall", "One rank's rows of one ring attention call.")
      .def(py::init([](int64_t B, int64_t H, int64_t d, int64_t Q, int64_t K, const PieceList& q_pieces,
                       const py::kwargs& options) {
             return std::make_shared<RingCall>(ring_spec(B, H, d, Q, K, q_pieces, options));
           }),
           py::arg("B"), py::arg("H"), py::arg("d"), py::arg("Q"), py::arg("K"), py::arg("q_pieces"))
      .def("begin_forward",
           [](RingCall& c, Floats q) {
             floats(q, c.B * c.rows.rows() * c.Hd, "q");
             c.q = std::move(q);
             c.rows.begin_forward(c.q.data());
           })
      .def("add_block",
           [](RingCall& c, const Floats& k, const Floats& v, const PieceList& pieces) {
             const int64_t n = c.kv_size(pieces);
             const float* kd = floats(k, n, "k");
             const float* vd = floats(v, n, "v");
             const std::vector<nn::Piece> p = pieces_of(pieces);
             py::gil_scoped_release release;  // the next block moves meanwhile
             c.rows.add_block(kd, vd, p);
           })
      .def("finish",
           [](RingCall& c) {
             Floats out({c.B, c.rows.rows(), c.Hd});
             {
               py::gil_scoped_release release;
               c.rows.finish(out.mutable_data());
             }
             c.out = out;
             c.q = Floats();  // the autograd function keeps q for the backward
             return out;
           })
      .def("begin_backward",
           [](RingCall& c, Floats q, Floats grad_out) {
             const int64_t n = c.B * c.rows.rows() * c.Hd;
             floats(q, n, "q");
             floats(grad_out, n, "grad_out");
             c.q = std::move(q);
             c.grad_out = std::move(grad_out);
             c.rows.set_queries(c.q.data());
             c.rows.begin_backward(c.out.data(), c.grad_out.data());
           })
      .def("backward_block",
           [](RingCall& c, const Floats& k, const Floats& v, const PieceList& pieces, Floats dk, Floats dv) {
             const int64_t n = c.kv_size(pieces);
             const float* kd = floats(k, n, "k");
             const float* vd = floats(v, n, "v");
             floats(dk, n, "dk");
             floats(dv, n, "dv");
             float* dkd = dk.mutable_data();
             float* dvd = dv.mutable_data();
             const std::vector<nn::Piece> p = pieces_of(pieces);
             py::gil_scoped_release release;
             c.rows.backward_block(kd, vd, p, dkd, dvd);
           },
           py::arg("k"), py::arg("v"), py::arg("pieces"), py::arg("dk").noconvert(), py::arg("dv").noconvert())
      .def("sinks_grad_share", [](const RingCall& c) { return c.rows.sinks_grad_share(); },
           "[H] this rank's rows' share of dL/d sinks (after begin_backward); the ranks' shares sum to it")
      .def("grad_q", [](RingCall& c) {
        // Handed to numpy without a copy (the gradient is as large as q).
        auto* g = new std::vector<float>(std::move(c.rows.grad_q()));
        py::capsule owner(g, [](void* p) { delete static_cast<std::vector<float>*>(p); });
        c.out = Floats(), c.grad_out = Floats(), c.q = Floats();
        return Floats({c.B, c.rows.rows(), c.Hd}, g->data(), owner);
      });
}

}  // namespace mha::python
