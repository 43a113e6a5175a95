// python/bindings/attention_calls.cpp: FlashAttention-style attention on mha's
// kernels, for mha.torch.attention (python/mha/torch_attention.py, through
// the operators of python/mha/_torch_ops.py), which checks and shapes every
// argument first (flash_attn_func's conventions).
//
//   q:(B,L,H,d) k:(B,S,Hkv,d) v:(B,S,Hkv,dv) (float32, C-contiguous; Hkv divides H)
//   options = (causal, window_left, window_right, softcap, alibi_slopes, sinks,
//              doc_offsets, scale, dropout_p, dropout_key): slopes and sinks
//              None or [H], doc_offsets None or [documents + 1] int64
//   forward(q, k, v, options) -> (out (B,L,H,dv), stats [2, B*H*L] or None)
//   backward(grad_out, q, k, v, out, stats, options)
//     -> (grad_q, grad_k, grad_v, grad_sinks or None)
//   with_kv_cache(q, k_cache, v_cache, lengths, options) -> out (B,L,H,dv)
//     k_cache (B,capacity,Hkv,d), v_cache (B,capacity,Hkv,dv): float32, or
//     uint16 holding bfloat16 bits, read in place; lengths (B,) int64, the
//     keys of each row (the new ones already written); options =
//     (causal, window_left, window_right, softcap, alibi_slopes, sinks, scale)
//     (flash_attn_with_kvcache, python/mha/torch_kv_cache.py)
//
// The layout is FlashAttention's (rows, then heads): the kernels read it as
// strided [B,H,L,d] views, so nothing is transposed. A packed batch is B = 1
// with doc_offsets (cu_seqlens) cutting its L = S rows into documents. The
// masks are FlashAttention's: the window and causal limit aligned to the
// bottom right, masked scores -inf, and a query with no key gets zeros.
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

constexpr const char* kOp = "mha.torch.attention";

using OffsetArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
constexpr const char* kCacheOp = "mha.torch.attention_with_kv_cache";

// One call's inputs, read in place, and its kernel parameters (without out).
struct AttentionCall {
  FloatArray in[3];  // q (B,L,H,d), k (B,S,Hkv,d), v (B,S,Hkv,dv)
  FloatArray alibi, sinks;  // [H] or empty
  OffsetArray doc_offsets;  // [documents + 1] or empty
  int64_t H = 1, Hkv = 1;
  kernels::AttentionForward p;

  AttentionCall(const py::handle& q, const py::handle& k, const py::handle& v, const py::tuple& options) {
    const char* names[] = {"q", "k", "v"};
    const py::handle arrays[] = {q, k, v};
    for (int x = 0; x < 3; ++x) in[x] = attention_glue::float_input(arrays[x], 4, kOp, names[x]);
    H = in[0].shape(2), Hkv = in[1].shape(2);
    if (Hkv < 1 || H % Hkv != 0) fail(kOp, "k: ", Hkv, " heads do not divide q's ", H);
    p.q = attention_glue::rows_view(in[0]).split_heads(H);
    p.k = attention_glue::rows_view(in[1]).split_heads(Hkv);
    p.v = attention_glue::rows_view(in[2]).split_heads(Hkv);
    if (options.size() != 10) fail(kOp, "options: ", options.size(), " entries; wanted 10");
    kernels::MaskOptions& m = p.masks;
    m.causal = options[0].cast<bool>() ? Causal::BottomRight : Causal::None;
    m.window_left = options[1].cast<int64_t>();
    m.window_right = options[2].cast<int64_t>();
    m.softcap = options[3].cast<float>();
    alibi = attention_glue::optional_floats(py::reinterpret_borrow<py::object>(options[4]), H, kOp, "alibi_slopes");
    sinks = attention_glue::optional_floats(py::reinterpret_borrow<py::object>(options[5]), H, kOp, "sinks");
    m.alibi_slopes = attention_glue::data_or_null(alibi);
    m.sinks = attention_glue::data_or_null(sinks);
    if (!options[6].is_none()) {
      doc_offsets = OffsetArray::ensure(options[6]);
      if (!doc_offsets || doc_offsets.ndim() != 1 || doc_offsets.size() < 2) {
        PyErr_Clear();
        fail(kOp, "cu_seqlens: not a 1-D array of at least 2 offsets");
      }
      m.doc_offsets = doc_offsets.data();
      m.documents = doc_offsets.size() - 1;
    }
    p.scale_divisor = 1.0f / options[7].cast<float>();
    const float dropout_p = options[8].cast<float>();
    if (dropout_p > 0.0f) p.dropout = {dropout_p, options[9].cast<uint64_t>()};
    m.fill = kernels::MaskFill::NegInf;
    m.fully_masked = FullyMaskedRows::Zeros;
  }

  Shape out_shape() const { return {in[0].shape(0), in[0].shape(1), H, in[2].shape(3)}; }
  int64_t rows() const { return in[0].shape(0) * in[0].shape(1) * H; }
};

// One cached call: q over each row's first lengths[b] cache slots, the
// caches read in place (the Python side wrote the new keys into them), by
// the decode kernels through the dispatch (kernels::decode_forward).
py::array_t<float> with_kv_cache(const py::handle& q_obj, const py::array& k_cache, const py::array& v_cache,
                                 const py::handle& lengths_obj, const py::tuple& options) {
  const FloatArray q = attention_glue::float_input(q_obj, 4, kCacheOp, "q");
  const bool bf16 = k_cache.dtype().is(py::dtype::of<uint16_t>());
  const py::array* caches[] = {&k_cache, &v_cache};
  const char* names[] = {"k_cache", "v_cache"};
  for (int x = 0; x < 2; ++x) {
    const py::array& c = *caches[x];
    const bool ok_dtype = bf16 ? c.dtype().is(py::dtype::of<uint16_t>()) : c.dtype().is(py::dtype::of<float>());
    // Read in place or not at all: the caches are the caller's storage.
    if (!ok_dtype || c.ndim() != 4 || !(c.flags() & py::array::c_style))
      fail(kCacheOp, names[x], ": not a C-contiguous 4-D array of float32 or bfloat16 bits (uint16)");
  }
  const OffsetArray lengths = OffsetArray::ensure(lengths_obj);
  const int64_t B = q.shape(0), L = q.shape(1), H = q.shape(2), d = q.shape(3);
  const int64_t cap = k_cache.shape(1), Hkv = k_cache.shape(2), dv = v_cache.shape(3);
  if (!lengths || lengths.ndim() != 1 || lengths.shape(0) != B) {
    PyErr_Clear();
    fail(kCacheOp, "cache_seqlens: not a 1-D array of ", B, " lengths");
  }
  if (k_cache.shape(0) != B || k_cache.shape(3) != d || v_cache.shape(0) != B || v_cache.shape(1) != cap ||
      v_cache.shape(2) != Hkv)
    fail(kCacheOp, "k_cache, v_cache: shapes ", shape_str(shape_of(k_cache)), ", ", shape_str(shape_of(v_cache)),
         " for q ", shape_str(shape_of(q)), "; wanted (B, capacity, Hkv, d) and (B, capacity, Hkv, dv)");
  if (options.size() != 7) fail(kCacheOp, "options: ", options.size(), " entries; wanted 7");
  kernels::AttentionForward p;
  p.q = attention_glue::rows_view(q).split_heads(H);
  // [B, Hkv, capacity, width] views of the (B, capacity, Hkv, width) caches;
  // bfloat16 storage is pointed to by the cache's own fields.
  void* k_data = const_cast<void*>(k_cache.data());
  void* v_data = const_cast<void*>(v_cache.data());
  p.k = attention_glue::rows_view(bf16 ? nullptr : static_cast<float*>(k_data), B, cap, Hkv * d).split_heads(Hkv);
  p.v = attention_glue::rows_view(bf16 ? nullptr : static_cast<float*>(v_data), B, cap, Hkv * dv).split_heads(Hkv);
  if (bf16) {
    p.cache.dtype = kernels::CacheDtype::BF16;
    p.cache.k_bf16 = static_cast<const uint16_t*>(k_data);
    p.cache.v_bf16 = static_cast<const uint16_t*>(v_data);
  }
  p.cache.lengths = lengths.data();
  kernels::MaskOptions& m = p.masks;
  m.causal = options[0].cast<bool>() ? Causal::BottomRight : Causal::None;
  m.window_left = options[1].cast<int64_t>();
  m.window_right = options[2].cast<int64_t>();
  m.softcap = options[3].cast<float>();
  const FloatArray alibi =
      attention_glue::optional_floats(py::reinterpret_borrow<py::object>(options[4]), H, kCacheOp, "alibi_slopes");
  const FloatArray sinks =
      attention_glue::optional_floats(py::reinterpret_borrow<py::object>(options[5]), H, kCacheOp, "sinks");
  m.alibi_slopes = attention_glue::data_or_null(alibi);
  m.sinks = attention_glue::data_or_null(sinks);
  m.fill = kernels::MaskFill::NegInf;
  m.fully_masked = FullyMaskedRows::Zeros;
  p.scale_divisor = 1.0f / options[6].cast<float>();
  Tensor out({B, L, H, dv});
  p.out = attention_glue::rows_view(out).split_heads(H);
  {
    py::gil_scoped_release release;
    kernels::decode_forward(p, kCacheOp);
  }
  return hand_to_numpy(std::move(out));
}

}  // namespace

void bind_attention(py::module_& core) {
  py::module_ m = core.def_submodule("_attention_calls", "mha.torch.attention's calls (internal)");

  m.def(
      "forward",
      [](const py::array& q, const py::array& k, const py::array& v, const py::tuple& options) {
        AttentionCall c(q, k, v, options);
        Tensor out(c.out_shape());
        c.p.out = attention_glue::rows_view(out).split_heads(c.H);
        py::object stats = attention_glue::forward_with_stats(c.p, c.rows(), c.in[1].shape(1));
        return py::make_tuple(hand_to_numpy(std::move(out)), stats);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("options"), "-> (out (B,L,H,dv), stats [2,B*H*L] or None)");

  m.def(
      "backward",
      [](const py::array& grad_out, const py::array& q, const py::array& k, const py::array& v, const py::array& out,
         const py::object& stats, const py::tuple& options) {
        AttentionCall c(q, k, v, options);
        attention_glue::BackwardBuffers b(kOp, grad_out, out, c.out_shape(), c.in, c.sinks);
        kernels::AttentionBackward p;
        p.fwd = c.p;
        p.fwd.out = attention_glue::rows_view(b.out).split_heads(c.H);
        p.grad_out = attention_glue::rows_view(b.grad_out).split_heads(c.H);
        p.grad_q = attention_glue::rows_view(b.grad_q).split_heads(c.H);
        p.grad_k = attention_glue::rows_view(b.grad_k).split_heads(c.Hkv);
        p.grad_v = attention_glue::rows_view(b.grad_v).split_heads(c.Hkv);
        p.grad_sinks = b.sinks_grad();
        attention_glue::backward_with_stats(p, stats, c.rows(), kOp);
        return b.result();
      },
      py::arg("grad_output"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("stats"),
      py::arg("options"), "-> (grad_q, grad_k, grad_v, grad_sinks or None)");

  m.def("with_kv_cache", &with_kv_cache, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("lengths"),
        py::arg("options"), "-> out (B,L,H,dv): q over each row's first lengths[b] cache slots");
}

}  // namespace mha::python
