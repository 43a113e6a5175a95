// Triggers of docs/errors.md's rows for pictures (mha/plot.h and the cairo
// canvas behind it), head_offsets (mha/inspect.h) and the tool's figure and
// input helpers (tools/attention_figure.h, tools/model_io.h); see
// error_catalogue.h.
#include <cairo.h>

#include <cmath>

#include "attention_figure.h"
#include "error_catalogue.h"
#include "model_io.h"
#include "mha/plot.h"
#include "plot/canvas.h"

namespace mha::test {

namespace {

using plot::HeatmapOptions;
using plot::LinePanel;

void heatmaps(const Tensor& w) { plot::render_heatmaps(w); }

// render_heatmaps(w) with the options `change` sets.
template <typename Change>
void heatmaps(const Tensor& w, Change change) {
  HeatmapOptions o;
  change(o);
  plot::render_heatmaps(w, o);
}

// A series named "s" (the name is built, not assigned from a literal:
// GCC 12's -Wrestrict misfires on that).
plot::Series series(std::vector<double> x, std::vector<double> y) {
  plot::Series s;
  s.name = std::string(1, 's');
  s.x = std::move(x);
  s.y = std::move(y);
  return s;
}

plot::Image image(int width, int height, size_t bytes) {
  plot::Image im;
  im.width = width;
  im.height = height;
  im.rgba.assign(bytes, 0);
  return im;
}

// A panel with one series "s" through (0, 1), (1, 2), with `change` applied.
template <typename Change>
void chart(Change change) {
  LinePanel p;
  p.title = "loss";
  p.series.push_back(series({0, 1}, {1, 2}));
  change(p);
  plot::render_line_chart({p});
}

Tensor softmax_rows(Shape s) { return Tensor(s, 1.0f / static_cast<float>(s.back())); }

tools::AttentionInputs inputs(int64_t B) {
  tools::AttentionInputs in;
  in.queries = ones({B, 3, 4});
  in.keys = ones({B, 5, 4});
  in.values = ones({B, 5, 4});
  return in;
}

}  // namespace

Triggers plot_triggers() {
  return {
      // heatmaps
      {"heatmap.rank", [] { heatmaps(ones({2, 3, 4})); }},
      {"heatmap.empty", [] { heatmaps(ones({1, 2, 0, 4})); }},
      {"heatmap.infinite", [] {
         Tensor w = ones({1, 2, 2, 2});
         w.at({0, 1, 0, 1}) = -INFINITY;
         heatmaps(w);
       }},
      {"heatmap.titles", [] { heatmaps(ones({2, 2, 3, 3}), [](HeatmapOptions& o) { o.titles = {"a", "b", "c"}; }); }},
      {"heatmap.row_labels", [] { heatmaps(ones({2, 2, 3, 3}), [](HeatmapOptions& o) { o.row_labels = {"a"}; }); }},
      {"heatmap.max_cells", [] { heatmaps(ones({1, 1, 3, 3}), [](HeatmapOptions& o) { o.max_cells = 0; }); }},
      {"heatmap.panel_size", [] { heatmaps(ones({1, 1, 3, 3}), [](HeatmapOptions& o) { o.panel_size = -1; }); }},
      {"heatmap.panel_size_max",
       [] { heatmaps(ones({1, 1, 3, 3}), [](HeatmapOptions& o) { o.panel_size = 1000000; }); }},
      {"heatmap.limits", [] { heatmaps(ones({1, 1, 3, 3}), [](HeatmapOptions& o) { o.vmin = -INFINITY; }); }},
      {"heatmap.order", [] {
         heatmaps(ones({1, 1, 3, 3}), [](HeatmapOptions& o) {
           o.vmin = 1;
           o.vmax = 0.5;
         });
       }},
      {"heatmap.size", [] { heatmaps(ones({1, 500, 1, 1})); }},
      {"heatmap.cell", [] {
         const plot::Heatmaps h = plot::render_heatmaps(ones({1, 2, 3, 3}));
         int x = 0, y = 0;
         h.layout.cell_center(0, 2, 0, 0, &x, &y);
       }},
      {"shade.rank", [] { plot::shade_matrix(ones({3}), 0, 1); }},
      {"shade.order", [] { plot::shade_matrix(ones({2, 2}), 1, 1); }},
      {"colormap.entry", [] { plot::colormap_entry(256); }},
      // images and PNG
      {"image.pixel", [] {
         image(2, 1, 8).rgb_at(2, 0);
       }},
      {"image.format", [] {
         cairo_surface_t* s = cairo_image_surface_create(CAIRO_FORMAT_A8, 2, 2);
         try {
           plot::detail::image_from_surface(s);
         } catch (...) {
           cairo_surface_destroy(s);
           throw;
         }
       }},
      {"png.image", [] { plot::encode_png(image(4, 0, 0)); }},
      {"png.surface", [] {
         plot::encode_png(image(40000, 1, 160000));
       }},
      {"png.read", [] { plot::decode_png({'G', 'I', 'F', '8'}, "picture.gif"); }},
      {"canvas.size", [] { plot::detail::Canvas(0, 10); }},
      // line charts
      {"line.lengths", [] { chart([](LinePanel& p) { p.series[0].y.push_back(3); }); }},
      {"line.infinite", [] { chart([](LinePanel& p) { p.series[0].x[1] = INFINITY; }); }},
      {"line.log_point", [] { chart([](LinePanel& p) { p.log_y = true; p.series[0].y[0] = 0; }); }},
      {"line.no_point", [] { chart([](LinePanel& p) { p.series[0].y = {NAN, NAN}; }); }},
      {"line.limit", [] { chart([](LinePanel& p) { p.ymax = INFINITY; }); }},
      {"line.x_order", [] { chart([](LinePanel& p) { p.xmin = 2; p.xmax = 1; }); }},
      {"line.y_order", [] { chart([](LinePanel& p) { p.ymin = 1; p.ymax = 1; }); }},
      {"line.log_limits", [] { chart([](LinePanel& p) { p.log_y = true; p.ymin = 0; }); }},
      {"line.no_panels", [] { plot::render_line_chart({}); }},
      {"line.size", [] {
         LinePanel p;
         p.series.push_back(series({0, 1}, {1, 2}));
         plot::LineChartOptions o;
         o.plot_width = 20;
         plot::render_line_chart({p}, o);
       }},
      // head_offsets
      {"offsets.rank", [] { head_offsets(softmax_rows({2, 3, 3})); }},
      {"offsets.empty", [] { head_offsets(softmax_rows({1, 0, 3, 3})); }},
      {"offsets.lens", [] { head_offsets(softmax_rows({2, 1, 3, 3}), ValidLens::per_batch({3, 3, 3})); }},
      {"offsets.first_query", [] { head_offsets(softmax_rows({1, 1, 4, 4}), {}, 4); }},
      {"offsets.nonfinite", [] {
         Tensor w = softmax_rows({1, 1, 3, 3});
         w.at({0, 0, 1, 0}) = NAN;
         head_offsets(w);
       }},
      {"offsets.no_pair", [] { head_offsets(softmax_rows({1, 1, 3, 3}), ValidLens::per_batch({0})); }},
      // the tool's figure and input helpers (what `mha viz` draws with)
      {"viz.weights_rank", [] { tools::masked_heads(ones({2, 3, 3}), {}, {}); }},
      {"viz.head", [] { tools::masked_heads(ones({1, 2, 3, 3}), {}, {2}); }},
      {"viz.row_ids", [] {
         tools::AttentionFigure f;
         f.row_ids = {0, 1};
         tools::draw_attention(ones({1, 2, 3, 3}), {}, f);
       }},
      {"viz.head_titles", [] {
         tools::AttentionFigure f;
         f.row_ids = {0};
         f.head_titles = {"a"};
         tools::draw_attention(ones({1, 2, 3, 3}), {}, f);
       }},
      {"viz.row_labels", [] {
         tools::AttentionFigure f;
         f.row_ids = {0};
         f.row_labels = {"a", "b"};
         tools::draw_attention(ones({1, 2, 3, 3}), {}, f);
       }},
      {"viz.select_row", [] { tools::select_rows(inputs(2), {0, 2}); }},
      {"viz.select_shapes", [] {
         tools::AttentionInputs in = inputs(2);
         in.values = ones({1, 5, 4});
         tools::select_rows(in, {0});
       }},
  };
}

}  // namespace mha::test
