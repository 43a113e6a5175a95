// `mha viz`: heatmaps of attention weights, one panel per (batch row, head).
//
// Two sources of weights:
//
//   mha viz --weights w.safetensors --inputs x.safetensors --heads 5
//           --rows 0,1 --show-heads 0,2,4 --out heads.png
//
// The weights and inputs files are those of `mha run` (see model_io.h); a
// pruned module's file (mha/prune.h) records its heads, so --heads may be
// left out, and its heads keep the numbers they had as built (--show-heads,
// titles). Only
// the chosen batch rows go through the module (evaluation mode, the module's
// attention_weights(), i.e. the d2l chapter's softmax before dropout); keys beyond a
// row's valid_len are drawn in the mask colour.
//
//   mha viz --checkpoint model.safetensors [--sample-seed 0] [--layer 0] --out heads.png
//
// A checkpoint of `mha train`: a batch of --sample-batch sequences is drawn
// from its task (the task's config is in the checkpoint) with
// Generator(--sample-seed), as OffsetPairTask::sample does in training, and
// the model runs on it in evaluation mode. The chosen layer's weights of the
// chosen sequences (--rows) are drawn with padding masked, both the padded
// keys and the padded queries; each head's title names its dominant offset
// (mha/inspect.h), found over the scored queries (t >= far) of the whole
// sampled batch.
//
// Both sources fill an AttentionSample; drawing and writing are shared.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention_figure.h"
#include "commands.h"
#include "mha/atomic_file.h"
#include "mha/mha.h"
#include "mha/plot.h"
#include "mask_args.h"
#include "model_io.h"
#include "outputs.h"

namespace mha::tools {

namespace {

const char* kOp = "viz";
constexpr size_t kMaxPanels = 64;  // beyond that no panel is readable: ask for fewer
// Enough sequences for steady offset means; the weights of 4096 sequences of
// 256 positions and 8 heads are already 8 GB, so larger is surely a typo.
constexpr int64_t kMaxSampleBatch = 4096;
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

struct VizOptions {
  std::string weights, inputs, out, title, layout_json;
  int64_t heads = 0;
  std::vector<int64_t> rows{0};     // --checkpoint without --rows: the longest sampled sequence
  bool rows_given = false;
  std::vector<int64_t> show_heads;  // empty: all
  int max_cells = 96;
  // The checkpoint source.
  std::string checkpoint;
  uint64_t sample_seed = 0;
  int64_t sample_batch = 32;
  int64_t layer = 0;
  std::vector<std::string> file_options_given;  // --weights / --inputs / --heads, refused with --checkpoint
  MaskArgs masks;  // --causal / --window, with --weights and --inputs
};

// Attention weights of some batch rows, ready to draw.
struct AttentionSample {
  Tensor weights;                // [R,H,Q,K]
  ValidLens valid_lens;          // none, [R] or [R,Q]
  std::vector<int64_t> row_ids;  // batch row of each of the R rows
  std::string source;            // what the weights are of, for the title
  int64_t num_heads = 0;         // H
  // The heads of weights by their number as built (empty: 0 .. H-1), and
  // --show-heads as positions among them.
  std::vector<int64_t> head_ids, shown;
  // Optional, see AttentionFigure.
  std::vector<std::string> head_titles, row_labels;
  std::string note;
  // Checkpoint source only: each head's dominant offset and its mean weight,
  // over the whole sampled batch, and the lengths of the R sequences drawn.
  std::vector<int64_t> offsets;
  std::vector<double> offset_weights;
  std::vector<int64_t> lengths;
};

// --show-heads numbers heads as the module was built (`built` of them);
// a pruned module keeps only `kept` -> their positions in the weights.
std::vector<int64_t> head_positions(const VizOptions& opt, int64_t built, const std::vector<int64_t>& kept) {
  std::vector<int64_t> positions;
  for (int64_t h : opt.show_heads) {
    if (h < 0 || h >= built)
      fail(kOp, "--show-heads: head ", h, " is outside the module's ", built, " heads (0 .. ", built - 1, ")");
    auto it = std::find(kept.begin(), kept.end(), h);
    if (it == kept.end()) {
      std::string list;
      for (int64_t k : kept) {
        if (!list.empty()) list += ',';
        list += std::to_string(k);
      }
      fail(kOp, "--show-heads: head ", h, " was pruned from this module (heads kept: ", list, ")");
    }
    positions.push_back(it - kept.begin());
  }
  return positions;
}

// True if a weights file records its heads (a file of mha::save_attention).
bool records_heads(const std::string& weights_path) {
  return read_safetensors(weights_path).metadata.count("num_heads") > 0;
}

AttentionSample sample_from_files(const VizOptions& opt) {
  MultiHeadAttention attention = load_attention(opt.weights, opt.heads, kOp);
  const AttentionInputs all = load_inputs(opt.inputs, kOp);
  const int64_t B = all.queries.dim() > 0 ? all.queries.size(0) : 0;
  for (int64_t r : opt.rows)
    if (r < 0 || r >= B)
      fail(kOp, "--rows: row ", r, " is outside the inputs' batch of ", B, " rows (0 .. ", B - 1, ")");
  AttentionSample s;
  s.shown = head_positions(opt, attention.original_num_heads(), attention.kept_heads());
  s.num_heads = attention.num_heads();
  if (attention.num_heads() < attention.original_num_heads()) {
    s.head_ids = attention.kept_heads();
    for (int64_t h : s.head_ids) s.head_titles.push_back("head " + std::to_string(h));
  }
  const AttentionInputs in = select_rows(all, opt.rows);
  attention.forward(in.queries, in.keys, in.values, in.valid_lens, opt.masks.call_masks());
  s.weights = attention.attention_weights();
  s.valid_lens = in.valid_lens;
  s.row_ids = opt.rows;
  s.source = std::filesystem::path(opt.inputs).filename().string();
  return s;
}

AttentionSample sample_from_checkpoint(const VizOptions& opt) {
  const Checkpoint ck = read_checkpoint(opt.checkpoint);
  std::unique_ptr<AttentionModel> model = load_model(ck);
  const int64_t L = model->num_layers();
  if (opt.layer < 0 || opt.layer >= L)
    fail(kOp, "--layer: layer ", opt.layer, " is outside the model's ", L, " layer(s) (0 .. ", L - 1, ")");
  // A pruned checkpoint's layer has fewer heads than it was built with.
  const MultiHeadAttention& layer = model->layer(opt.layer);
  const int64_t H = layer.num_heads();
  const std::vector<int64_t> shown = head_positions(opt, layer.original_num_heads(), layer.kept_heads());
  const std::vector<int64_t> head_ids = layer.kept_heads();
  for (int64_t r : opt.rows)
    if (r < 0 || r >= opt.sample_batch)
      fail(kOp, "--rows: row ", r, " is outside the sampled batch of ", opt.sample_batch,
           " sequences (0 .. ", opt.sample_batch - 1, "); see --sample-batch");

  const OffsetPairTask task(ck.config.task);
  Generator gen(opt.sample_seed);
  const TokenBatch batch = task.sample(opt.sample_batch, gen);
  const int64_t T = batch.length;
  model->forward(batch.tokens, batch.batch, T, batch.valid_lens());
  const Tensor& all = model->layer(opt.layer).attention_weights();  // [B,H,T,T]
  // Over the scored queries (t >= far): before them a head has nothing to find.
  const HeadOffsets found = head_offsets(all, batch.valid_lens(), ck.config.task.far);

  // Without --rows: the longest sequence (the first of them), the most to see.
  std::vector<int64_t> rows = opt.rows;
  if (!opt.rows_given)
    rows = {static_cast<int64_t>(std::max_element(batch.lengths.begin(), batch.lengths.end()) -
                                 batch.lengths.begin())};
  // Drawn: the first S positions, S the longest of the chosen sequences, so
  // that padding appears only where the chosen sequences differ in length.
  int64_t S = 0;
  for (int64_t b : rows) S = std::max(S, static_cast<int64_t>(batch.lengths[b]));

  AttentionSample s;
  const int64_t R = static_cast<int64_t>(rows.size());
  s.weights = Tensor({R, H, S, S});
  // Per query: a real position sees the keys before its sequence's length; a
  // padded query (t >= length) sees none, so its whole row is drawn masked.
  std::vector<float> lens(static_cast<size_t>(R * S));
  for (int64_t i = 0; i < R; ++i) {
    const int64_t b = rows[i];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < S; ++t)
        std::copy_n(all.data() + ((b * H + h) * T + t) * T, S, s.weights.data() + ((i * H + h) * S + t) * S);
    const float n = batch.lengths[b];
    for (int64_t t = 0; t < S; ++t) lens[i * S + t] = static_cast<float>(t) < n ? n : 0.0f;
    s.lengths.push_back(static_cast<int64_t>(n));
    s.row_labels.push_back("sequence " + std::to_string(b) + " (length " + std::to_string(s.lengths.back()) +
                           (s.lengths.back() < S ? ", padded to " + std::to_string(S) + ")" : ")"));
  }
  s.valid_lens = ValidLens::per_query(R, S, std::move(lens));
  s.row_ids = rows;
  s.num_heads = H;
  s.shown = shown;
  if (H < layer.original_num_heads()) s.head_ids = head_ids;
  s.offsets = found.offset;
  s.offset_weights = found.weight;
  for (int64_t h = 0; h < H; ++h) {
    char mean[32];
    std::snprintf(mean, sizeof mean, "%.2f", found.weight[h]);
    s.head_titles.push_back("head " + std::to_string(head_ids[static_cast<size_t>(h)]) + " (offset " +
                            std::to_string(found.offset[h]) +
                            ", mean " + mean + ")");
  }
  const OffsetPairTaskConfig& tc = ck.config.task;
  s.source = std::filesystem::path(opt.checkpoint).filename().string() + ", step " + std::to_string(ck.step) +
             ", layer " + std::to_string(opt.layer);
  const std::string near = std::to_string(tc.near), far = std::to_string(tc.far);
  s.note = "Task: target[t] = (token[t-" + near + "], token[t-" + far + "]), scored from t = " + far +
           " on (earlier queries have nothing to find).  Offset: query - key with the largest mean weight over the "
           "scored queries of " + std::to_string(opt.sample_batch) + " sampled sequences (seed " +
           std::to_string(opt.sample_seed) + ").";
  return s;
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
  std::vector<int64_t> heads = opt.show_heads;  // numbered as built
  if (heads.empty()) heads = s.head_ids;
  if (heads.empty())
    for (int64_t i = 0; i < s.num_heads; ++i) heads.push_back(i);
  j["heads"] = heads;
  if (!s.head_titles.empty()) j["head_titles"] = s.head_titles;
  if (!s.offsets.empty()) {
    j["offsets"] = s.offsets;
    j["offset_weights"] = s.offset_weights;
    j["lengths"] = s.lengths;
    j["layer"] = opt.layer;
    j["sample_seed"] = opt.sample_seed;
    j["sample_batch"] = opt.sample_batch;
  }
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

void check_panels(const VizOptions& opt, int64_t num_heads) {
  const size_t shown = opt.show_heads.empty() ? static_cast<size_t>(num_heads) : opt.show_heads.size();
  if (opt.rows.size() * shown > kMaxPanels)
    fail(kOp, opt.rows.size(), " rows x ", shown, " heads = ", opt.rows.size() * shown,
         " panels; at most ", kMaxPanels, " stay readable: choose fewer with --rows / --show-heads");
}

void run_viz(const VizOptions& opt) {
  if (opt.rows.empty()) fail(kOp, "--rows: no row given; wanted at least one batch row");
  io::check_output_path(opt.out);  // required: an empty --out is an error, not "off"
  check_outputs(kOp, {{"--out", opt.out}, {"--layout-json", opt.layout_json}}, {".png", ".json"},
                {{"--weights", opt.weights}, {"--inputs", opt.inputs}, {"--checkpoint", opt.checkpoint}});
  const bool from_checkpoint = !opt.checkpoint.empty();
  if (from_checkpoint && opt.masks.any())
    fail(kOp, opt.masks.window.empty() ? "--causal" : "--window", ": not taken with --checkpoint ",
         "(a trained model's attention runs with the masks it was trained with); give --weights and --inputs");
  if (from_checkpoint && !opt.file_options_given.empty())
    fail(kOp, opt.file_options_given.front(), ": give either --checkpoint or --weights, --inputs and --heads, "
         "not both (a checkpoint carries its own weights and heads)");
  if (!from_checkpoint) {
    auto given = [&](const char* o) {
      return std::find(opt.file_options_given.begin(), opt.file_options_given.end(), o) !=
             opt.file_options_given.end();
    };
    for (const char* o : {"--weights", "--inputs", "--heads"})
      // A file that records its heads (mha::save_attention) needs no --heads.
      if (!given(o) && !(std::string(o) == "--heads" && records_heads(opt.weights)))
        fail(kOp, o, ": required unless --checkpoint is given");
    if (given("--heads")) check_panels(opt, opt.heads);
  }

  const AttentionSample s = from_checkpoint ? sample_from_checkpoint(opt) : sample_from_files(opt);
  check_panels(opt, s.num_heads);
  AttentionFigure fig;
  fig.row_ids = s.row_ids;
  fig.heads = s.shown;
  fig.max_cells = opt.max_cells;
  fig.title = !opt.title.empty() ? opt.title : "Attention weights (" + s.source + ")";
  fig.head_titles = s.head_titles;
  fig.row_labels = s.row_labels;
  fig.note = s.note;
  fig.causal = opt.masks.causal;
  fig.window = opt.masks.call_masks().window;
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
  for (size_t i = 0; i < s.offsets.size(); ++i)
    std::printf("head %lld: dominant offset %lld (mean weight %.3f)\n",
                static_cast<long long>(s.head_ids.empty() ? static_cast<int64_t>(i) : s.head_ids[i]),
                static_cast<long long>(s.offsets[i]),
                s.offset_weights[i]);
}

}  // namespace

void add_viz_command(CLI::App& app) {
  auto opt = std::make_shared<VizOptions>();
  CLI::App* cmd = app.add_subcommand("viz", "Draw attention weights as heatmaps, one panel per head (PNG)");
  cmd->add_option("--weights", opt->weights, "safetensors file with W_q/W_k/W_v/W_o weights (as for `mha run`)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--inputs", opt->inputs, "safetensors file with queries, keys, values[, valid_lens]")
      ->check(CLI::ExistingFile);
  cmd->add_option("--heads", opt->heads,
                  "Number of heads of the module (as built; may be left out if the weights file records it)")
      ->transform(integer_in(1, kMaxInt));
  cmd->add_option("--checkpoint", opt->checkpoint,
                  "A checkpoint of `mha train`, instead of --weights/--inputs/--heads: draws its model's "
                  "attention on sequences sampled from its task")
      ->check(CLI::ExistingFile);
  CLI::Option* checkpoint = cmd->get_option("--checkpoint");
  cmd->add_option("--sample-seed", opt->sample_seed, "With --checkpoint: seed of the sampled sequences")
      ->needs(checkpoint)
      ->transform(unsigned_integer())
      ->capture_default_str();
  cmd->add_option("--sample-batch", opt->sample_batch,
                  "With --checkpoint: sequences sampled (the offsets in the titles are over all of their scored queries)")
      ->transform(integer_in(1, kMaxSampleBatch))->needs(checkpoint)->capture_default_str();
  cmd->add_option("--layer", opt->layer, "With --checkpoint: the layer whose heads are drawn")
      ->transform(integer_in(0, kMaxInt))->needs(checkpoint)->capture_default_str();
  cmd->add_option("--out", opt->out, "PNG file to write")->required();
  cmd->add_option("--rows", opt->rows, "Batch rows (or sampled sequences; default with --checkpoint: the longest) to draw, e.g. 0,2")
      ->delimiter(',')->transform(integer_in(0, kMaxInt, /*allow_empty=*/true))->capture_default_str();
  cmd->add_option("--show-heads", opt->show_heads,
                  "Heads to draw, e.g. 0,3, numbered as built (default: all the module has)")
      ->delimiter(',')->transform(integer_in(0, kMaxInt));
  cmd->add_option("--max-cells", opt->max_cells,
                  "Most cells per panel axis; longer axes are averaged over blocks")
      ->transform(integer_in(1, kMaxInt))->capture_default_str();
  cmd->add_option("--title", opt->title, "Title above the panels (default: names the inputs file or checkpoint)");
  cmd->add_option("--layout-json", opt->layout_json,
                  "Also write where each panel and cell is drawn (JSON), to annotate or check the picture");
  add_mask_options(cmd, opt->masks);
  cmd->callback([opt, cmd] {
    opt->file_options_given.clear();
    opt->rows_given = cmd->count("--rows") > 0;
    // `--rows ""` would leave the default row in place: a silent guess. It
    // means no row at all, which run_viz refuses.
    if (opt->rows_given) {
      const std::vector<std::string>& raw = cmd->get_option("--rows")->results();
      if (std::all_of(raw.begin(), raw.end(), [](const std::string& r) { return r.empty(); })) opt->rows.clear();
    }
    for (const char* o : {"--weights", "--inputs", "--heads"})
      if (cmd->count(o) > 0) opt->file_options_given.push_back(o);
    run_viz(*opt);
  });
}

}  // namespace mha::tools
