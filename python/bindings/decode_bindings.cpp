// python/bindings/decode_bindings.cpp: a cached call on its own, as
// mha._core._decode_attention, private (a leading underscore): bench/bench.py
// times the decode kernel alone with it (against ONNX Runtime), below the
// modules' cached calls (python/bindings/cache_bindings.cpp), through the dispatch
// as every binding (kernels::decode_forward: the decode kernel for a few
// new queries, the fused one for long prefills). The caches are used in
// place (no copy when they are already C-contiguous float32, or uint16
// holding bfloat16 bits).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "kernels/dispatch.h"
#include "kernels/params.h"
#include "mha/error.h"

namespace mha::python {

namespace py = pybind11;

namespace {

constexpr const char* kOp = "_decode_attention";
using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using BF16 = py::array_t<uint16_t, py::array::c_style | py::array::forcecast>;
using Lengths = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// A C-contiguous (B, H, L, w) array as the kernels' [B, H, L, w] view
// (null data: bfloat16 bits, which the cache's own fields point to).
TensorView heads_view(const float* data, const py::array& a) {
  TensorView v;
  v.data = const_cast<float*>(data);
  v.rank = 4;
  int64_t stride = 1;
  for (int x = 3; x >= 0; --x) {
    v.shape[x] = a.shape(x);
    v.stride[x] = stride;
    stride *= a.shape(x);
  }
  return v;
}

void want_rank4(const py::array& a, const char* name, const char* wanted) {
  if (a.ndim() != 4) fail(kOp, name, ": shape ", shape_str(shape_of(a)), "; wanted ", wanted);
}

// q:[B,Hq,Qn,d] k_cache:[B,Hkv,capacity,d] v_cache:[B,Hkv,capacity,dv] lengths:[B] -> [B,Hq,Qn,dv]
py::array_t<float> decode_attention(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                                    const py::object& lengths_obj, bool causal) {
  // Numbers only: forcecast would read the strings "1.5" as 1.5.
  const F32 q = F32::ensure(real_array(q_obj, kOp, "q"));
  const py::array k_cache = real_array(k_obj, kOp, "k_cache"), v_cache = real_array(v_obj, kOp, "v_cache");
  const Lengths lengths = Lengths::ensure(real_array(lengths_obj, kOp, "lengths"));
  want_rank4(q, "q", "(B, Hq, Qn, d)");
  want_rank4(k_cache, "k_cache", "(B, Hkv, capacity, d)");
  want_rank4(v_cache, "v_cache", "(B, Hkv, capacity, dv)");
  const bool bf16 = k_cache.dtype().is(py::dtype::of<uint16_t>());
  if (!bf16 && !k_cache.dtype().is(py::dtype::of<float>()))
    fail(kOp, "k_cache: dtype ", std::string(py::str(k_cache.dtype())),
         "; wanted float32, or uint16 holding bfloat16 bits");
  if (!v_cache.dtype().is(k_cache.dtype()))
    fail(kOp, "v_cache: dtype ", std::string(py::str(v_cache.dtype())), "; wanted k_cache's, ",
         std::string(py::str(k_cache.dtype())));
  const int64_t B = q.shape(0), d = q.shape(3);
  if (k_cache.shape(0) != B || v_cache.shape(0) != B || k_cache.shape(3) != d ||
      v_cache.shape(1) != k_cache.shape(1) || v_cache.shape(2) != k_cache.shape(2))
    fail(kOp, "caches: k_cache ", shape_str(shape_of(k_cache)), " and v_cache ", shape_str(shape_of(v_cache)),
         " for q ", shape_str(shape_of(q)), "; wanted (B, Hkv, capacity, d) and (B, Hkv, capacity, dv) with q's B and d");
  if (lengths.ndim() != 1 || lengths.shape(0) != B)
    fail(kOp, "lengths: shape ", shape_str(shape_of(lengths)), "; wanted (", B, ",)");
  // Held here so that the pointers stay valid while the GIL is released.
  py::array k = bf16 ? py::array(BF16::ensure(k_cache)) : py::array(F32::ensure(k_cache));
  py::array v = bf16 ? py::array(BF16::ensure(v_cache)) : py::array(F32::ensure(v_cache));
  kernels::AttentionForward p;
  p.q = heads_view(q.data(), q);
  p.k = heads_view(bf16 ? nullptr : static_cast<const float*>(k.data()), k);
  p.v = heads_view(bf16 ? nullptr : static_cast<const float*>(v.data()), v);
  if (bf16) {
    p.cache.dtype = kernels::CacheDtype::BF16;
    p.cache.k_bf16 = static_cast<const uint16_t*>(k.data());
    p.cache.v_bf16 = static_cast<const uint16_t*>(v.data());
  }
  p.cache.lengths = lengths.data();
  p.masks.causal = causal ? Causal::BottomRight : Causal::None;
  p.scale_divisor = std::sqrt(static_cast<float>(d));
  py::array_t<float> out({B, q.shape(1), q.shape(2), v.shape(3)});
  p.out = heads_view(out.mutable_data(), out);
  {
    py::gil_scoped_release release;
    kernels::decode_forward(p, kOp);
  }
  return out;
}

}  // namespace

void bind_decode(py::module_& m) {
  m.def("_decode_attention", &decode_attention, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("lengths"), py::arg("causal").noconvert() = true,
        "_decode_attention(q (B,Hq,Qn,d), k_cache (B,Hkv,capacity,d), v_cache (B,Hkv,capacity,dv),\n"
        "lengths (B,), causal=True) -> (B,Hq,Qn,dv)\n\n"
        "The decode kernel, private for now: Qn new queries over the first lengths[b] cached\n"
        "keys of each batch row (the new keys already written as the last Qn of them), causal\n"
        "within the new block. Caches are float32, or uint16 holding bfloat16 bits.");
}

}  // namespace mha::python
