// Heatmap grids: each check reads the PNG back through cairo's own reader
// and turns colours back into numbers with the inverse colour map.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <random>
#include <string>

#include "mha/error.h"
#include "mha/plot.h"
#include "png_decode.h"

using namespace mha::plot;
using mha::Tensor;

namespace {

// Renders, writes and reads back through cairo's file reader.
struct Rendered {
  Heatmaps h;
  std::string path;
  std::unique_ptr<DecodedPng> png;
  Rendered(const Tensor& w, const HeatmapOptions& opt) : h(render_heatmaps(w, opt)) {
    char tmpl[] = "/tmp/mha-heatmap-test-XXXXXX";
    const int fd = mkstemp(tmpl);
    close(fd);
    path = tmpl;
    write_png(path, h.image);
    png = std::make_unique<DecodedPng>(path);
  }
  ~Rendered() { std::remove(path.c_str()); }
  Rgb at_cell(int r, int c, int64_t q, int64_t k) const {
    int x, y;
    h.layout.cell_center(r, c, q, k, &x, &y);
    return png->rgb(x, y);
  }
  // The value a cell's colour stands for on the figure's colour scale.
  double value_at(int r, int c, int64_t q, int64_t k) const {
    return h.vmin + colormap_inverse(at_cell(r, c, q, k)) * (h.vmax - h.vmin);
  }
};

Tensor random_weights(mha::Shape shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Tensor t(shape);
  for (float& v : t.values()) v = u(gen);
  return t;
}

}  // namespace

TEST(PlotHeatmap, EveryCellShowsItsValue) {
  const Tensor w = random_weights({2, 3, 5, 7}, 1);
  HeatmapOptions opt;
  opt.titles = {"a", "b", "c", "d", "e", "f"};
  const Rendered r(w, opt);
  ASSERT_TRUE(r.png->ok());
  EXPECT_EQ(r.png->width, r.h.image.width);
  EXPECT_EQ(r.png->height, r.h.image.height);
  // Automatic scale: from 0 (the data are weights, >= 0) to the data's max.
  float lo = w.values()[0], hi = lo;
  for (float v : w.values()) lo = std::min(lo, v), hi = std::max(hi, v);
  lo = std::min(lo, 0.0f);
  EXPECT_DOUBLE_EQ(r.h.vmin, lo);
  EXPECT_DOUBLE_EQ(r.h.vmax, hi);
  const double tol = kColormapResolution * (hi - lo) + 1e-6;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int64_t q = 0; q < 5; ++q)
        for (int64_t k = 0; k < 7; ++k)
          ASSERT_NEAR(r.value_at(i, j, q, k), w.at({i, j, q, k}), tol)
              << "panel (" << i << ", " << j << ") cell (" << q << ", " << k << ")";
}

TEST(PlotHeatmap, MaskedCellsCarryTheMaskColour) {
  // Row b of each panel masks keys k >= 1 + q, like per-query valid lengths.
  Tensor w = random_weights({1, 2, 6, 6}, 2);
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t q = 0; q < 6; ++q)
      for (int64_t k = q + 1; k < 6; ++k) w.at({0, c, q, k}) = NAN;
  const Rendered r(w, {});
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t q = 0; q < 6; ++q)
      for (int64_t k = 0; k < 6; ++k) {
        const Rgb px = r.at_cell(0, static_cast<int>(c), q, k);
        if (k > q) {
          EXPECT_EQ(px, kMaskColor) << q << ", " << k;
        } else {
          EXPECT_NE(px, kMaskColor) << q << ", " << k;
        }
      }
  // The legend swatch shows the same colour.
  const Box& s = r.h.layout.mask_swatch;
  ASSERT_GT(s.w, 0);
  EXPECT_EQ(r.png->rgb(s.x + s.w / 2, s.y + s.h / 2), kMaskColor);
}

TEST(PlotHeatmap, NoSwatchWithoutMaskedCells) {
  const Rendered r(random_weights({1, 1, 3, 3}, 3), {});
  EXPECT_EQ(r.h.layout.mask_swatch.w, 0);
}

TEST(PlotHeatmap, PanelsAppearInRowMajorOrder) {
  // Panel (i, j) is constant (i * C + j) / (R * C - 1): each panel names its index.
  const int R = 3, C = 4;
  Tensor w({R, C, 3, 5});
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j)
      for (int64_t q = 0; q < 3; ++q)
        for (int64_t k = 0; k < 5; ++k) w.at({i, j, q, k}) = float(i * C + j) / (R * C - 1);
  const Rendered r(w, {});
  const auto& panels = r.h.layout.panels;
  ASSERT_EQ(panels.size(), static_cast<size_t>(R * C));
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      const Box& p = panels[i * C + j];
      if (j > 0) {
        EXPECT_GT(p.x, panels[i * C + j - 1].x + panels[i * C + j - 1].w);  // left to right
      }
      if (i > 0) {
        EXPECT_GT(p.y, panels[(i - 1) * C + j].y + panels[(i - 1) * C + j].h);  // top to bottom
      }
      for (int64_t q = 0; q < 3; ++q)
        for (int64_t k = 0; k < 5; ++k)
          EXPECT_NEAR(colormap_inverse(r.at_cell(i, j, q, k)), double(i * C + j) / (R * C - 1),
                      kColormapResolution + 1e-9);
    }
}

TEST(PlotHeatmap, LargeMatricesAreAveragedOverBlocks) {
  // 300 x 500 with max_cells 96: blocks of 4 queries x 6 keys, the last key
  // block holding 500 - 83 * 6 = 2 keys; keys >= 250 masked in panel 1.
  const int64_t Q = 300, K = 500;
  Tensor w = random_weights({1, 2, Q, K}, 4);
  for (int64_t q = 0; q < Q; ++q)
    for (int64_t k = 250; k < K; ++k) w.at({0, 1, q, k}) = NAN;
  const Rendered r(w, {});
  const HeatmapLayout& L = r.h.layout;
  EXPECT_EQ(L.q_block, 4);
  EXPECT_EQ(L.k_block, 6);
  EXPECT_EQ(L.cells_q, 75);
  EXPECT_EQ(L.cells_k, 84);
  const double tol = kColormapResolution * (r.h.vmax - r.h.vmin) + 1e-6;
  for (int c = 0; c < 2; ++c)
    for (int64_t i = 0; i < L.cells_q; i += 7)
      for (int64_t j = 0; j < L.cells_k; ++j) {
        double sum = 0;
        int n = 0;
        for (int64_t q = i * 4; q < std::min(Q, i * 4 + 4); ++q)
          for (int64_t k = j * 6; k < std::min(K, j * 6 + 6); ++k)
            if (!std::isnan(w.at({0, c, q, k}))) sum += w.at({0, c, q, k}), ++n;
        const Rgb px = r.at_cell(0, c, i * 4, j * 6);
        if (n == 0) {
          EXPECT_EQ(px, kMaskColor) << "panel " << c << " block (" << i << ", " << j << ")";
          continue;
        }
        EXPECT_NEAR(r.h.drawn.at({0, c, i, j}), sum / n, 1e-5);
        EXPECT_NEAR(r.h.vmin + colormap_inverse(px) * (r.h.vmax - r.h.vmin), sum / n, tol)
            << "panel " << c << " block (" << i << ", " << j << ")";
      }
  // A larger max_cells draws every key.
  HeatmapOptions no_avg;
  no_avg.max_cells = 500;
  EXPECT_EQ(render_heatmaps(w, no_avg).layout.k_block, 1);
}

TEST(PlotHeatmap, ReadableSizeForAnyShape) {
  // Whatever Q and K, a panel is between 48 and 400 pixels a side and small
  // matrices get cells of at least 10 pixels with a gap between them.
  for (auto [Q, K] : {std::pair<int64_t, int64_t>{1, 1}, {1, 2}, {2, 3}, {4, 6}, {1, 5000}, {5000, 1},
                      {97, 97}, {1000, 3}, {333, 777}}) {
    const Heatmaps h = render_heatmaps(random_weights({1, 1, Q, K}, 5), {});
    const Box& p = h.layout.panels[0];
    EXPECT_GE(p.w, 48) << Q << " x " << K;
    EXPECT_GE(p.h, 48) << Q << " x " << K;
    EXPECT_LE(p.w, 400) << Q << " x " << K;
    EXPECT_LE(p.h, 400) << Q << " x " << K;
    EXPECT_LE(h.layout.cells_q, 96);
    EXPECT_LE(h.layout.cells_k, 96);
    if (Q <= 6 && K <= 6) {
      EXPECT_GE(h.layout.cell_w, 10);
      EXPECT_GE(h.layout.cell_h, 10);
      EXPECT_EQ(h.layout.gap, 1);
    }
  }
  // Many panels stay within a screen-sized picture.
  const Heatmaps many = render_heatmaps(random_weights({4, 8, 50, 50}, 6), {});
  EXPECT_LE(many.image.width, 2000);
  EXPECT_LE(many.image.height, 2000);
}

TEST(PlotHeatmap, GivenScaleClampsValuesOutsideIt) {
  Tensor w({1, 1, 1, 4}, std::vector<float>{-1.0f, 0.25f, 0.75f, 2.0f});
  HeatmapOptions opt;
  opt.vmin = 0.0;
  opt.vmax = 1.0;
  const Rendered r(w, opt);
  EXPECT_EQ(r.h.vmin, 0.0);
  EXPECT_EQ(r.h.vmax, 1.0);
  EXPECT_EQ(r.at_cell(0, 0, 0, 0), colormap(0.0));
  EXPECT_NEAR(r.value_at(0, 0, 0, 1), 0.25, kColormapResolution);
  EXPECT_NEAR(r.value_at(0, 0, 0, 2), 0.75, kColormapResolution);
  EXPECT_EQ(r.at_cell(0, 0, 0, 3), colormap(1.0));
}

TEST(PlotHeatmap, ConstantDataStillHasARange) {
  // The d2l chapter's ones inputs give equal weights 1/3: the automatic
  // scale is anchored at 0, so they take the brightest colour, not the
  // darkest one that readers take for zero; and the bar is labelled.
  const Rendered r(Tensor({1, 2, 3, 3}, 1.0f / 3), {});
  EXPECT_EQ(r.h.vmin, 0.0);
  EXPECT_DOUBLE_EQ(r.h.vmax, 1.0f / 3);
  EXPECT_EQ(r.at_cell(0, 1, 2, 2), colormap(1.0));
  EXPECT_NEAR(r.value_at(0, 1, 2, 2), 1.0 / 3, kColormapResolution * (r.h.vmax - r.h.vmin) + 1e-6);
  EXPECT_STREQ(kDefaultColorbarLabel, "attention weight");
  // Negative data keep their own low end.
  const Heatmaps neg = render_heatmaps(Tensor({1, 1, 1, 2}, {-1.0f, 1.0f}), {});
  EXPECT_EQ(neg.vmin, -1.0);
  // With vmin fixed at 0, as `mha viz` draws weights, the top is the data's value.
  HeatmapOptions opt;
  opt.vmin = 0;
  const Heatmaps h = render_heatmaps(Tensor({1, 1, 2, 2}, 0.5f), opt);
  EXPECT_EQ(h.vmin, 0.0);
  EXPECT_DOUBLE_EQ(h.vmax, 0.5);
}

TEST(PlotHeatmap, AllMaskedIsDrawnNotRejected) {
  const Rendered r(Tensor({1, 1, 2, 3}, NAN), {});
  EXPECT_EQ(r.at_cell(0, 0, 1, 2), kMaskColor);
}

TEST(PlotHeatmap, BadInputIsAnErrorNamingTheArgument) {
  auto message = [](const Tensor& w, const HeatmapOptions& opt) -> std::string {
    try {
      render_heatmaps(w, opt);
    } catch (const mha::Error& e) {
      return e.what();
    }
    return "no error";
  };
  const HeatmapOptions none;
  EXPECT_NE(message(Tensor({2, 3, 4}), none).find("(rows, cols, Q, K)"), std::string::npos);
  EXPECT_NE(message(Tensor({1, 0, 4, 4}), none).find("empty axis"), std::string::npos);
  EXPECT_NE(message(Tensor({1, 1, 2, 2}, INFINITY), none).find("infinite"), std::string::npos);
  HeatmapOptions titles;
  titles.titles = {"only one"};
  EXPECT_NE(message(Tensor({1, 2, 2, 2}), titles).find("titles: 1 given"), std::string::npos);
  HeatmapOptions rows;
  rows.row_labels = {"a", "b"};
  EXPECT_NE(message(Tensor({1, 2, 2, 2}), rows).find("row_labels"), std::string::npos);
  HeatmapOptions scale;
  scale.vmin = 1;
  scale.vmax = 0;
  EXPECT_NE(message(Tensor({1, 1, 2, 2}), scale).find("vmin 1 > vmax 0"), std::string::npos);
  HeatmapOptions cells;
  cells.max_cells = 0;
  EXPECT_NE(message(Tensor({1, 1, 2, 2}), cells).find("max_cells"), std::string::npos);
  for (const std::string& m : {message(Tensor({2, 3, 4}), none)})
    EXPECT_EQ(m.rfind("[plot.render_heatmaps]", 0), 0u) << m;
}

TEST(PlotHeatmap, ShadedTextRampAndMask) {
  Tensor m({2, 3}, std::vector<float>{0.0f, 0.5f, 1.0f, NAN, 0.999f, 0.05f});
  const std::string s = shade_matrix(m, 0.0, 1.0);
  EXPECT_EQ(s, "  ++@@\n//@@  \n");  // 0.5 is level 5 of 10: "+"
  EXPECT_THROW(shade_matrix(Tensor({1, 2, 2}), 0, 1), mha::Error);
  EXPECT_THROW(shade_matrix(m, 1, 1), mha::Error);
}
