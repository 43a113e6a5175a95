// python/bindings/bindings.h: what the binding files of mha._core share. module.cpp
// defines the module and calls each file's bind_* function once; the
// conversions every binding uses are in python/bindings/convert.h, the lock of
// objects that Python threads share in python/bindings/object_lock.h.
#pragma once

#include <pybind11/pybind11.h>

#include "mha/masks.h"
#include "mha/rotary.h"

namespace mha::python {

namespace py = pybind11;

// nn.MultiheadAttention's mask arguments (python/bindings/bind_torch.cpp): boolean
// arrays read as PyTorch reads them (True = masked out), floats as additive,
// is_causal as True/False or an mha.Causal, window as None or (left, right).
CallMasks to_call_masks(const py::object& key_padding_mask, const py::object& attn_mask, const py::object& is_causal,
                        const py::object& window, const char* op);
// window=None (no window) or a pair (left, right) of integers (mha/masks.h
// Window; the values are checked by the module).
Window to_window(const py::object& window, const char* op);
// softcap=None (off) or a real number, alibi_slopes=None or a 1-D array of
// one slope per head, sinks=None or a 1-D array of one logit per head
// (mha/masks.h ScoreOptions; the values are checked by the module).
// A backward's input gradients: (queries, keys, values), and the sinks'
// gradient as a fourth entry when the call had sinks (`sinks` not empty).
py::tuple input_grads(const Tensor& queries, const Tensor& keys, const Tensor& values, const Tensor& sinks);
ScoreOptions to_scores(const py::object& softcap, const py::object& alibi_slopes, const char* op,
                       const py::object& sinks = py::none());
// rotary= (mha/rotary.h): None or False (off), True (every entry of a head of
// width head_dim, base 10000, rotate_half pairs), an mha.Rotary, or a dict
// of dims (default: head_dim), base and interleaved; checked for head_dim.
Rotary to_rotary(const py::handle& value, const char* op, int64_t head_dim);

// Each binding file's part of mha._core, in the order module.cpp calls them.
void add_plot_bindings(py::module_& m);   // plot_bindings.cpp: heatmaps, PNG
void bind_torch(py::module_& m);          // bind_torch.cpp: Mask, TorchMultiheadAttention
void bind_training(py::module_& m);       // train_bindings.cpp: backward, AttentionModel, optimisers
void bind_pruning(py::module_& m);        // prune_bindings.cpp: head gates, pruning, importance
void bind_inspect(py::module_& m);        // inspect_bindings.cpp: head_offsets
void bind_decode(py::module_& m);         // decode_bindings.cpp: the decode kernel
void bind_contexts(py::module_& m);       // context_bindings.cpp: ForwardContext
void bind_caches(py::module_& m);         // cache_bindings.cpp: KVCache, cached calls
void bind_torch_calls(py::module_& m);    // torch_calls.cpp: mha.torch's calls
void bind_sdpa(py::module_& m);           // sdpa_calls.cpp: scaled_dot_product_attention
void bind_attention(py::module_& m);      // attention_calls.cpp: mha.torch.attention
void bind_ring(py::module_& m);           // ring_calls.cpp: mha.torch.distributed's ring

}  // namespace mha::python
