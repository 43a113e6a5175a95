// mha/plot.h: pictures of numbers, drawn with cairo: heatmap grids (attention
// weights, one panel per head) and line charts (training curves, pruning
// sweeps). Images are 8-bit RGBA in memory and PNG on disk.
//
//   // weights:[rows, cols, Q, K], d2l's show_heatmaps layout; NaN = masked.
//   mha::plot::HeatmapOptions opt;
//   opt.titles = {"head 0", "head 1"};
//   mha::plot::Heatmaps fig = mha::plot::render_heatmaps(weights, opt);
//   mha::plot::write_png("heads.png", fig.image);
//
//   mha::plot::LinePanel loss{.title = "Training loss", .xlabel = "step", .ylabel = "loss"};
//   loss.series.push_back({.name = "train", .x = steps, .y = losses});
//   mha::plot::write_png("loss.png", mha::plot::render_line_chart({loss}).image);
//
// Colours: values map through one colour map (dark purple = low, teal, yellow
// = high; see colormap()); masked cells are kMaskColor, a neutral grey that
// the colour map never produces, so padding is never mistaken for a weight.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mha/tensor.h"

namespace mha::plot {

// A colour: 8-bit red, green and blue.
struct Rgb {
  // The red, green and blue components, 0 .. 255.
  uint8_t r = 0, g = 0, b = 0;
  // Equal when all three components are.
  friend bool operator==(const Rgb&, const Rgb&) = default;
};

// An image: height rows of width pixels, 4 bytes each (R, G, B, A; alpha not
// premultiplied), top row first.
struct Image {
  // Pixels per row.
  int width = 0;
  // Rows.
  int height = 0;
  std::vector<uint8_t> rgba;  // [height, width, 4]

  Rgb rgb_at(int x, int y) const;    // x in [0, width), y in [0, height)
  // The alpha of pixel (x, y), with rgb_at's bounds; both throw mha::Error
  // for a pixel outside the image.
  uint8_t alpha_at(int x, int y) const;
};

// PNG through cairo. write_png goes through a temporary file renamed into
// place, so a reader never sees half an image and a failed write leaves the
// old file. Errors throw mha::Error naming the file.
//
// The PNG bytes of `image`; mha::Error when rgba does not hold
// width * height * 4 bytes or a side is not positive.
std::vector<uint8_t> encode_png(const Image& image);
// encode_png, written to `path` atomically.
void write_png(const std::string& path, const Image& image);
// The image in PNG bytes `png`; `origin` names them in the mha::Error given
// for bytes that are not a PNG cairo can read.
Image decode_png(const std::vector<uint8_t>& png, const std::string& origin = "buffer");
// decode_png of the file at `path` (mha::Error if it cannot be read).
Image read_png(const std::string& path);

// ---- Colour map --------------------------------------------------------
// kColormapSize colours interpolated in RGB between ten evenly spaced samples
// of matplotlib's perceptually uniform "viridis" (hex 440154 ... fde725). Entry
// i stands for the fraction i / (kColormapSize - 1) of the colour scale; all
// entries are distinct, so a drawn colour gives its value back to within half
// an entry: kColormapResolution of the scale's range.
inline constexpr int kColormapSize = 256;
// Half an entry as a fraction of the scale: how closely colormap_inverse()
// gives a drawn value back.
inline constexpr double kColormapResolution = 0.5 / (kColormapSize - 1);
// The colour of masked cells: a neutral grey that no entry of the colour map
// is near.
inline constexpr Rgb kMaskColor{205, 205, 205};

// The colour of fraction t of the scale (clamped to [0, 1]; NaN gives kMaskColor).
Rgb colormap(double t);
// Entry i of the table, 0 <= i < kColormapSize (mha::Error otherwise).
Rgb colormap_entry(int i);
// The entry nearest to `c` (squared RGB distance) and its fraction of the scale.
int colormap_index(Rgb c);
// The fraction of the scale, 0 .. 1, whose colour is nearest to `c`.
inline double colormap_inverse(Rgb c) {
  return static_cast<double>(colormap_index(c)) / (kColormapSize - 1);
}

// ---- Heatmap grids -----------------------------------------------------
inline constexpr double kAuto = std::numeric_limits<double>::quiet_NaN();
// The colour bar's label when HeatmapOptions::colorbar_label is empty.
inline constexpr const char* kDefaultColorbarLabel = "attention weight";

// Text, colour scale and size of render_heatmaps(); every field has a
// usable default.
struct HeatmapOptions {
  std::string xlabel = "Keys";           // under the bottom row of panels
  std::string ylabel = "Queries";        // left of each row's first panel
  std::vector<std::string> titles;       // one per panel, row-major; or none
  std::vector<std::string> row_labels;   // one per row of panels, a heading above it; or none
  std::string title;                     // above the whole figure; or none
  std::string colorbar_label;            // beside the colour bar; empty: kDefaultColorbarLabel
  std::string note;                      // small print under the figure; or none
  // The colour scale: values <= vmin are the darkest colour, >= vmax the
  // brightest. kAuto takes the min / max of the values drawn (after
  // averaging), except that an automatic vmin is never above 0, so that the
  // darkest colour always means 0 for weights (a uniform row is not dark).
  double vmin = kAuto, vmax = kAuto;
  // At most this many cells are drawn along either axis of a panel: longer
  // axes are averaged over blocks of ceil(n / max_cells) rows or columns.
  int max_cells = 96;
  // Largest side of one panel in pixels (0: chosen from the number of panels).
  int panel_size = 0;
};

// A rectangle of an image: top-left corner (x, y), width w and height h.
struct Box {
  int x = 0, y = 0, w = 0, h = 0;  // pixels, origin at the top left
};

// Where a heatmap grid put things.
struct HeatmapLayout {
  int rows = 0, cols = 0;             // panels
  int64_t queries = 0, keys = 0;      // Q and K of each matrix
  int64_t q_block = 1, k_block = 1;   // matrix rows / columns averaged into one cell
  int64_t cells_q = 0, cells_k = 0;   // cells drawn per panel: ceil(Q / q_block), ...
  int cell_w = 0, cell_h = 0;         // pixels per cell (gaps included)
  int gap = 0;                        // background pixels right of and under each cell
  std::vector<Box> panels;            // row-major, rows * cols
  Box colorbar;                       // the colour ramp itself
  Box mask_swatch;                    // the "masked" legend square (w = 0 if no cell is masked)

  // The pixel at the centre of the cell that shows element (q, k) of panel (row, col).
  void cell_center(int row, int col, int64_t q, int64_t k, int* x, int* y) const;
};

// What render_heatmaps() returns: the picture and where it put things.
struct Heatmaps {
  // The figure.
  Image image;
  // Where the panels, cells and colour bar are in it.
  HeatmapLayout layout;
  double vmin = 0, vmax = 1;  // the colour scale used
  Tensor drawn;               // [rows, cols, cells_q, cells_k]: the values drawn (NaN = masked)
};

// weights:[rows, cols, Q, K] -> one panel per (row, col), row-major, with the
// query index down and the key index across, one shared colour bar. NaN marks
// a masked cell; a block of cells that is averaged is masked only if all of
// its cells are, and otherwise shows the mean of its unmasked cells.
// Throws mha::Error for a rank other than 4, an empty axis, infinite values,
// titles or row_labels of the wrong count, max_cells < 1 or vmin > vmax.
Heatmaps render_heatmaps(const Tensor& weights, const HeatmapOptions& options = {});

// One matrix as text for a terminal: m:[Q,K] -> Q lines of K two-character
// cells shaded with kShadeRamp from vmin to vmax, masked (NaN) cells as
// "//". Throws mha::Error for a rank other than 2 or vmin >= vmax.
std::string shade_matrix(const Tensor& m, double vmin, double vmax);
// shade_matrix's characters, from the lowest value to the highest.
inline constexpr const char* kShadeRamp = " .:-=+*#%@";

// ---- Line charts -------------------------------------------------------
// One line of a LinePanel.
struct Series {
  std::string name;             // legend entry (series without a name stay out of the legend)
  std::vector<double> x, y;     // same length; a NaN breaks the line
  bool markers = false;         // a dot on every point, besides the line
  std::optional<Rgb> color;     // default: kPalette[index of the series in its panel]
};

// One chart of render_line_chart(): its text, lines and axes.
struct LinePanel {
  // The panel's title, and the labels of its x and y axes (each may be empty).
  std::string title, xlabel, ylabel;
  // The lines, drawn in order with colours from kPalette.
  std::vector<Series> series;
  // Axis ranges; kAuto fits the data (rounded out to tick marks).
  double xmin = kAuto, xmax = kAuto, ymin = kAuto, ymax = kAuto;
  bool log_y = false;  // logarithmic y axis (every y must then be > 0)
};

// The figure around the panels of render_line_chart().
struct LineChartOptions {
  std::string title;             // above all panels; or none
  int plot_width = 460;          // pixels of each panel's plotting area
  // Pixels of each panel's plotting area, top to bottom (both sizes 40 .. 4000).
  int plot_height = 300;
};

// Ten distinguishable colours (Tableau 10), used in order by a panel's series.
inline constexpr Rgb kPalette[10] = {
    {31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},   {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};

// Where a line chart put a panel, and how data coordinates map to pixels.
struct PlotArea {
  Box box;                             // the plotting area inside the axes
  // The data ranges the area spans (after rounding out to tick marks).
  double xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  // Whether the y axis is logarithmic.
  bool log_y = false;
  double to_x(double x) const;         // pixel column of data x
  double to_y(double y) const;         // pixel row of data y
};

// What render_line_chart() returns: the picture and each panel's area.
struct LineChart {
  // The figure.
  Image image;
  std::vector<PlotArea> areas;  // one per panel
};

// Panels side by side, each with its axes, ticks, title and legend (in a
// corner where it hides no line or point, else beside the plotting area). Throws mha::Error for no panels, x / y of
// different lengths, a panel with no finite point, non-positive y on a log
// axis, or a range with min >= max.
LineChart render_line_chart(const std::vector<LinePanel>& panels, const LineChartOptions& options = {});

}  // namespace mha::plot
