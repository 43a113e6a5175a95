// python/bindings/cache_bindings.cpp: cached decoding (mha/kv_cache.h) in Python:
// mha.KVCache, m.kv_cache(batch_size, max_len, dtype) on both modules, and a
// `cache=` keyword on their calls:
//
//   m.eval()
//   cache = m.kv_cache(2, 128, dtype="bfloat16")
//   out = m(prompt, prompt, prompt, cache=cache)   # prefill
//   out = m(x, x, x, cache=cache)                  # one step, x (B, 1, D)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "convert.h"
#include "object_lock.h"
#include "mha/mha.h"

namespace mha::python {

namespace py = pybind11;


namespace {

// kv_cache's window: None (no ring) or an integer (not a bool: True is no window of 1).
int64_t window_arg(const py::object& window, const char* op) {
  return window.is_none() ? -1 : integer_arg(window, op, "window", "None or an integer >= 0 (a ring buffer's window)");
}

Mask key_padding_mask_of(const py::object& obj, const char* op) {
  return to_call_masks(obj, py::none(), py::bool_(false), py::none(), op).key_padding_mask;
}

KVCacheDtype to_dtype(const std::string& s, const char* op) {
  if (s == "float32") return KVCacheDtype::Float32;
  if (s == "bfloat16") return KVCacheDtype::BFloat16;
  fail(op, "dtype: '", s, "'; wanted 'float32' or 'bfloat16'");
}

// The three inputs as tensors: one array passed twice is one tensor, so the
// module projects it with one product (self-attention).
struct Inputs {
  Tensor q, k, v;
  const Tensor& keys() const { return k.empty() ? q : k; }
  const Tensor& values(bool v_is_k) const { return v.empty() ? (v_is_k ? keys() : q) : v; }
};

// forward(q, k, v) is the module's cached call with the call's masks bound.
template <typename Forward>
py::array_t<float> cached_call(const Forward& forward, KVCache& cache, const py::object& q, const py::object& k,
                               const py::object& v, const char* op, const char* names[3]) {
  Inputs in;
  in.q = to_tensor(q, op, names[0]);
  if (k.ptr() != q.ptr()) in.k = to_tensor(k, op, names[1]);
  const bool v_is_k = v.ptr() == k.ptr();
  if (v.ptr() != q.ptr() && !v_is_k) in.v = to_tensor(v, op, names[2]);
  Tensor out = locked(&cache, [&] { return forward(in.q, in.keys(), in.values(v_is_k)); });
  return to_numpy(out);
}

}  // namespace

void bind_caches(py::module_& m) {
  py::class_<KVCache>(m, "KVCache", R"doc(
A key/value cache for incremental decoding, made by a module's kv_cache().

Holds each new position's projected key and value per batch row and key/value
head, so that a cached call, m(x, x, x, cache=cache), projects only its new
positions and attends over everything cached: the d2l chapter's decoder loop
(all earlier inputs concatenated and projected again at each step) without
the re-projection. Each batch row has its own length.

Threads: a cache may be shared; its calls and methods run one at a time, each
whole (a cache is one sequence's state: threads decoding different sequences
want a cache each).
)doc")
      .def_property_readonly("batch_size", &KVCache::batch_size)
      .def_property_readonly("capacity", &KVCache::capacity,
                             "Slots per batch row: positions each row can hold (a ring: its last ones).")
      .def_property_readonly("window", [](const KVCache& c) -> py::object {
        if (c.window() < 0) return py::none();
        return py::int_(c.window());
      }, "A ring buffer's window (None: not a ring); lengths keep counting past the capacity.")
      .def_property_readonly("num_kv_heads", &KVCache::num_kv_heads)
      .def_property_readonly("head_dim", &KVCache::head_dim)
      .def_property_readonly("dtype", [](const KVCache& c) { return std::string(to_string(c.dtype())); },
                             "'float32' or 'bfloat16': how keys and values are stored.")
      .def_property_readonly(
          "lengths", [](KVCache& c) { return locked(&c, [&] { return c.lengths(); }); },
          "Positions held by each batch row (a list).")
      .def_property_readonly("storage_bytes", &KVCache::storage_bytes)
      .def(
          "truncate",
          [](KVCache& c, int64_t row, int64_t length) { locked(&c, [&] { c.truncate(row, length); }); },
          py::arg("row"), py::arg("length"),
          "Rewind batch row `row` to its first `length` positions (0 <= length <= its length).")
      .def(
          "reset", [](KVCache& c) { locked(&c, [&] { c.reset(); }); },
          "Every row back to length 0 (the storage stays).")
      .def(
          "reorder",
          [](KVCache& c, const py::object& rows) {
            const std::vector<int64_t> r = int_list(rows, "KVCache.reorder", "rows");
            locked(&c, [&] { c.reorder(r); });
          },
          py::arg("rows"), "Beam search: new row i = old row rows[i] (one entry per batch row).")
      .def(
          "append",
          [](KVCache& c, const py::object& keys, const py::object& values) {
            const Tensor k = to_tensor(keys, "KVCache.append", "keys");
            const Tensor v = to_tensor(values, "KVCache.append", "values");
            locked(&c, [&] { c.append(k, v); });
          },
          py::arg("keys"), py::arg("values"),
          "Append projected keys and values, each (batch_size, n, num_kv_heads * head_dim).")
      .def(
          "keys", [](KVCache& c, int64_t row) { return to_numpy(locked(&c, [&] { return c.keys(row); })); },
          py::arg("row"), "(num_kv_heads, length, head_dim): batch row `row`'s stored keys as float32.")
      .def(
          "values", [](KVCache& c, int64_t row) { return to_numpy(locked(&c, [&] { return c.values(row); })); },
          py::arg("row"), "(num_kv_heads, length, head_dim): batch row `row`'s stored values as float32.")
      .def("__repr__", [](KVCache& c) {
        const std::vector<int64_t> lengths = locked(&c, [&] { return c.lengths(); });
        return py::str("mha.KVCache(batch_size={}, capacity={}, num_kv_heads={}, head_dim={}, dtype='{}', lengths={})")
            .format(c.batch_size(), c.capacity(), c.num_kv_heads(), c.head_dim(), to_string(c.dtype()),
                    py::cast(lengths));
      });

  auto textbook = py::reinterpret_borrow<py::class_<MultiHeadAttention>>(m.attr("MultiHeadAttention"));
  textbook
      .def(
          "kv_cache",
          [](const MultiHeadAttention& s, int64_t batch_size, int64_t max_len, const std::string& dtype,
             const py::object& window) {
            return s.kv_cache(batch_size, max_len, to_dtype(dtype, "MultiHeadAttention.kv_cache"),
                              window_arg(window, "MultiHeadAttention.kv_cache"));
          },
          py::arg("batch_size"), py::arg("max_len"), py::arg("dtype") = "float32", py::arg("window") = py::none(),
          "kv_cache(batch_size, max_len, dtype='float32', window=None) -> mha.KVCache for cached calls,\n"
          "m(x, x, x, cache=cache); dtype 'float32' or 'bfloat16'. window=w (>= 0): a ring buffer of\n"
          "w + max_len slots keeping each row's last w + max_len positions, for calls with\n"
          "window=(left, right), 0 <= left <= w, of at most max_len new positions each.")
      .def(
          "__call__",
          [](MultiHeadAttention& self, const py::object& q, const py::object& k, const py::object& v,
             const py::object& valid_lens, KVCache& cache, const py::object& window, const py::object& softcap,
             const py::object& alibi_slopes, const py::object& sinks) {
            static const char* op = "MultiHeadAttention.forward";
            static const char* names[3] = {"queries", "keys", "values"};
            const ValidLens lens = to_valid_lens(valid_lens, op, "(B, n)");
            const Window w = to_window(window, op);
            const ScoreOptions scores = to_scores(softcap, alibi_slopes, op, sinks);
            auto forward = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
              return self.forward(a, b, c, lens, cache, w, scores);
            };
            return cached_call(forward, cache, q, k, v, op, names);
          },
          py::arg("queries"), py::arg("keys"), py::arg("values"), py::arg("valid_lens") = py::none(), py::kw_only(),
          py::arg("cache"), py::arg("window") = py::none(), py::arg("softcap") = py::none(),
          py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
          "Cached call (evaluation mode): queries, keys, values (B, n, D*) of the n new positions ->\n"
          "(B, n, num_hiddens); their keys and values are appended to `cache` and each new query\n"
          "attends over its row's cached positions and the new ones up to itself. valid_lens: None,\n"
          "(B,) or (B, n), the chapter's lengths over each row's keys (cached, then new): key j of\n"
          "query i takes part iff j < its length (and j is not after the query). window: None or\n"
          "(left, right), a sliding window over each row's keys (new query i at position cached + i).\n"
          "softcap, alibi_slopes, sinks: as the uncached call's, ALiBi's distances from those positions.");

  auto drop_in = py::reinterpret_borrow<py::class_<TorchMultiheadAttention>>(m.attr("TorchMultiheadAttention"));
  drop_in
      .def(
          "kv_cache",
          [](const TorchMultiheadAttention& s, int64_t batch_size, int64_t max_len, const std::string& dtype,
             const py::object& window) {
            return s.kv_cache(batch_size, max_len, to_dtype(dtype, "TorchMultiheadAttention.kv_cache"),
                              window_arg(window, "TorchMultiheadAttention.kv_cache"));
          },
          py::arg("batch_size"), py::arg("max_len"), py::arg("dtype") = "float32", py::arg("window") = py::none(),
          "kv_cache(batch_size, max_len, dtype='float32', window=None) -> mha.KVCache (num_kv_heads\n"
          "heads) for cached calls, m(x, x, x, cache=cache); dtype 'float32' or 'bfloat16'. window=w\n"
          "(>= 0): a ring buffer of w + max_len slots (see MultiHeadAttention.kv_cache).")
      .def(
          "__call__",
          [](TorchMultiheadAttention& self, const py::object& q, const py::object& k, const py::object& v,
             const py::object& key_padding_mask, KVCache& cache, const py::object& window,
             const py::object& softcap, const py::object& alibi_slopes, const py::object& sinks) {
            static const char* op = "TorchMultiheadAttention.forward";
            static const char* names[3] = {"query", "key", "value"};
            const Mask mask = key_padding_mask_of(key_padding_mask, op);
            const Window w = to_window(window, op);
            const ScoreOptions scores = to_scores(softcap, alibi_slopes, op, sinks);
            auto forward = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
              return self.forward(a, b, c, cache, mask, w, scores);
            };
            return cached_call(forward, cache, q, k, v, op, names);
          },
          py::arg("query"), py::arg("key"), py::arg("value"), py::arg("key_padding_mask") = py::none(),
          py::kw_only(), py::arg("cache"), py::arg("window") = py::none(), py::arg("softcap") = py::none(),
          py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
          "Cached call (evaluation mode): the n new positions in the module's layout -> output\n"
          "shaped like query; no weights (returns the output only). key_padding_mask: None or, as\n"
          "nn.MultiheadAttention's (True = padding, or additive floats), over every key the call\n"
          "attends to: (B, S) [(S,) unbatched], S = the longest row's cached length + n; row b's\n"
          "columns past its own length are ignored. window: None or (left, right), a sliding\n"
          "window over each row's keys, as an uncached is_causal call with the window. softcap,\n"
          "alibi_slopes, sinks: as the uncached call's.");
}

}  // namespace mha::python
