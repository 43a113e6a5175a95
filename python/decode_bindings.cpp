// python/decode_bindings.cpp: the decode kernel (src/kernels/params.h)
// as mha._core._decode_attention, private (a leading underscore): bench/bench.py
// times the kernel alone with it (against ONNX Runtime), below the modules'
// cached calls (python/cache_bindings.cpp). The caches are used in place (no copy when they are already
// C-contiguous float32, or uint16 holding bfloat16 bits).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "cpu/decode/decode.h"
#include "kernels/params.h"
#include "kernels/validate.h"
#include "mha/error.h"

namespace mha::python {

namespace py = pybind11;

namespace {

constexpr const char* kOp = "_decode_attention";
using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using BF16 = py::array_t<uint16_t, py::array::c_style | py::array::forcecast>;
using Lengths = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

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
  kernels::DecodeParams p;
  p.B = B, p.Hq = q.shape(1), p.Qn = q.shape(2), p.d = d;
  p.Hkv = k.shape(1), p.capacity = k.shape(2), p.dv = v.shape(3);
  p.set_contiguous_strides();
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.dtype = bf16 ? kernels::CacheDtype::BF16 : kernels::CacheDtype::F32;
  p.lengths = lengths.data();
  p.masks.causal = causal ? Causal::BottomRight : Causal::None;
  p.scale_divisor = std::sqrt(static_cast<float>(d));
  py::array_t<float> out({B, p.Hq, p.Qn, p.dv});
  p.out = out.mutable_data();
  kernels::check_decode_params(p, kOp);
  {
    py::gil_scoped_release release;
    kernels::decode_attention(p);
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
