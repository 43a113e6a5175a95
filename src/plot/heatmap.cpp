// src/plot/heatmap.cpp: grids of heatmaps with a shared colour bar, d2l's
// show_heatmaps drawn with cairo.
//
// Layout, left to right: [y label] [y tick labels] panels ...
// [colour bar, its ticks and label; the "masked" swatch under it]. Top to
// bottom: [figure title] per row: [row heading] [panel titles] panels; then x tick labels,
// x label and the note. Cells are whole pixels (no antialiasing), so the
// centre pixel of a cell is exactly its colour: the tests rely on that.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "canvas.h"
#include "mha/error.h"
#include "mha/plot.h"

namespace mha::plot {

namespace {

using detail::Canvas;
using detail::HAlign;
using detail::VAlign;

constexpr const char* kOp = "plot.render_heatmaps";
constexpr int kPanelGap = 14;    // between panels of a row
constexpr int kBarWidth = 16;
constexpr int kMaxCellPixels = 48;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// w:[R,C,Q,K] -> [R,C,ceil(Q/qb),ceil(K/kb)]: the mean of each block's
// non-NaN values, NaN where a block has none.
Tensor average_blocks(const Tensor& w, int64_t qb, int64_t kb) {
  const int64_t R = w.size(0), C = w.size(1), Q = w.size(2), K = w.size(3);
  const int64_t cq = ceil_div(Q, qb), ck = ceil_div(K, kb);
  if (qb == 1 && kb == 1) return w;
  Tensor out({R, C, cq, ck});
  std::vector<double> sum(static_cast<size_t>(ck));
  std::vector<int64_t> count(static_cast<size_t>(ck));
  for (int64_t p = 0; p < R * C; ++p) {
    const float* m = w.data() + p * Q * K;
    float* o = out.data() + p * cq * ck;
    for (int64_t i = 0; i < cq; ++i) {
      std::fill(sum.begin(), sum.end(), 0.0);
      std::fill(count.begin(), count.end(), 0);
      for (int64_t q = i * qb; q < std::min(Q, (i + 1) * qb); ++q)
        for (int64_t k = 0; k < K; ++k)
          if (!std::isnan(m[q * K + k])) sum[k / kb] += m[q * K + k], ++count[k / kb];
      for (int64_t j = 0; j < ck; ++j)
        o[i * ck + j] = count[j] ? static_cast<float>(sum[j] / count[j]) : NAN;
    }
  }
  return out;
}

// The smallest index step (1, 2, 5, 10, 20, ...) whose ticks sit at least
// min_px apart when one index spans px_per_index pixels.
int64_t index_step(double px_per_index, double min_px) {
  int64_t step = 1;
  for (int64_t p = 1;; p *= 10)
    for (int64_t m : {1, 2, 5})
      if ((step = m * p) * px_per_index >= min_px || step > (int64_t{1} << 40)) return step;
}

struct Plan {
  HeatmapLayout L;
  int width = 0, height = 0;
  int grid_left = 0, grid_right = 0;   // x extent of the panels
  int ylabel_x = 0;                    // centre of the rotated y label
  int xtick_y = 0, xlabel_y = 0, note_y = 0, title_y = 0;
  std::vector<int> row_label_y;        // baseline tops of the row headings
  int64_t q_step = 1, k_step = 1;      // index tick spacing
  double q_px = 1, k_px = 1;           // pixels per matrix index
  std::vector<double> bar_ticks;
  double bar_step = 1;
  int bar_label_x = 0;
};

Plan plan_layout(int64_t R, int64_t C, int64_t Q, int64_t K, const HeatmapOptions& opt,
                 bool has_mask, double vmin, double vmax, const std::string& note) {
  Plan P;
  HeatmapLayout& L = P.L;
  L.rows = static_cast<int>(R);
  L.cols = static_cast<int>(C);
  L.queries = Q;
  L.keys = K;
  L.q_block = ceil_div(Q, opt.max_cells);
  L.k_block = ceil_div(K, opt.max_cells);
  L.cells_q = ceil_div(Q, L.q_block);
  L.cells_k = ceil_div(K, L.k_block);

  // Cell size: square cells filling about `side` pixels along the longer
  // axis, but never so thin along the shorter one that the panel is a strip.
  const int side = opt.panel_size > 0 ? opt.panel_size
                                      : std::clamp(static_cast<int>(1300 / C), 150, 400);
  const int64_t longest = std::max(L.cells_q, L.cells_k);
  // Automatic panels keep cells at most kMaxCellPixels; a panel_size asked
  // for is honoured (a 3 x 3 matrix at 600 pixels gets 200-pixel cells).
  const int cell_cap = opt.panel_size > 0 ? std::max(kMaxCellPixels, opt.panel_size) : kMaxCellPixels;
  const int s = static_cast<int>(std::clamp<int64_t>(side / longest, 1, cell_cap));
  const int min_side = std::max(48, side / 4);
  L.cell_w = std::max<int>(s, static_cast<int>(ceil_div(min_side, L.cells_k)));
  L.cell_h = std::max<int>(s, static_cast<int>(ceil_div(min_side, L.cells_q)));
  L.cell_w = std::min(L.cell_w, cell_cap);
  L.cell_h = std::min(L.cell_h, cell_cap);
  L.gap = std::min(L.cell_w, L.cell_h) >= 10 ? 1 : 0;  // visible cells when they are big enough
  const int pw = static_cast<int>(L.cells_k) * L.cell_w, ph = static_cast<int>(L.cells_q) * L.cell_h;

  Canvas m(1, 1);  // for measuring text
  m.set_font(detail::kTickFont);
  const double tick_h = m.ascent() + m.descent();
  P.k_px = static_cast<double>(L.cell_w) / L.k_block;
  P.q_px = static_cast<double>(L.cell_h) / L.q_block;
  P.k_step = index_step(P.k_px, m.text_width(detail::str(K - 1)) + 8);
  P.q_step = index_step(P.q_px, tick_h + 2);
  const int ytick_w = static_cast<int>(std::ceil(m.text_width(detail::str(Q - 1))));

  const double bar_h_guess = std::max(ph * R, int64_t{120});
  P.bar_ticks = detail::nice_ticks(vmin, vmax, std::clamp(static_cast<int>(bar_h_guess / 40), 2, 8),
                                   &P.bar_step);
  int bar_tick_w = 0;
  for (double v : P.bar_ticks)
    bar_tick_w = std::max(bar_tick_w, static_cast<int>(std::ceil(m.text_width(detail::format_tick(v, P.bar_step)))));
  m.set_font(detail::kLabelFont);
  const int label_h = static_cast<int>(std::ceil(m.ascent() + m.descent()));
  const int masked_w = has_mask ? kBarWidth + 6 + static_cast<int>(std::ceil(m.text_width("masked"))) : 0;
  m.set_font(detail::kTitleFont, true);
  int title_w = 0;
  for (const auto& t : opt.titles) title_w = std::max(title_w, static_cast<int>(std::ceil(m.text_width(t))));
  const int title_h = opt.titles.empty() ? 0 : label_h + 6;
  m.set_font(detail::kFigureTitleFont, true);
  const int fig_title_h = opt.title.empty() ? 0 : static_cast<int>(std::ceil(m.ascent() + m.descent())) + 12;

  // Left to right.
  int x = detail::kMargin;
  if (!opt.ylabel.empty()) {
    P.ylabel_x = x + label_h / 2;
    x += label_h + 6;
  }
  x += ytick_w + 4 + detail::kTickLen;
  P.grid_left = x;
  const int hgap = std::max(kPanelGap, title_w - pw + 8);
  // Top to bottom.
  int y = detail::kMargin;
  P.title_y = y;
  y += fig_title_h;
  const int row_label_h = opt.row_labels.empty() ? 0 : label_h + 8;
  for (int64_t r = 0; r < R; ++r) {
    P.row_label_y.push_back(y);
    y += row_label_h + title_h;
    for (int64_t c = 0; c < C; ++c)
      L.panels.push_back({x + static_cast<int>(c) * (pw + hgap), y, pw, ph});
    y += ph + (r + 1 < R ? 16 : 0);
  }
  P.grid_right = L.panels.back().x + pw;
  P.xtick_y = y + detail::kTickLen + 3;
  y = P.xtick_y + static_cast<int>(std::ceil(tick_h));
  if (!opt.xlabel.empty()) {
    P.xlabel_y = y + 4;
    y += 4 + label_h;
  }

  // The colour bar spans the panels (at least 100 pixels), the swatch under it.
  const int grid_top = L.panels.front().y, grid_bottom = L.panels.back().y + ph;
  const int swatch_space = has_mask ? kBarWidth + 14 : 0;
  const int bar_h = std::max(grid_bottom - grid_top - swatch_space, 100);
  L.colorbar = {P.grid_right + 26, grid_top, kBarWidth, bar_h};
  if (has_mask) L.mask_swatch = {L.colorbar.x, grid_top + bar_h + 14, kBarWidth, kBarWidth};
  int right = L.colorbar.x + kBarWidth + detail::kTickLen + 4 + bar_tick_w;
  if (!opt.colorbar_label.empty()) {
    P.bar_label_x = right + 8 + label_h / 2;
    right += 8 + label_h;
  }
  right = std::max(right, L.colorbar.x + masked_w);
  m.set_font(detail::kLabelFont, true);
  for (const auto& l : opt.row_labels)
    right = std::max(right, detail::kMargin + static_cast<int>(std::ceil(m.text_width(l))));
  y = std::max(y, grid_top + bar_h + swatch_space + 6);
  if (!note.empty()) {
    P.note_y = y + 8;
    m.set_font(detail::kNoteFont);
    right = std::max(right, P.grid_left + static_cast<int>(std::ceil(m.text_width(note))));
    y += 8 + label_h;
  }
  P.width = right + detail::kMargin;
  P.height = y + detail::kMargin;
  return P;
}

void check_options(const Tensor& w, const HeatmapOptions& opt) {
  if (w.dim() != 4)
    fail(kOp, "weights: shape ", shape_str(w.shape()), " has ", w.dim(),
         " dimensions, wanted 4: (rows, cols, Q, K)");
  for (int64_t d : w.shape())
    if (d == 0) fail(kOp, "weights: shape ", shape_str(w.shape()), " has an empty axis; wanted every axis >= 1");
  for (int64_t i = 0; i < w.numel(); ++i)
    if (std::isinf(w.data()[i]))
      fail(kOp, "weights: element ", i, " of shape ", shape_str(w.shape()), " is infinite (", w.data()[i],
           "); wanted finite numbers (NaN marks a masked cell)");
  const int64_t panels = w.size(0) * w.size(1);
  if (!opt.titles.empty() && static_cast<int64_t>(opt.titles.size()) != panels)
    fail(kOp, "titles: ", opt.titles.size(), " given, wanted one per panel: ", panels, " for shape ",
         shape_str(w.shape()));
  if (!opt.row_labels.empty() && static_cast<int64_t>(opt.row_labels.size()) != w.size(0))
    fail(kOp, "row_labels: ", opt.row_labels.size(), " given, wanted one per row: ", w.size(0));
  if (opt.max_cells < 1) fail(kOp, "max_cells: ", opt.max_cells, ", wanted >= 1");
  if (opt.panel_size < 0) fail(kOp, "panel_size: ", opt.panel_size, ", wanted >= 0 (0: automatic)");
  if (opt.panel_size > detail::kMaxCanvasSide)
    fail(kOp, "panel_size: ", opt.panel_size, ", wanted at most ", detail::kMaxCanvasSide,
         " pixels (a picture's largest side; 0: automatic)");
  if (std::isinf(opt.vmin) || std::isinf(opt.vmax))
    fail(kOp, "vmin / vmax: ", opt.vmin, " / ", opt.vmax, ", wanted finite numbers or kAuto");
  if (!std::isnan(opt.vmin) && !std::isnan(opt.vmax) && opt.vmin > opt.vmax)
    fail(kOp, "vmin ", opt.vmin, " > vmax ", opt.vmax, "; wanted vmin <= vmax");
}

// The colour scale: the given ends, the drawn data's for kAuto, widened
// around a single value so that the bar still has a range. An automatic
// low end is anchored at 0 for data >= 0 (attention weights): scaled to the
// data's own minimum, a uniform row of 1/3 would take the darkest colour,
// which readers take for zero.
void color_range(const Tensor& drawn, const HeatmapOptions& opt, double* lo, double* hi) {
  double dmin = INFINITY, dmax = -INFINITY;
  for (float v : drawn.values())
    if (!std::isnan(v)) dmin = std::min<double>(dmin, v), dmax = std::max<double>(dmax, v);
  if (dmin > dmax) dmin = 0, dmax = 1;  // nothing but masked cells
  *lo = std::isnan(opt.vmin) ? std::min(dmin, 0.0) : opt.vmin;
  *hi = std::isnan(opt.vmax) ? dmax : opt.vmax;
  if (*lo > *hi) {  // one end given, the data's other end beyond it
    if (std::isnan(opt.vmin)) *lo = *hi; else *hi = *lo;
  }
  if (*hi == *lo) {
    const double pad = *lo != 0 ? std::abs(*lo) * 0.5 : 0.5;
    if (std::isnan(opt.vmin)) *lo -= pad;
    if (std::isnan(opt.vmax) || *hi == *lo) *hi += pad;
  }
}

}  // namespace

void HeatmapLayout::cell_center(int row, int col, int64_t q, int64_t k, int* x, int* y) const {
  if (row < 0 || row >= rows || col < 0 || col >= cols || q < 0 || q >= queries || k < 0 || k >= keys)
    fail("plot.HeatmapLayout.cell_center", "(row, col, q, k) = (", row, ", ", col, ", ", q, ", ", k,
         ") is outside (", rows, ", ", cols, ", ", queries, ", ", keys, ")");
  const Box& p = panels[static_cast<size_t>(row) * cols + col];
  *x = p.x + static_cast<int>(k / k_block) * cell_w + (cell_w - gap) / 2;
  *y = p.y + static_cast<int>(q / q_block) * cell_h + (cell_h - gap) / 2;
}

Heatmaps render_heatmaps(const Tensor& weights, const HeatmapOptions& options) {
  check_options(weights, options);
  // The colour bar is always labelled: an unlabelled scale leaves the reader
  // guessing what the colours measure.
  HeatmapOptions opt = options;
  if (opt.colorbar_label.empty()) opt.colorbar_label = kDefaultColorbarLabel;
  const int64_t R = weights.size(0), C = weights.size(1), Q = weights.size(2), K = weights.size(3);
  const int64_t qb = ceil_div(Q, opt.max_cells), kb = ceil_div(K, opt.max_cells);
  Heatmaps out;
  out.drawn = average_blocks(weights, qb, kb);
  color_range(out.drawn, opt, &out.vmin, &out.vmax);
  const bool has_mask = std::any_of(out.drawn.values().begin(), out.drawn.values().end(),
                                    [](float v) { return std::isnan(v); });
  std::string note = opt.note;
  if (qb > 1 || kb > 1) {
    std::string avg = "Each cell is the mean of " + detail::str(qb) + (qb == 1 ? " query" : " queries") +
                      " x " + detail::str(kb) + (kb == 1 ? " key" : " keys") + " (" + detail::str(Q) +
                      " x " + detail::str(K) + " weights averaged down to fit).";
    note = note.empty() ? avg : note + "  " + avg;
  }
  const Plan P = plan_layout(R, C, Q, K, opt, has_mask, out.vmin, out.vmax, note);
  const HeatmapLayout& L = P.L;
  if (P.width > detail::kMaxCanvasSide || P.height > detail::kMaxCanvasSide)
    fail(kOp, "weights: shape ", shape_str(weights.shape()), " makes a ", P.width, " x ", P.height,
         " pixel picture, wanted at most ", detail::kMaxCanvasSide,
         " pixels a side: draw fewer panels (rows x cols)");
  Canvas cv(P.width, P.height);
  const double span = out.vmax - out.vmin;

  if (!opt.title.empty()) {
    cv.set_font(detail::kFigureTitleFont, true);
    cv.text(opt.title, (P.grid_left + P.grid_right) / 2.0, P.title_y, HAlign::Center, VAlign::Top);
  }
  const int64_t cq = L.cells_q, ck = L.cells_k;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const Box& p = L.panels[static_cast<size_t>(r * C + c)];
      const float* m = out.drawn.data() + (r * C + c) * cq * ck;
      for (int64_t i = 0; i < cq; ++i)
        for (int64_t j = 0; j < ck; ++j) {
          const float v = m[i * ck + j];
          const Rgb color = std::isnan(v) ? kMaskColor : colormap((v - out.vmin) / span);
          cv.fill_rect(p.x + static_cast<int>(j) * L.cell_w, p.y + static_cast<int>(i) * L.cell_h,
                       L.cell_w - L.gap, L.cell_h - L.gap, color);
        }
      if (L.gap == 0) cv.frame(p, detail::kAxis);
      if (!opt.titles.empty()) {
        cv.set_font(detail::kTitleFont, true);
        cv.text(opt.titles[static_cast<size_t>(r * C + c)], p.x + p.w / 2.0, p.y - 6, HAlign::Center,
                VAlign::Bottom);
      }
      cv.set_font(detail::kTickFont);
      if (c == 0)  // query ticks on the left of each row
        for (int64_t q = 0; q < Q; q += P.q_step) {
          const double ty = p.y + (q + 0.5) * P.q_px - (P.q_step == 1 ? L.gap / 2.0 : 0);
          cv.line(p.x - detail::kTickLen - 1, ty, p.x - 1, ty, detail::kAxis);
          cv.text(detail::str(q), p.x - detail::kTickLen - 4, ty, HAlign::Right, VAlign::Middle);
        }
      if (r == R - 1)  // key ticks under the bottom row
        for (int64_t k = 0; k < K; k += P.k_step) {
          const double tx = p.x + (k + 0.5) * P.k_px - (P.k_step == 1 ? L.gap / 2.0 : 0);
          cv.line(tx, p.y + p.h + 1, tx, p.y + p.h + 1 + detail::kTickLen, detail::kAxis);
          cv.text(detail::str(k), tx, P.xtick_y, HAlign::Center, VAlign::Top);
        }
      cv.set_font(detail::kLabelFont);
      if (r == R - 1 && !opt.xlabel.empty())
        cv.text(opt.xlabel, p.x + p.w / 2.0, P.xlabel_y, HAlign::Center, VAlign::Top);
      if (c == 0 && !opt.ylabel.empty())
        cv.text(opt.ylabel, P.ylabel_x, p.y + p.h / 2.0, HAlign::Center, VAlign::Middle, detail::kText,
                -std::numbers::pi / 2);
      if (c == 0 && !opt.row_labels.empty()) {  // a heading over the row, from the left edge
        cv.set_font(detail::kLabelFont, true);
        cv.text(opt.row_labels[static_cast<size_t>(r)], detail::kMargin, P.row_label_y[static_cast<size_t>(r)],
                HAlign::Left, VAlign::Top);
      }
    }
  }

  // Colour bar: one row of pixels per colour, brightest at the top.
  const Box& b = L.colorbar;
  for (int i = 0; i < b.h; ++i)
    cv.fill_rect(b.x, b.y + i, b.w, 1, colormap(1.0 - (i + 0.5) / b.h));
  cv.frame(b, detail::kAxis);
  cv.set_font(detail::kTickFont);
  for (double v : P.bar_ticks) {
    const double ty = b.y + b.h - (v - out.vmin) / span * b.h;
    cv.line(b.x + b.w + 1, ty, b.x + b.w + 1 + detail::kTickLen, ty, detail::kAxis);
    cv.text(detail::format_tick(v, P.bar_step), b.x + b.w + detail::kTickLen + 4, ty, HAlign::Left, VAlign::Middle);
  }
  if (!opt.colorbar_label.empty()) {
    cv.set_font(detail::kLabelFont);
    cv.text(opt.colorbar_label, P.bar_label_x, b.y + b.h / 2.0, HAlign::Center, VAlign::Middle,
            detail::kText, -std::numbers::pi / 2);
  }
  if (has_mask) {
    const Box& s = L.mask_swatch;
    cv.fill_rect(s.x, s.y, s.w, s.h, kMaskColor);
    cv.frame(s, detail::kAxis);
    cv.set_font(detail::kLabelFont);
    cv.text("masked", s.x + s.w + 6, s.y + s.h / 2.0, HAlign::Left, VAlign::Middle);
  }
  if (!note.empty()) {
    cv.set_font(detail::kNoteFont);
    cv.text(note, P.grid_left, P.note_y, HAlign::Left, VAlign::Top, detail::kFaint);
  }
  out.image = cv.to_image();
  out.layout = L;
  return out;
}

std::string shade_matrix(const Tensor& m, double vmin, double vmax) {
  if (m.dim() != 2) fail("plot.shade_matrix", "m: shape ", shape_str(m.shape()), ", wanted (Q, K)");
  if (!(vmin < vmax)) fail("plot.shade_matrix", "vmin ", vmin, " >= vmax ", vmax, "; wanted vmin < vmax");
  const std::string ramp = kShadeRamp;
  const int levels = static_cast<int>(ramp.size());
  std::string out;
  for (int64_t q = 0; q < m.size(0); ++q) {
    for (int64_t k = 0; k < m.size(1); ++k) {
      const float v = m.at({q, k});
      if (std::isnan(v)) {
        out += "//";
        continue;
      }
      const double t = std::clamp((v - vmin) / (vmax - vmin), 0.0, 1.0);
      const char ch = ramp[static_cast<size_t>(std::min(levels - 1, static_cast<int>(t * levels)))];
      out += ch;
      out += ch;
    }
    out += '\n';
  }
  return out;
}

}  // namespace mha::plot
