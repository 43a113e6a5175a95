// Line charts: lines land where the data says, in the palette's order.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mha/error.h"
#include "mha/plot.h"

using namespace mha::plot;

namespace {

Series line(std::string name, std::vector<double> x, std::vector<double> y) {
  Series s;
  s.name = std::move(name);
  s.x = std::move(x);
  s.y = std::move(y);
  return s;
}

// The pixel under data point (x, y) of panel p. A 2-pixel line always covers
// the whole pixel row (or column) its centre passes through.
Rgb pixel_at(const LineChart& c, size_t p, double x, double y) {
  const PlotArea& a = c.areas[p];
  return c.image.rgb_at(static_cast<int>(std::floor(a.to_x(x))), static_cast<int>(std::floor(a.to_y(y))));
}

// Whether a sloped line passes at (x, y): a 2-pixel line covers at least one
// whole pixel of the 3 x 3 block around the point, in its exact colour.
bool passes(const LineChart& c, size_t p, double x, double y, Rgb color) {
  const PlotArea& a = c.areas[p];
  const int px = static_cast<int>(std::floor(a.to_x(x))), py = static_cast<int>(std::floor(a.to_y(y)));
  for (int dy = -1; dy <= 1; ++dy)
    for (int dx = -1; dx <= 1; ++dx)
      if (c.image.rgb_at(px + dx, py + dy) == color) return true;
  return false;
}

}  // namespace

TEST(PlotLineChart, SeriesAreDrawnWhereTheDataIsInPaletteOrder) {
  LinePanel p;
  p.title = "two flat lines";
  p.series = {line("low", {0, 10}, {1, 1}), line("high", {0, 10}, {3, 3})};
  const LineChart c = render_line_chart({p});
  ASSERT_EQ(c.areas.size(), 1u);
  for (double x : {2.0, 5.0, 7.5}) {
    EXPECT_EQ(pixel_at(c, 0, x, 1), kPalette[0]) << "x " << x;
    EXPECT_EQ(pixel_at(c, 0, x, 3), kPalette[1]) << "x " << x;
    EXPECT_NE(pixel_at(c, 0, x, 2), kPalette[0]);  // nothing between them
    EXPECT_NE(pixel_at(c, 0, x, 2), kPalette[1]);
  }
  // The y range covers the data with a margin, the x range is the data's.
  EXPECT_LT(c.areas[0].ymin, 1);
  EXPECT_GT(c.areas[0].ymax, 3);
  EXPECT_EQ(c.areas[0].xmin, 0);
  EXPECT_EQ(c.areas[0].xmax, 10);
}

TEST(PlotLineChart, GivenColourAndNanGaps) {
  LinePanel p;
  Series s = line("gappy", {0, 1, 2, 3, 4, 5}, {1, 1, NAN, NAN, 1, 1});
  s.color = Rgb{10, 200, 30};
  p.series = {s, line("", {0, 5}, {0, 2})};
  const LineChart c = render_line_chart({p});
  EXPECT_EQ(pixel_at(c, 0, 0.5, 1), (Rgb{10, 200, 30}));
  EXPECT_EQ(pixel_at(c, 0, 4.5, 1), (Rgb{10, 200, 30}));
  EXPECT_NE(pixel_at(c, 0, 2.5, 1), (Rgb{10, 200, 30}));  // the gap
}

TEST(PlotLineChart, PanelsSideBySide) {
  LinePanel a, b;
  a.title = "loss";
  a.series = {line("train", {0, 1, 2}, {3, 2, 1})};
  b.title = "accuracy";
  b.series = {line("held-out", {0, 1, 2}, {0.1, 0.5, 0.9})};
  const LineChart c = render_line_chart({a, b});
  ASSERT_EQ(c.areas.size(), 2u);
  EXPECT_GT(c.areas[1].box.x, c.areas[0].box.x + c.areas[0].box.w);
  EXPECT_EQ(c.areas[1].box.y, c.areas[0].box.y);
  EXPECT_LE(c.areas[1].box.x + c.areas[1].box.w, c.image.width);
  EXPECT_TRUE(passes(c, 1, 1, 0.5, kPalette[0]));
  EXPECT_TRUE(passes(c, 0, 1, 2, kPalette[0]));
  EXPECT_FALSE(passes(c, 1, 1, 0.2, kPalette[0]));
}

TEST(PlotLineChart, LogAxisSpacesDecadesEqually) {
  LinePanel p;
  p.log_y = true;
  p.series = {line("loss", {0, 1, 2, 3}, {100, 10, 1, 0.1})};
  const LineChart c = render_line_chart({p});
  const PlotArea& a = c.areas[0];
  EXPECT_NEAR(a.to_y(1) - a.to_y(10), a.to_y(10) - a.to_y(100), 1e-9);
  EXPECT_GT(a.to_y(0.1), a.to_y(100));  // larger values higher up
  EXPECT_TRUE(passes(c, 0, 1.5, std::sqrt(10.0), kPalette[0]));  // straight on a log axis
  EXPECT_FALSE(passes(c, 0, 1.5, 5.5, kPalette[0]));              // not through the linear midpoint
}

TEST(PlotLineChart, LegendNeverHidesTheData) {
  // Lines along the top and the bottom cross all four corners: the legend
  // must go beside the plot.
  LinePanel p;
  p.series = {line("top", {0, 1}, {1, 1}), line("bottom", {0, 1}, {0, 0})};
  LineChartOptions opt;
  opt.plot_width = 300;
  const LineChart c = render_line_chart({p}, opt);
  for (double x : {0.02, 0.1, 0.2, 0.8, 0.9, 0.98}) {
    EXPECT_EQ(pixel_at(c, 0, x, 1), kPalette[0]) << x;
    EXPECT_EQ(pixel_at(c, 0, x, 0), kPalette[1]) << x;
  }
  EXPECT_GT(c.image.width, c.areas[0].box.x + c.areas[0].box.w + 100);  // room for the legend
}

TEST(PlotLineChart, GivenLimitsAreKept) {
  LinePanel p;
  p.ymin = 0;
  p.ymax = 1;
  p.series = {line("acc", {1, 2, 3}, {0.5, 0.6, 0.7})};
  const LineChart c = render_line_chart({p});
  EXPECT_EQ(c.areas[0].ymin, 0);
  EXPECT_EQ(c.areas[0].ymax, 1);
}

TEST(PlotLineChart, BadInputIsAnError) {
  auto message = [](const std::vector<LinePanel>& panels) -> std::string {
    try {
      render_line_chart(panels);
    } catch (const mha::Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({}).find("panels: none given"), std::string::npos);
  LinePanel lengths;
  lengths.series = {line("s", {1, 2, 3}, {1, 2})};
  EXPECT_NE(message({lengths}).find("x has 3 values and y 2"), std::string::npos);
  LinePanel empty;
  empty.series = {line("s", {NAN}, {1})};
  EXPECT_NE(message({empty}).find("no finite point"), std::string::npos);
  LinePanel log;
  log.log_y = true;
  log.series = {line("s", {1, 2}, {1, 0})};
  EXPECT_NE(message({log}).find("log axis"), std::string::npos);
  LinePanel range;
  range.xmin = 2;
  range.xmax = 1;
  range.series = {line("s", {1, 2}, {1, 2})};
  EXPECT_NE(message({range}).find("xmin 2 >= xmax 1"), std::string::npos);
  EXPECT_EQ(message({lengths}).rfind("[plot.render_line_chart] panels[0]", 0), 0u);
}
