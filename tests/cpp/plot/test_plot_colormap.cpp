// The colour map and its inverse: what makes a drawn colour readable as a number.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "mha/error.h"
#include "mha/plot.h"

using namespace mha::plot;

namespace {
double luminance(Rgb c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b; }
long dist2(Rgb a, Rgb b) {
  const long dr = a.r - b.r, dg = a.g - b.g, db = a.b - b.b;
  return dr * dr + dg * dg + db * db;
}
}  // namespace

TEST(PlotColormap, EntriesAreDistinctSoTheInverseIsExact) {
  std::set<std::tuple<int, int, int>> seen;
  for (int i = 0; i < kColormapSize; ++i) {
    const Rgb c = colormap_entry(i);
    seen.insert({c.r, c.g, c.b});
    EXPECT_EQ(colormap_index(c), i);
    EXPECT_DOUBLE_EQ(colormap_inverse(c), i / 255.0);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kColormapSize));
}

TEST(PlotColormap, EndsAreViridisEnds) {
  // matplotlib's viridis starts at #440154 and ends at #fde725.
  EXPECT_EQ(colormap(0.0), (Rgb{0x44, 0x01, 0x54}));
  EXPECT_EQ(colormap(1.0), (Rgb{0xfd, 0xe7, 0x25}));
  EXPECT_EQ(colormap(-3.0), colormap(0.0));  // clamped
  EXPECT_EQ(colormap(7.0), colormap(1.0));
}

TEST(PlotColormap, BrighterMeansMore) {
  // Viridis rises in lightness end to end, so order survives greyscale printing.
  for (int i = 1; i < kColormapSize; ++i)
    EXPECT_GE(luminance(colormap_entry(i)), luminance(colormap_entry(i - 1)) - 0.5) << "entry " << i;
  EXPECT_GT(luminance(colormap(1.0)), luminance(colormap(0.0)) + 150);
}

TEST(PlotColormap, InverseRecoversAnyFractionWithinTheResolution) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int n = 0; n < 10000; ++n) {
    const double t = u(gen);
    EXPECT_NEAR(colormap_inverse(colormap(t)), t, kColormapResolution + 1e-12) << "t = " << t;
  }
}

TEST(PlotColormap, MaskColourIsFarFromEveryEntry) {
  EXPECT_EQ(colormap(NAN), kMaskColor);
  long nearest = -1;
  for (int i = 0; i < kColormapSize; ++i) {
    const long d = dist2(colormap_entry(i), kMaskColor);
    if (nearest < 0 || d < nearest) nearest = d;
  }
  // At least 40 levels away in RGB: no weight can be mistaken for padding.
  EXPECT_GT(nearest, 40 * 40);
}

TEST(PlotColormap, EntryOutsideTheTableIsAnError) {
  EXPECT_THROW(colormap_entry(-1), mha::Error);
  EXPECT_THROW(colormap_entry(kColormapSize), mha::Error);
}
