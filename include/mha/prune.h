// mha/prune.h: pruned head layouts in files, for modules and models.
//
// Pruning itself is MultiHeadAttention::prune_heads (mha/multihead.h): it
// slices the rows of W_q, W_k, W_v and the columns of W_o, so a pruned
// module's state dict has narrower tensors. A file of such tensors is only
// readable with the layout beside it, which these functions keep in the
// safetensors __metadata__ (all strings):
//   "<prefix>num_heads"  = "8"       heads as the module was built
//   "<prefix>heads_kept" = "0,2,5"   the heads still there, ascending
// with prefix "" for a module file and "layers.<l>." for layer l of a model
// checkpoint (mha/checkpoint.h's load_model applies it). A file without
// "heads_kept" holds an unpruned module.
//
//   module.prune_heads({1, 3});
//   mha::save_attention("pruned.safetensors", module);
//   mha::MultiHeadAttention back = mha::load_attention("pruned.safetensors");
//   // back.kept_heads() == module.kept_heads(); same outputs
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mha/checkpoint.h"
#include "mha/model.h"
#include "mha/multihead.h"

namespace mha {

// A safetensors file's __metadata__: string keys to string values.
using Metadata = std::map<std::string, std::string>;

// The module's layout as metadata entries under `prefix`.
Metadata head_layout_metadata(const MultiHeadAttention& m, const std::string& prefix = "");

// The heads kept according to `meta` under `prefix`, for a module built with
// `num_heads` heads: all of them when there is no "heads_kept" entry. Throws
// mha::Error naming `origin` and the entry if it is malformed, repeats a
// head, is out of range or empty, or if "num_heads" disagrees.
std::vector<int64_t> heads_kept_from_metadata(const Metadata& meta, const std::string& prefix,
                                              int64_t num_heads, const std::string& origin);

// Prunes a module as built (all heads still there) to the layout in `meta`.
void apply_head_layout(MultiHeadAttention& m, const Metadata& meta, const std::string& prefix,
                       const std::string& origin);

// A module file: the state dict (F32) plus the layout metadata.
void save_attention(const std::string& path, const MultiHeadAttention& m);
// The module of a file written by save_attention (or any file of the d2l chapter's
// state-dict names), in evaluation mode: num_hiddens from W_o.weight's rows,
// biases iff the file has them, heads from `num_heads` (as built) or, when
// 0, from the file's "num_heads" entry; both given must agree.
MultiHeadAttention load_attention(const std::string& path, int64_t num_heads = 0);

// Every layer's layout: "layers.<l>.num_heads" and "layers.<l>.heads_kept".
Metadata model_head_layout_metadata(const AttentionModel& model);
// Prunes every layer of a model as built to the layouts in `meta`.
void apply_model_head_layout(AttentionModel& model, const Metadata& meta, const std::string& origin);

// Removes heads of a model, given as (layer, head as built) pairs.
void prune_model_heads(AttentionModel& model, const std::vector<std::pair<int64_t, int64_t>>& heads);

// A checkpoint of a (possibly pruned) model: the training config and step
// of `config`/`step`, the model's parameters and layouts, no optimiser
// state. read_checkpoint and load_model read it back, pruned.
void save_model_checkpoint(const std::string& path, const TrainConfig& config, int64_t step,
                           const AttentionModel& model);

}  // namespace mha
