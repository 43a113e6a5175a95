// tools/attention_figure.h: attention weights as a grid of heatmaps, one
// panel per (batch row, head), padding drawn as masked. Shared by `mha demo`
// and `mha viz` (and, after the training issue, by the trained-model view).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mha/mha.h"
#include "mha/plot.h"

namespace mha::tools {

struct AttentionFigure {
  std::vector<int64_t> row_ids;  // the batch row each weights row came from (labels only)
  std::vector<int64_t> heads;    // heads to draw, in this order; empty: all
  std::string title;
  int max_cells = 96;            // see plot::HeatmapOptions::max_cells
  // Optional: a title for every head of the weights (index = head, not
  // panel), and a heading for every row; empty: "head h" and the batch row
  // with its valid length.
  std::vector<std::string> head_titles;
  std::vector<std::string> row_labels;
  std::string note;              // small print under the figure; or none
  // Masks beside the valid lengths whose masked cells are drawn masked too.
  Causal causal = Causal::None;
  Window window;
};

// weights:[R,H,Q,K] (R = row_ids.size()), valid_lens none, [R] or [R,Q] for
// those rows -> [R, heads.size(), Q, K] with NaN where key k is masked for
// query q (float(k) >= valid_len, the d2l chapter's rule, or outside the
// causal limit or the window).
Tensor masked_heads(const Tensor& weights, const ValidLens& valid_lens, const std::vector<int64_t>& heads,
                    Causal causal = Causal::None, const Window& window = {});

// The picture: panel titles "head h" (or head_titles[h]), rows labelled with
// their batch row and valid length (or row_labels), colour scale from 0 (weights are probabilities) to the
// largest weight drawn. Throws mha::Error for heads outside [0, H).
plot::Heatmaps draw_attention(const Tensor& weights, const ValidLens& valid_lens,
                              const AttentionFigure& figure);

// "valid_len 3", "valid_lens per query", or "no mask", for row r.
std::string valid_len_label(const ValidLens& valid_lens, int64_t r);

}  // namespace mha::tools
