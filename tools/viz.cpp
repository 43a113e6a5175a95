// `mha viz`: heatmaps of attention weights, one panel per (batch row, head).
//
//   mha viz --weights w.safetensors --inputs x.safetensors --heads 5
//           --rows 0,1 --show-heads 0,2,4 --out heads.png
//
// The weights and inputs files are those of `mha run` (see model_io.h). Only
// the chosen batch rows go through the module (evaluation mode, the module's
// attention_weights(), i.e. the seed's softmax before dropout); keys beyond a
// row's valid_len are drawn in the mask colour.
//
// Extension point (the training issue): a trained checkpoint plus a sample
// sequence drawn from its task is a second source of an AttentionSample;
// add its flags in add_viz_command, build the sample in a function beside
// sample_from_files(), and everything after (drawing, writing) is shared.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention_figure.h"
#include "commands.h"
#include "mha/mha.h"
#include "mha/plot.h"
#include "io/atomic_file.h"
#include "model_io.h"

namespace mha::tools {

namespace {

const char* kOp = "viz";
constexpr size_t kMaxPanels = 64;  // beyond that no panel is readable: ask for fewer

struct VizOptions {
  std::string weights, inputs, out, title, layout_json;
  int64_t heads = 0;
  std::vector<int64_t> rows{0};
  std::vector<int64_t> show_heads;  // empty: all
  int max_cells = 96;
};

// Attention weights of some batch rows, ready to draw.
struct AttentionSample {
  Tensor weights;                // [R,H,Q,K]
  ValidLens valid_lens;          // none, [R] or [R,Q]
  std::vector<int64_t> row_ids;  // batch row of each of the R rows
  std::string source;            // what the weights are of, for the title
};

AttentionSample sample_from_files(const VizOptions& opt) {
  MultiHeadAttention attention = load_attention(opt.weights, opt.heads, kOp);
  const AttentionInputs all = load_inputs(opt.inputs, kOp);
  const int64_t B = all.queries.dim() > 0 ? all.queries.size(0) : 0;
  for (int64_t r : opt.rows)
    if (r < 0 || r >= B)
      fail(kOp, "--rows: row ", r, " is outside the inputs' batch of ", B, " rows (0 .. ", B - 1, ")");
  for (int64_t h : opt.show_heads)
    if (h < 0 || h >= opt.heads)
      fail(kOp, "--show-heads: head ", h, " is outside the module's ", opt.heads, " heads (0 .. ",
           opt.heads - 1, ")");
  const AttentionInputs in = select_rows(all, opt.rows);
  attention(in.queries, in.keys, in.values, in.valid_lens);
  return {attention.attention_weights(), in.valid_lens, opt.rows,
          std::filesystem::path(opt.inputs).filename().string()};
}

// Where each panel and cell is, for tools that annotate or check the picture:
// cell (q, k) of panel (row, col) has its centre pixel at
//   x = panels[row * cols + col][0] + (k / k_block) * cell_w + (cell_w - gap) / 2
//   y = panels[row * cols + col][1] + (q / q_block) * cell_h + (cell_h - gap) / 2
void write_layout(const VizOptions& opt, const AttentionSample& s, const plot::Heatmaps& h) {
  const plot::HeatmapLayout& L = h.layout;
  auto box = [](const plot::Box& b) { return nlohmann::json::array({b.x, b.y, b.w, b.h}); };
  nlohmann::json j;
  j["image"] = opt.out;
  j["width"] = h.image.width;
  j["height"] = h.image.height;
  j["batch_rows"] = s.row_ids;
  std::vector<int64_t> heads = opt.show_heads;
  if (heads.empty())
    for (int64_t i = 0; i < opt.heads; ++i) heads.push_back(i);
  j["heads"] = heads;
  j["rows"] = L.rows;
  j["cols"] = L.cols;
  j["queries"] = L.queries;
  j["keys"] = L.keys;
  j["q_block"] = L.q_block;
  j["k_block"] = L.k_block;
  j["cells_q"] = L.cells_q;
  j["cells_k"] = L.cells_k;
  j["cell_w"] = L.cell_w;
  j["cell_h"] = L.cell_h;
  j["gap"] = L.gap;
  j["panels"] = nlohmann::json::array();
  for (const plot::Box& p : L.panels) j["panels"].push_back(box(p));
  j["colorbar"] = box(L.colorbar);
  j["mask_swatch"] = box(L.mask_swatch);
  j["vmin"] = h.vmin;
  j["vmax"] = h.vmax;
  const std::string text = j.dump(1) + "\n";
  io::write_file_atomic(opt.layout_json, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

void run_viz(const VizOptions& opt) {
  if (opt.rows.empty()) fail(kOp, "--rows: no row given; wanted at least one batch row");
  if (opt.heads <= 0) fail(kOp, "--heads: ", opt.heads, " is not a positive number of heads");
  const size_t shown = opt.show_heads.empty() ? static_cast<size_t>(opt.heads) : opt.show_heads.size();
  if (opt.rows.size() * shown > kMaxPanels)
    fail(kOp, opt.rows.size(), " rows x ", shown, " heads = ", opt.rows.size() * shown,
         " panels; at most ", kMaxPanels, " stay readable: choose fewer with --rows / --show-heads");
  if (opt.max_cells < 1) fail(kOp, "--max-cells: ", opt.max_cells, ", wanted >= 1");

  const AttentionSample s = sample_from_files(opt);
  AttentionFigure fig;
  fig.row_ids = s.row_ids;
  fig.heads = opt.show_heads;
  fig.max_cells = opt.max_cells;
  fig.title = !opt.title.empty() ? opt.title : "Attention weights (" + s.source + ")";
  const plot::Heatmaps h = draw_attention(s.weights, s.valid_lens, fig);
  if (!opt.layout_json.empty()) write_layout(opt, s, h);
  plot::write_png(opt.out, h.image);
  const plot::HeatmapLayout& L = h.layout;
  std::printf("wrote %s (%d x %d pixels): %d batch row(s) x %d head(s), each %lld x %lld (queries x keys)",
              opt.out.c_str(), h.image.width, h.image.height, L.rows, L.cols,
              static_cast<long long>(L.queries), static_cast<long long>(L.keys));
  if (L.q_block > 1 || L.k_block > 1)
    std::printf(", cells averaged over %lld x %lld", static_cast<long long>(L.q_block),
                static_cast<long long>(L.k_block));
  std::printf("; colour scale %.4g .. %.4g\n", h.vmin, h.vmax);
}

}  // namespace

void add_viz_command(CLI::App& app) {
  auto opt = std::make_shared<VizOptions>();
  CLI::App* cmd = app.add_subcommand("viz", "Draw attention weights as heatmaps, one panel per head (PNG)");
  cmd->add_option("--weights", opt->weights, "safetensors file with W_q/W_k/W_v/W_o weights (as for `mha run`)")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--inputs", opt->inputs, "safetensors file with queries, keys, values[, valid_lens]")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--heads", opt->heads, "Number of heads of the module")->required();
  cmd->add_option("--out", opt->out, "PNG file to write")->required();
  cmd->add_option("--rows", opt->rows, "Batch rows to draw, e.g. 0,2 (one row of panels each)")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--show-heads", opt->show_heads, "Heads to draw, e.g. 0,3 (default: all)")->delimiter(',');
  cmd->add_option("--max-cells", opt->max_cells,
                  "Most cells per panel axis; longer axes are averaged over blocks")->capture_default_str();
  cmd->add_option("--title", opt->title, "Title above the panels (default: names the inputs file)");
  cmd->add_option("--layout-json", opt->layout_json,
                  "Also write where each panel and cell is drawn (JSON), to annotate or check the picture");
  cmd->callback([opt] { run_viz(*opt); });
}

}  // namespace mha::tools
