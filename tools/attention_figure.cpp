// tools/attention_figure.cpp: see attention_figure.h.
#include "attention_figure.h"

#include <cmath>
#include <cstdio>

#include "mask_args.h"

namespace mha::tools {

namespace {
const char* kOp = "viz";
}

Tensor masked_heads(const Tensor& weights, const ValidLens& valid_lens, const std::vector<int64_t>& heads,
                    Causal causal, const Window& window) {
  if (weights.dim() != 4) fail(kOp, "weights: shape ", shape_str(weights.shape()), ", wanted (B, H, Q, K)");
  const int64_t R = weights.size(0), H = weights.size(1), Q = weights.size(2), K = weights.size(3);
  if (!valid_lens.is_none()) valid_lens.check(kOp, R, Q);
  for (int64_t h : heads)
    if (h < 0 || h >= H) fail(kOp, "head ", h, " is outside the module's ", H, " heads (0 .. ", H - 1, ")");
  const int64_t n = static_cast<int64_t>(heads.size());
  Tensor out({R, n, Q, K});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t q = 0; q < Q; ++q) {
        const float len = valid_lens.at(r, q);
        for (int64_t k = 0; k < K; ++k)
          out.at({r, i, q, k}) = static_cast<float>(k) < len && key_in_range(causal, window, q, Q, k, K)
                                     ? weights.at({r, heads[i], q, k})
                                     : NAN;
      }
  return out;
}

std::string valid_len_label(const ValidLens& valid_lens, int64_t r) {
  switch (valid_lens.kind()) {
    case ValidLens::Kind::None: return "no mask";
    case ValidLens::Kind::PerQuery: return "valid_lens per query";
    case ValidLens::Kind::PerBatch: {
      char buf[48];
      std::snprintf(buf, sizeof buf, "valid_len %g", valid_lens.at(r, 0));
      return buf;
    }
  }
  return "";
}

plot::Heatmaps draw_attention(const Tensor& weights, const ValidLens& valid_lens, const AttentionFigure& fig) {
  std::vector<int64_t> heads = fig.heads;
  if (heads.empty())
    for (int64_t h = 0; h < (weights.dim() == 4 ? weights.size(1) : 0); ++h) heads.push_back(h);
  const Tensor panels = masked_heads(weights, valid_lens, heads, fig.causal, fig.window);
  if (static_cast<int64_t>(fig.row_ids.size()) != panels.size(0))
    fail(kOp, "row_ids: ", fig.row_ids.size(), " given for ", panels.size(0), " rows of weights");
  plot::HeatmapOptions opt;
  opt.title = fig.title;
  opt.colorbar_label = "attention weight";
  opt.max_cells = fig.max_cells;
  opt.vmin = 0.0;  // weights are probabilities; the top of the scale follows the data
  opt.note = fig.note;
  const int64_t H = weights.size(1);
  if (!fig.head_titles.empty() && static_cast<int64_t>(fig.head_titles.size()) != H)
    fail(kOp, "head_titles: ", fig.head_titles.size(), " given for ", H, " heads");
  if (!fig.row_labels.empty() && fig.row_labels.size() != fig.row_ids.size())
    fail(kOp, "row_labels: ", fig.row_labels.size(), " given for ", fig.row_ids.size(), " rows");
  for (int64_t r : fig.row_ids) {
    (void)r;
    for (int64_t h : heads)
      opt.titles.push_back(fig.head_titles.empty() ? "head " + std::to_string(h) : fig.head_titles[h]);
  }
  for (size_t i = 0; i < fig.row_ids.size(); ++i)
    opt.row_labels.push_back(!fig.row_labels.empty() ? fig.row_labels[i]
                                                     : "batch row " + std::to_string(fig.row_ids[i]) + " (" +
                                                           valid_len_label(valid_lens, static_cast<int64_t>(i)) + ")");
  return plot::render_heatmaps(panels, opt);
}

}  // namespace mha::tools
