// python/bindings/inspect_bindings.cpp: mha/inspect.h in Python (mha.head_offsets).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "mha/inspect.h"

namespace mha::python {

void bind_inspect(py::module_& m) {
  py::class_<HeadOffsets>(m, "HeadOffsets", R"doc(
Each head's dominant offset t - k (see mha.head_offsets).

offset (H,) int: the offset with the largest mean weight, per head
weight (H,): that mean weight
mean (H, Q+K-1): mean weight at every offset, NaN where no pair has it
offsets (Q+K-1,) int: the offsets of mean's columns, min_offset .. max_offset
pairs (Q+K-1,) int: (batch row, query, key) triples averaged at each offset
)doc")
      .def_property_readonly("offset", [](const HeadOffsets& o) { return py::array(py::cast(o.offset)); })
      .def_property_readonly("weight", [](const HeadOffsets& o) { return py::array(py::cast(o.weight)); })
      .def_property_readonly("mean", [](const HeadOffsets& o) { return to_numpy(o.mean); })
      .def_property_readonly("pairs", [](const HeadOffsets& o) { return py::array(py::cast(o.pairs)); })
      .def_property_readonly("offsets",
                             [](const HeadOffsets& o) {
                               std::vector<int64_t> d;
                               for (int64_t v = o.min_offset; v <= o.max_offset; ++v) d.push_back(v);
                               return py::array(py::cast(d));
                             })
      .def_readonly("min_offset", &HeadOffsets::min_offset)
      .def_readonly("max_offset", &HeadOffsets::max_offset)
      .def("__repr__", [](const HeadOffsets& o) {
        std::string s = "HeadOffsets(offset=[";
        for (size_t h = 0; h < o.offset.size(); ++h) {
          if (h) s += ", ";
          s += std::to_string(o.offset[h]);
        }
        return s + "])";
      });

  m.def(
      "head_offsets",
      [](const py::object& weights, const py::object& valid_lens, int64_t first_query) {
        const ValidLens lens = to_valid_lens(valid_lens, "head_offsets");
        return head_offsets(to_tensor(weights, "head_offsets", "weights"), lens, first_query);
      },
      py::arg("weights"), py::arg("valid_lens") = py::none(), py::arg("first_query") = 0,
      "head_offsets(weights (B,H,Q,K), valid_lens=None | (B,) | (B,Q), first_query=0) -> HeadOffsets\n\n"
      "Each head's mean attention weight at every offset t - k over the real (query, key)\n"
      "pairs of a self-attention batch, and the offset where it is largest. Key k of query t\n"
      "counts iff k < valid_len(b, t) (d2l's rule) and query t iff t < valid_len(b, t)\n"
      "(it is not padding) and t >= first_query.");
}

}  // namespace mha::python
