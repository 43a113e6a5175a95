// tests/cpp/plot/test_prune_plot.cpp: what `mha prune --plot` draws
// (tools/prune_plot.h): no measure's line hidden under another's, one legend
// entry for the random orders, both panels along heads removed.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "prune_plot.h"

namespace mha::tools {
namespace {

PruneCurve curve(const std::string& name, std::vector<double> accuracy) {
  PruneCurve c;
  c.name = name;
  c.accuracy = accuracy;
  c.loss.assign(accuracy.size(), 0.0);
  for (size_t i = 0; i < accuracy.size(); ++i) c.heads_kept.push_back(static_cast<int64_t>(accuracy.size() - i));
  return c;
}

struct Experiment {
  std::vector<PruneCurve> measured, reversed, random;
  std::vector<double> latency{4.0, 3.5, 3.0, 2.0};
  std::vector<int64_t> kept{4, 3, 2, 1};
};

Experiment experiment() {
  Experiment e;
  // gradient and ablation chose the same order: identical curves.
  e.measured = {curve("gradient", {1.0, 0.9, 0.6, 0.3}), curve("ablation", {1.0, 0.9, 0.6, 0.3}),
                curve("confidence", {1.0, 0.8, 0.5, 0.3})};
  e.reversed = {curve("gradient reversed", {1.0, 0.5, 0.4, 0.3})};
  e.random = {curve("random 0", {1.0, 0.7, 0.5, 0.3}), curve("random 1", {1.0, 0.8, 0.4, 0.3}),
              curve("random 2", {1.0, 0.6, 0.5, 0.3})};
  return e;
}

const plot::Series* named(const plot::LinePanel& p, const std::string& name) {
  for (const plot::Series& s : p.series)
    if (s.name == name) return &s;
  return nullptr;
}

TEST(PrunePlot, CoincidingMeasuresAreDrawnApart) {
  const Experiment e = experiment();
  const auto panels = prune_plot_panels(e.measured, e.reversed, e.random, e.latency, e.kept);
  ASSERT_EQ(panels.size(), 2u);
  const plot::Series* g = named(panels[0], "gradient");
  const plot::Series* a = named(panels[0], "ablation");
  ASSERT_TRUE(g && a);
  ASSERT_EQ(g->y, a->y);  // the same accuracies...
  for (size_t i = 0; i < g->x.size(); ++i) {
    EXPECT_NE(g->x[i], a->x[i]) << "point " << i << ": gradient's line lies under ablation's";
    // ...each within a fraction of a step of its removal count.
    EXPECT_NEAR(g->x[i], static_cast<double>(i), 0.25);
    EXPECT_NEAR(a->x[i], static_cast<double>(i), 0.25);
  }
  // Every measure and reverse has its own colour.
  std::set<std::tuple<int, int, int>> colours;
  for (const char* n : {"gradient", "ablation", "confidence", "gradient reversed"}) {
    const plot::Series* s = named(panels[0], n);
    ASSERT_TRUE(s && s->color) << n;
    colours.insert({s->color->r, s->color->g, s->color->b});
  }
  EXPECT_EQ(colours.size(), 4u);
}

TEST(PrunePlot, RandomOrdersHaveOneLegendEntryAndAMean) {
  const Experiment e = experiment();
  const auto panels = prune_plot_panels(e.measured, e.reversed, e.random, e.latency, e.kept);
  int faint = 0, labelled = 0;
  for (const plot::Series& s : panels[0].series)
    if (s.color && s.color->r == 205 && s.color->g == 205 && s.color->b == 205) {
      ++faint;
      labelled += !s.name.empty();
    }
  EXPECT_EQ(faint, 3);
  EXPECT_EQ(labelled, 1);  // one legend entry for all random orders
  const plot::Series* mean = named(panels[0], "random (mean of 3)");
  ASSERT_TRUE(mean);
  EXPECT_NEAR(mean->y[1], 0.7, 1e-12);
}

TEST(PrunePlot, BothPanelsRunAlongHeadsRemoved) {
  const Experiment e = experiment();
  const auto panels = prune_plot_panels(e.measured, e.reversed, e.random, e.latency, e.kept);
  EXPECT_EQ(panels[0].xlabel, "heads removed");
  EXPECT_EQ(panels[1].xlabel, panels[0].xlabel);
  ASSERT_EQ(panels[1].series.size(), 1u);
  EXPECT_EQ(panels[1].series[0].x, (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(panels[1].series[0].y, e.latency);
}

}  // namespace
}  // namespace mha::tools
