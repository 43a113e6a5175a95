// src/plot/colormap.cpp: the heatmaps' colour table and its inverse.
#include <algorithm>
#include <array>
#include <cmath>

#include "mha/error.h"
#include "mha/plot.h"

namespace mha::plot {

namespace {

// Ten evenly spaced samples of matplotlib's viridis (as R's viridisLite gives
// them for n = 10). Viridis is perceptually uniform and stays readable in
// greyscale and for the common colour-vision deficiencies; interpolating ten
// samples in RGB keeps its look, and the resulting 256 entries are all
// distinct (a test checks that), which makes the inverse exact.
constexpr Rgb kSamples[10] = {{0x44, 0x01, 0x54}, {0x48, 0x28, 0x78}, {0x3e, 0x4a, 0x89},
                              {0x31, 0x68, 0x8e}, {0x26, 0x82, 0x8e}, {0x1f, 0x9e, 0x89},
                              {0x35, 0xb7, 0x79}, {0x6d, 0xcd, 0x59}, {0xb4, 0xde, 0x2c},
                              {0xfd, 0xe7, 0x25}};

// The unrounded colour of entry i: linear in RGB between the samples.
std::array<double, 3> mix(int i) {
  constexpr int segments = 9;
  const double pos = static_cast<double>(i) * segments / (kColormapSize - 1);
  const int j = std::min(static_cast<int>(pos), segments - 1);
  const double f = pos - j;
  const Rgb a = kSamples[j], b = kSamples[j + 1];
  return {a.r + f * (b.r - a.r), a.g + f * (b.g - a.g), a.b + f * (b.b - a.b)};
}

std::array<Rgb, kColormapSize> make_table() {
  std::array<std::array<double, 3>, kColormapSize> exact;
  std::array<Rgb, kColormapSize> table{};
  auto to_rgb = [](const std::array<double, 3>& c) {
    return Rgb{static_cast<uint8_t>(std::lround(c[0])), static_cast<uint8_t>(std::lround(c[1])),
               static_cast<uint8_t>(std::lround(c[2]))};
  };
  for (int i = 0; i < kColormapSize; ++i) table[i] = to_rgb(exact[i] = mix(i));
  // Where the ramp is slowest two neighbours can round to the same colour
  // (entry 104 does); then round the tied entry's fastest-changing channel the
  // other way, so that every entry, and so every drawn value, stays distinct.
  for (int i = 1; i + 1 < kColormapSize; ++i) {
    if (!(table[i] == table[i - 1])) continue;
    int fastest = 0;
    for (int c = 1; c < 3; ++c)
      if (std::abs(exact[i + 1][c] - exact[i - 1][c]) > std::abs(exact[i + 1][fastest] - exact[i - 1][fastest]))
        fastest = c;
    const double v = exact[i][fastest];
    const double other = std::lround(v) == std::floor(v) ? std::ceil(v) : std::floor(v);
    std::array<double, 3> moved = exact[i];
    moved[fastest] = other;
    table[i] = to_rgb(moved);
  }
  return table;
}

const std::array<Rgb, kColormapSize>& table() {
  static const std::array<Rgb, kColormapSize> t = make_table();
  return t;
}

}  // namespace

Rgb colormap_entry(int i) {
  if (i < 0 || i >= kColormapSize)
    fail("plot.colormap_entry", "index ", i, " is outside 0 .. ", kColormapSize - 1);
  return table()[i];
}

Rgb colormap(double t) {
  if (std::isnan(t)) return kMaskColor;
  t = std::clamp(t, 0.0, 1.0);
  return table()[static_cast<size_t>(std::lround(t * (kColormapSize - 1)))];
}

int colormap_index(Rgb c) {
  int best = 0;
  long best_d = -1;
  for (int i = 0; i < kColormapSize; ++i) {
    const Rgb e = table()[i];
    const long dr = e.r - c.r, dg = e.g - c.g, db = e.b - c.b;
    const long d = dr * dr + dg * dg + db * db;
    if (best_d < 0 || d < best_d) best = i, best_d = d;
  }
  return best;
}

}  // namespace mha::plot
