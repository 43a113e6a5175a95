// `mha demo`: the d2l chapter's check, with each head's attention weights shown.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "attention_figure.h"
#include "commands.h"
#include "outputs.h"
#include "mha/mha.h"
#include "mha/plot.h"

namespace mha::tools {

namespace {

struct DemoOptions {
  uint64_t seed = 0;
  std::string heatmap = "mha-demo-heatmap.png";
  bool no_heatmap = false;
};

// The d2l chapter's first exercise: the weights of every head as a picture, and in a
// terminal a shaded sketch of head 0 of batch row 0.
void show_heatmap(const DemoOptions& opt, const Tensor& w, const ValidLens& valid_lens) {
  AttentionFigure fig;
  fig.row_ids = {0, 1};
  fig.title = "Attention weights of the d2l chapter's example, every head (ones inputs, valid_lens [3, 2])";
  const plot::Heatmaps h = draw_attention(w, valid_lens, fig);
  plot::write_png(opt.heatmap, h.image);
  std::printf("\nheatmap of the weights above (2 batch rows x %lld heads): wrote %s\n",
              static_cast<long long>(w.size(1)), opt.heatmap.c_str());
  if (!isatty(STDOUT_FILENO)) return;
  const Tensor rows_head0 = masked_heads(w, valid_lens, {0});  // [2,1,Q,K]: row 0 comes first
  const int64_t Q = w.size(2), K = w.size(3);
  const Tensor head0({Q, K}, std::vector<float>(rows_head0.data(), rows_head0.data() + Q * K));
  const float top = *std::max_element(w.values().begin(), w.values().end());
  std::printf("\nhead 0 of batch row 0 as text: '%s' shades 0 .. %.4f, '//' is masked\n", plot::kShadeRamp, top);
  std::printf("           keys 0..%lld\n", static_cast<long long>(K - 1));
  const std::string shaded = plot::shade_matrix(head0, 0.0, top > 0 ? top : 1.0);
  size_t start = 0;
  for (int64_t q = 0; q < Q; ++q) {
    const size_t end = shaded.find('\n', start);
    std::printf("  query %lld  |%s|\n", static_cast<long long>(q), shaded.substr(start, end - start).c_str());
    start = end + 1;
  }
}

void run_demo(const DemoOptions& opt) {
  if (!opt.no_heatmap) check_outputs("demo", {{"--heatmap", opt.heatmap}}, {".png"});
  // The d2l chapter's example: num_hiddens 100, 5 heads, dropout 0.5; B 2, Q 4, K 6;
  // valid_lens [3, 2]; X = ones(2, 4, 100), Y = ones(2, 6, 100).
  const int64_t num_hiddens = 100, num_heads = 5, batch = 2, queries = 4, kvpairs = 6;
  MultiHeadAttention attention(num_hiddens, num_heads, 0.5f, /*bias=*/false, opt.seed);
  const ValidLens valid_lens = ValidLens::per_batch({3, 2});
  const Tensor X({batch, queries, num_hiddens}, 1.0f);
  const Tensor Y({batch, kvpairs, num_hiddens}, 1.0f);
  const Tensor out = attention(X, Y, Y, valid_lens);  // training mode, as in the d2l chapter

  const Shape wanted = {batch, queries, num_hiddens};
  std::printf("mha %s: the d2l chapter's check\n", kVersion);
  std::printf("  MultiHeadAttention(num_hiddens=%lld, num_heads=%lld, dropout=0.5), training mode\n",
              static_cast<long long>(num_hiddens), static_cast<long long>(num_heads));
  std::printf("  queries X = ones(2, 4, 100), keys = values Y = ones(2, 6, 100), valid_lens = [3, 2]\n");
  std::printf("output shape: %s  (batch_size, num_queries, num_hiddens) = %s: %s\n",
              shape_str(out.shape()).c_str(), shape_str(wanted).c_str(),
              out.shape() == wanted ? "ok" : "MISMATCH");
  if (out.shape() != wanted) throw Error("[demo] output shape differs from the d2l chapter's check");

  const Tensor& w = attention.attention_weights();  // (B, h, Q, K)
  std::printf("\nattention weights of batch row 0 (valid_len 3: keys 3..5 are masked)\n");
  for (int64_t h = 0; h < num_heads; ++h) {
    std::printf("head %lld    ", static_cast<long long>(h));
    for (int64_t k = 0; k < kvpairs; ++k) std::printf("   key %lld", static_cast<long long>(k));
    std::printf("\n");
    for (int64_t q = 0; q < queries; ++q) {
      std::printf("  query %lld ", static_cast<long long>(q));
      for (int64_t k = 0; k < kvpairs; ++k) std::printf("  %6.4f", w.at({0, h, q, k}));
      std::printf("\n");
    }
  }
  if (!opt.no_heatmap) show_heatmap(opt, w, valid_lens);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "Run the d2l chapter's check and show each head's weights");
  cmd->add_option("--seed", opt->seed, "Seed of the initialisation and dropout")
      ->transform(unsigned_integer())->capture_default_str();
  CLI::Option* heatmap =
      cmd->add_option("--heatmap", opt->heatmap, "PNG file for the heatmap of every head's weights")
          ->capture_default_str();
  cmd->add_flag("--no-heatmap", opt->no_heatmap, "Do not write the heatmap")->excludes(heatmap);
  cmd->callback([opt] { run_demo(*opt); });
}

}  // namespace mha::tools
