// python/ring_calls.cpp: the compute of mha.torch.distributed's ring
// (python/mha/torch_ring.py) on mha's fused kernel: one rank's query rows
// over key/value blocks that Python passes round the ring with
// torch.distributed (kernels/ring_rows.h). Internal: the Python side checks
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
#include <utility>
#include <vector>

#include "bindings.h"
#include "kernels/ring_rows.h"
#include "mha/error.h"

namespace py = pybind11;

namespace mha::python {

namespace {

constexpr const char* kOp = "mha.torch.distributed ring";

using Floats = py::array_t<float, py::array::c_style>;
using PieceList = std::vector<std::pair<int64_t, int64_t>>;

std::vector<kernels::Piece> pieces_of(const PieceList& list) {
  std::vector<kernels::Piece> out;
  for (const auto& [begin, size] : list) out.push_back({begin, size});
  return out;
}

const float* floats(const Floats& a, int64_t want, const char* what) {
  if (a.size() != want) fail(kOp, what, ": ", a.size(), " floats; wanted ", want);
  return a.data();
}

// One call's rows: made per call, so that threads never share one.
struct RingCall {
  kernels::RingRows rows;
  int64_t B, Hd;
  py::array_t<uint8_t, py::array::c_style> key_keep;  // kept alive for rows
  Floats q, out, grad_out;
  explicit RingCall(kernels::RingRowsSpec spec, py::array_t<uint8_t, py::array::c_style> keep)
      : rows(std::move(spec)), key_keep(std::move(keep)) {}
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
                       const py::object& lens, bool causal, const py::object& key_keep, bool seed_fill,
                       bool zeros, float dropout_p, uint64_t dropout_key, bool bfloat16, int64_t first_head,
                       int64_t all_heads) {
             kernels::RingRowsSpec s;
             s.B = B, s.H = H, s.d = d, s.Q = Q, s.K = K;
             s.q_pieces = pieces_of(q_pieces);
             if (!lens.is_none()) {
               Floats l(lens);
               s.lens.assign(floats(l, B, "lens"), l.data() + B);
             }
             s.causal = causal;
             py::array_t<uint8_t, py::array::c_style> keep;
             if (!key_keep.is_none()) {
               keep = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>(key_keep);
               if (keep.size() != B * K) fail(kOp, "key_keep: ", keep.size(), " entries; wanted ", B * K);
               s.key_keep = keep.data();
             }
             s.fill = seed_fill ? kernels::MaskFill::Seed : kernels::MaskFill::NegInf;
             s.fully_masked = zeros ? FullyMaskedRows::Zeros : FullyMaskedRows::Uniform;
             if (dropout_p > 0.0f) s.dropout = {dropout_p, dropout_key};
             s.precision = bfloat16 ? Precision::BFloat16 : Precision::Float32;
             s.first_head = first_head, s.all_heads = all_heads;  // dropout frames only: no index out of range
             s.scale_divisor = std::sqrt(static_cast<float>(d));
             auto c = std::make_shared<RingCall>(std::move(s), std::move(keep));
             c->B = B, c->Hd = H * d;
             return c;
           }),
           py::arg("B"), py::arg("H"), py::arg("d"), py::arg("Q"), py::arg("K"), py::arg("q_pieces"), py::arg("lens"),
           py::arg("causal"), py::arg("key_keep"), py::arg("seed_fill"), py::arg("zeros"), py::arg("dropout_p"),
           py::arg("dropout_key"), py::arg("bfloat16"), py::arg("first_head") = 0, py::arg("all_heads") = 0)
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
             const std::vector<kernels::Piece> p = pieces_of(pieces);
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
             const std::vector<kernels::Piece> p = pieces_of(pieces);
             py::gil_scoped_release release;
             c.rows.backward_block(kd, vd, p, dkd, dvd);
           },
           py::arg("k"), py::arg("v"), py::arg("pieces"), py::arg("dk").noconvert(), py::arg("dv").noconvert())
      .def("grad_q", [](RingCall& c) {
        // Handed to numpy without a copy (the gradient is as large as q).
        auto* g = new std::vector<float>(std::move(c.rows.grad_q()));
        py::capsule owner(g, [](void* p) { delete static_cast<std::vector<float>*>(p); });
        c.out = Floats(), c.grad_out = Floats(), c.q = Floats();
        return Floats({c.B, c.rows.rows(), c.Hd}, g->data(), owner);
      });
}

}  // namespace mha::python
