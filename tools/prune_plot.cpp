// tools/prune_plot.cpp: the two panels of `mha prune --plot` (see prune_plot.h).
#include "prune_plot.h"

#include <numeric>
#include <string>

namespace mha::tools {

namespace {

plot::Series series(const std::string& name, std::vector<double> x, std::vector<double> y, bool markers,
                    plot::Rgb color) {
  plot::Series s;
  s.name = name;
  s.x = std::move(x);
  s.y = std::move(y);
  s.markers = markers;
  s.color = color;
  return s;
}

plot::LinePanel panel(const std::string& title, const std::string& xlabel, const std::string& ylabel) {
  plot::LinePanel p;
  p.title = title;
  p.xlabel = xlabel;
  p.ylabel = ylabel;
  return p;
}

// Measures take palette colours 0-3, their reverses these, random orders grey.
constexpr plot::Rgb kReverseColors[4] = {plot::kPalette[4], plot::kPalette[5], plot::kPalette[6], plot::kPalette[8]};

}  // namespace

std::vector<plot::LinePanel> prune_plot_panels(const std::vector<PruneCurve>& measured,
                                               const std::vector<PruneCurve>& reversed,
                                               const std::vector<PruneCurve>& random,
                                               const std::vector<double>& latency,
                                               const std::vector<int64_t>& kept) {
  plot::LinePanel acc = panel("Held-out accuracy as heads are removed", "heads removed", "accuracy");
  acc.ymin = 0.0;
  acc.ymax = 1.0;
  // x: heads removed. Measures often agree (gradient and ablation give one
  // order), and identical curves would hide each other: each measure's line
  // is shifted by a small fraction of a step (dodged) so every one shows.
  const double dodge = 0.08;
  auto steps = [](const PruneCurve& c, double offset) {
    std::vector<double> x(c.accuracy.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) + offset;
    return x;
  };
  auto offset = [&](size_t i) { return (static_cast<double>(i) - (measured.size() - 1) / 2.0) * dodge; };
  // Random orders first (faint, their mean bold), so the measures draw on top.
  if (!random.empty()) {
    std::vector<double> mean(random.front().accuracy.size(), 0.0);
    for (size_t r = 0; r < random.size(); ++r) {
      const PruneCurve& c = random[r];
      // One legend entry for all the faint lines.
      acc.series.push_back(series(r == 0 ? "random orders (each)" : "", steps(c, 0.0), c.accuracy, false,
                                  plot::Rgb{205, 205, 205}));
      for (size_t i = 0; i < mean.size(); ++i) mean[i] += c.accuracy[i] / static_cast<double>(random.size());
    }
    acc.series.push_back(series("random (mean of " + std::to_string(random.size()) + ")", steps(random.front(), 0.0),
                                mean, true, plot::kPalette[7]));
  }
  for (size_t i = 0; i < reversed.size(); ++i)
    acc.series.push_back(
        series(reversed[i].name, steps(reversed[i], offset(i)), reversed[i].accuracy, false, kReverseColors[i % 4]));
  for (size_t i = 0; i < measured.size(); ++i)
    acc.series.push_back(
        series(measured[i].name, steps(measured[i], offset(i)), measured[i].accuracy, true, plot::kPalette[i]));
  // The same x axis as the accuracy panel (heads removed, left to right), so
  // both read in one direction; the title says how many heads are kept.
  plot::LinePanel lat = panel("Forward latency (" + std::to_string(kept.front()) + " heads kept at 0 removed)",
                              "heads removed", "ms (median)");
  lat.ymin = 0.0;
  std::vector<double> removed(kept.size());
  std::iota(removed.begin(), removed.end(), 0.0);
  lat.series.push_back(series("forward", removed, latency, true, plot::kPalette[0]));
  return {acc, lat};
}


}  // namespace mha::tools
