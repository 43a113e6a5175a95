// src/plot/line_chart.cpp: line charts (training curves, pruning sweeps),
// one or more panels side by side.
//
// A panel: [y label] [y tick labels] plotting area with light grid lines at
// the ticks, the series as 2-pixel lines (NaN breaks a line), the legend in
// a corner where it hides no line (else beside the plot); title above, x ticks and label below.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "canvas.h"
#include "mha/error.h"
#include "mha/plot.h"

namespace mha::plot {

namespace {

using detail::Canvas;
using detail::HAlign;
using detail::VAlign;

constexpr const char* kOp = "plot.render_line_chart";
constexpr int kPanelGap = 36;
constexpr int kLegendRow = 18;
constexpr int kLegendSwatch = 22;

double axis_value(double v, bool log) { return log ? std::log10(v) : v; }

// The ticks of one axis and how to print them.
struct Ticks {
  std::vector<double> values;
  std::vector<std::string> labels;
};

Ticks linear_ticks(double lo, double hi, int target) {
  Ticks t;
  double step = 1;
  t.values = detail::nice_ticks(lo, hi, target, &step);
  for (double v : t.values) t.labels.push_back(detail::format_tick(v, step));
  return t;
}

// Powers of ten inside [lo, hi]; with 1-2-5 multiples added when there are
// fewer than three of them; plain linear ticks when the range is narrower still.
Ticks log_ticks(double lo, double hi, int target) {
  Ticks t;
  for (int mult_set = 0; mult_set < 2; ++mult_set) {
    t = {};
    const std::vector<double> mults = mult_set == 0 ? std::vector<double>{1} : std::vector<double>{1, 2, 5};
    for (int e = static_cast<int>(std::floor(std::log10(lo))); e <= static_cast<int>(std::ceil(std::log10(hi))); ++e)
      for (double m : mults) {
        const double v = m * std::pow(10.0, e);
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) {
          t.values.push_back(v);
          char buf[32];
          std::snprintf(buf, sizeof buf, "%g", v);
          t.labels.push_back(buf);
        }
      }
    if (t.values.size() >= 3 && static_cast<int>(t.values.size()) <= 2 * target) return t;
    if (t.values.size() >= 3) break;
  }
  if (t.values.size() >= 2) return t;
  return linear_ticks(lo, hi, target);
}

void check_panel(const LinePanel& p, size_t index) {
  const std::string where = "panels[" + std::to_string(index) + "]";
  bool any = false;
  for (size_t s = 0; s < p.series.size(); ++s) {
    const Series& se = p.series[s];
    if (se.x.size() != se.y.size())
      fail(kOp, where, ".series[", s, "] '", se.name, "': x has ", se.x.size(), " values and y ",
           se.y.size(), "; wanted the same number");
    for (size_t i = 0; i < se.x.size(); ++i) {
      if (std::isinf(se.x[i]) || std::isinf(se.y[i]))
        fail(kOp, where, ".series[", s, "] '", se.name, "': point ", i, " is infinite; wanted finite or NaN");
      if (p.log_y && se.y[i] <= 0)
        fail(kOp, where, ".series[", s, "] '", se.name, "': y[", i, "] = ", se.y[i],
             " on a log axis; wanted > 0");
      any = any || (!std::isnan(se.x[i]) && !std::isnan(se.y[i]));
    }
  }
  if (!any) fail(kOp, where, " '", p.title, "': no finite point to draw");
  const std::pair<const char*, double> limits[] = {{"xmin", p.xmin}, {"xmax", p.xmax}, {"ymin", p.ymin}, {"ymax", p.ymax}};
  for (const auto& [name, v] : limits)
    if (std::isinf(v)) fail(kOp, where, ".", name, ": ", v, "; wanted a finite limit or kAuto");
  if (!std::isnan(p.xmin) && !std::isnan(p.xmax) && p.xmin >= p.xmax)
    fail(kOp, where, ": xmin ", p.xmin, " >= xmax ", p.xmax);
  if (!std::isnan(p.ymin) && !std::isnan(p.ymax) && p.ymin >= p.ymax)
    fail(kOp, where, ": ymin ", p.ymin, " >= ymax ", p.ymax);
  if (p.log_y && ((!std::isnan(p.ymin) && p.ymin <= 0) || (!std::isnan(p.ymax) && p.ymax <= 0)))
    fail(kOp, where, ": y limits ", p.ymin, " .. ", p.ymax, " on a log axis; wanted > 0");
}

// Data ranges, given limits kept; y padded by 5% (of the log range on a log axis).
void fit_ranges(const LinePanel& p, PlotArea* a) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : p.series)
    for (size_t i = 0; i < s.x.size(); ++i)
      if (!std::isnan(s.x[i]) && !std::isnan(s.y[i])) {
        x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
        y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
      }
  if (x0 == x1) x0 -= 0.5, x1 += 0.5;
  // Dots at the ends would be cut in half by the frame: leave them room.
  bool dots = false;
  for (const Series& s : p.series) dots |= s.markers || s.x.size() == 1;
  if (dots) {
    const double xpad = 0.03 * (x1 - x0);
    x0 -= xpad, x1 += xpad;
  }
  a->log_y = p.log_y;
  double ly0 = axis_value(y0, p.log_y), ly1 = axis_value(y1, p.log_y);
  if (ly0 == ly1) ly0 -= 0.5, ly1 += 0.5;
  const double pad = 0.05 * (ly1 - ly0);
  ly0 -= pad, ly1 += pad;
  a->xmin = std::isnan(p.xmin) ? x0 : p.xmin;
  a->xmax = std::isnan(p.xmax) ? x1 : p.xmax;
  a->ymin = std::isnan(p.ymin) ? (p.log_y ? std::pow(10.0, ly0) : ly0) : p.ymin;
  a->ymax = std::isnan(p.ymax) ? (p.log_y ? std::pow(10.0, ly1) : ly1) : p.ymax;
  // One limit given and the data's other end beyond it: keep a unit-wide range.
  if (a->xmin >= a->xmax) {
    if (std::isnan(p.xmin)) a->xmin = a->xmax - 1; else a->xmax = a->xmin + 1;
  }
  if (a->ymin >= a->ymax) {
    if (std::isnan(p.ymin)) a->ymin = p.log_y ? a->ymax / 10 : a->ymax - 1;
    else a->ymax = p.log_y ? a->ymin * 10 : a->ymin + 1;
  }
}

Rgb series_color(const Series& s, size_t i) { return s.color ? *s.color : kPalette[i % 10]; }

struct LegendPlan {
  std::vector<size_t> entries;  // indices of the named series
  int w = 0, h = 0;
  int corner = -1;              // 0..3: top-right, top-left, bottom-right, bottom-left; -1: outside, right
};

struct PanelPlan {
  PlotArea area;
  Ticks xt, yt;
  int ylabel_x = 0;
  LegendPlan legend;
};

Box legend_box(const Box& b, const LegendPlan& L) {
  switch (L.corner) {
    case 0: return {b.x + b.w - L.w - 8, b.y + 8, L.w, L.h};
    case 1: return {b.x + 8, b.y + 8, L.w, L.h};
    case 2: return {b.x + b.w - L.w - 8, b.y + b.h - L.h - 8, L.w, L.h};
    case 3: return {b.x + 8, b.y + b.h - L.h - 8, L.w, L.h};
    default: return {b.x + b.w + 12, b.y, L.w, L.h};
  }
}

// How much of the drawing a box would hide: samples every 3 pixels along
// the lines, points weighing more.
long hidden_by(const LinePanel& p, const PlotArea& a, const Box& L) {
  auto inside = [&](double x, double y) { return x >= L.x && x <= L.x + L.w && y >= L.y && y <= L.y + L.h; };
  long hits = 0;
  for (const Series& se : p.series) {
    for (size_t k = 0; k < se.x.size(); ++k) {
      if (std::isnan(se.x[k] + se.y[k])) continue;
      hits += 4 * inside(a.to_x(se.x[k]), a.to_y(se.y[k]));
      if (k + 1 == se.x.size() || std::isnan(se.x[k + 1] + se.y[k + 1])) continue;
      const double x0 = a.to_x(se.x[k]), y0 = a.to_y(se.y[k]);
      const double x1 = a.to_x(se.x[k + 1]), y1 = a.to_y(se.y[k + 1]);
      const int n = 1 + static_cast<int>(std::hypot(x1 - x0, y1 - y0) / 3);
      for (int j = 1; j < n; ++j) hits += inside(x0 + (x1 - x0) * j / n, y0 + (y1 - y0) * j / n);
    }
  }
  return hits;
}

// The legend goes in the first corner that hides nothing, else outside on the right.
LegendPlan plan_legend(const LinePanel& p, const PlotArea& area_at_origin, Canvas& m) {
  LegendPlan L;
  for (size_t s = 0; s < p.series.size(); ++s)
    if (!p.series[s].name.empty()) L.entries.push_back(s);
  if (L.entries.empty()) return L;
  m.set_font(detail::kTickFont + 1);
  double tw = 0;
  for (size_t s : L.entries) tw = std::max(tw, m.text_width(p.series[s].name));
  L.w = static_cast<int>(std::ceil(tw)) + kLegendSwatch + 6 + 16;
  L.h = static_cast<int>(L.entries.size()) * kLegendRow + 8;
  const Box& b = area_at_origin.box;
  if (L.w + 16 <= b.w && L.h + 16 <= b.h)
    for (int c = 0; c < 4; ++c) {
      L.corner = c;
      if (hidden_by(p, area_at_origin, legend_box(b, L)) == 0) return L;
    }
  L.corner = -1;
  return L;
}

}  // namespace

double PlotArea::to_x(double x) const { return box.x + (x - xmin) / (xmax - xmin) * box.w; }

double PlotArea::to_y(double y) const {
  const double lo = axis_value(ymin, log_y), hi = axis_value(ymax, log_y);
  return box.y + box.h - (axis_value(y, log_y) - lo) / (hi - lo) * box.h;
}

LineChart render_line_chart(const std::vector<LinePanel>& panels, const LineChartOptions& opt) {
  if (panels.empty()) fail(kOp, "panels: none given; wanted at least one");
  if (opt.plot_width < 40 || opt.plot_height < 40 || opt.plot_width > 4000 || opt.plot_height > 4000)
    fail(kOp, "plot size ", opt.plot_width, " x ", opt.plot_height, " is outside 40 .. 4000 pixels a side");
  for (size_t i = 0; i < panels.size(); ++i) check_panel(panels[i], i);

  Canvas m(1, 1);
  m.set_font(detail::kLabelFont);
  const int label_h = static_cast<int>(std::ceil(m.ascent() + m.descent()));
  m.set_font(detail::kTickFont);
  const int tick_h = static_cast<int>(std::ceil(m.ascent() + m.descent()));
  m.set_font(detail::kFigureTitleFont, true);
  const int fig_title_h = opt.title.empty() ? 0 : static_cast<int>(std::ceil(m.ascent() + m.descent())) + 12;
  bool any_title = false, any_xlabel = false;
  for (const LinePanel& p : panels) any_title |= !p.title.empty(), any_xlabel |= !p.xlabel.empty();
  const int top = detail::kMargin + fig_title_h + (any_title ? label_h + 8 : 0);

  std::vector<PanelPlan> plans(panels.size());
  int x = detail::kMargin;
  for (size_t i = 0; i < panels.size(); ++i) {
    const LinePanel& p = panels[i];
    PanelPlan& pl = plans[i];
    fit_ranges(p, &pl.area);
    pl.xt = linear_ticks(pl.area.xmin, pl.area.xmax, std::max(2, opt.plot_width / 90));
    pl.yt = p.log_y ? log_ticks(pl.area.ymin, pl.area.ymax, std::max(2, opt.plot_height / 50))
                    : linear_ticks(pl.area.ymin, pl.area.ymax, std::max(2, opt.plot_height / 50));
    m.set_font(detail::kTickFont);
    int ytw = 0;
    for (const auto& l : pl.yt.labels) ytw = std::max(ytw, static_cast<int>(std::ceil(m.text_width(l))));
    if (!p.ylabel.empty()) {
      pl.ylabel_x = x + label_h / 2;
      x += label_h + 6;
    }
    x += ytw + 4 + detail::kTickLen;
    pl.area.box = {x, top, opt.plot_width, opt.plot_height};
    pl.legend = plan_legend(p, pl.area, m);
    x += opt.plot_width + kPanelGap;
    if (!pl.legend.entries.empty() && pl.legend.corner < 0) x += pl.legend.w + 12;
  }
  const int width = x - kPanelGap + detail::kMargin + 6;  // room for the last x tick label's overhang
  const int xtick_y = top + opt.plot_height + detail::kTickLen + 4;
  const int xlabel_y = xtick_y + tick_h + 4;
  const int height = xlabel_y + (any_xlabel ? label_h : 0) + detail::kMargin;

  Canvas cv(width, height);
  cairo_t* cr = cv.cr();
  if (!opt.title.empty()) {
    cv.set_font(detail::kFigureTitleFont, true);
    cv.text(opt.title, width / 2.0, detail::kMargin, HAlign::Center, VAlign::Top);
  }
  LineChart out;
  for (size_t i = 0; i < panels.size(); ++i) {
    const LinePanel& p = panels[i];
    const PanelPlan& pl = plans[i];
    const PlotArea& a = pl.area;
    const Box& b = a.box;

    // Grid lines and ticks.
    cv.set_font(detail::kTickFont);
    for (size_t t = 0; t < pl.yt.values.size(); ++t) {
      const double ty = std::round(a.to_y(pl.yt.values[t])) + 0.5;
      cv.line(b.x, ty, b.x + b.w, ty, detail::kGrid);
      cv.line(b.x - detail::kTickLen - 1, ty, b.x - 1, ty, detail::kAxis);
      cv.text(pl.yt.labels[t], b.x - detail::kTickLen - 4, ty, HAlign::Right, VAlign::Middle);
    }
    for (size_t t = 0; t < pl.xt.values.size(); ++t) {
      const double tx = std::round(a.to_x(pl.xt.values[t])) + 0.5;
      cv.line(tx, b.y, tx, b.y + b.h, detail::kGrid);
      cv.line(tx, b.y + b.h + 1, tx, b.y + b.h + 1 + detail::kTickLen, detail::kAxis);
      cv.text(pl.xt.labels[t], tx, xtick_y, HAlign::Center, VAlign::Top);
    }
    cv.frame(b, detail::kAxis);

    // The series, clipped to the plotting area.
    cairo_save(cr);
    cairo_rectangle(cr, b.x, b.y, b.w, b.h);
    cairo_clip(cr);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    for (size_t s = 0; s < p.series.size(); ++s) {
      const Series& se = p.series[s];
      detail::set_color(cr, series_color(se, s));
      cairo_set_line_width(cr, 2.0);
      bool pen_down = false;
      for (size_t k = 0; k < se.x.size(); ++k) {
        if (std::isnan(se.x[k]) || std::isnan(se.y[k])) {
          pen_down = false;
          continue;
        }
        const double px = a.to_x(se.x[k]), py = a.to_y(se.y[k]);
        if (pen_down) cairo_line_to(cr, px, py); else cairo_move_to(cr, px, py);
        pen_down = true;
      }
      cairo_stroke(cr);
      // A lone point between gaps would be invisible as a line: give it a dot.
      for (size_t k = 0; k < se.x.size(); ++k) {
        if (std::isnan(se.x[k]) || std::isnan(se.y[k])) continue;
        const bool prev = k > 0 && !std::isnan(se.x[k - 1]) && !std::isnan(se.y[k - 1]);
        const bool next = k + 1 < se.x.size() && !std::isnan(se.x[k + 1]) && !std::isnan(se.y[k + 1]);
        if (se.markers || (!prev && !next)) {
          cairo_arc(cr, a.to_x(se.x[k]), a.to_y(se.y[k]), 3.5, 0, 2 * std::numbers::pi);
          cairo_fill(cr);
        }
      }
    }
    cairo_restore(cr);

    // Legend: a white box over the grid (or beside the plot), one line per named series.
    if (!pl.legend.entries.empty()) {
      const Box L = legend_box(b, pl.legend);
      cairo_save(cr);
      cairo_set_source_rgba(cr, 1, 1, 1, 0.9);
      cairo_rectangle(cr, L.x, L.y, L.w, L.h);
      cairo_fill(cr);
      cairo_restore(cr);
      cv.frame({L.x + 1, L.y + 1, L.w - 2, L.h - 2}, Rgb{200, 200, 200});
      cv.set_font(detail::kTickFont + 1);
      for (size_t e = 0; e < pl.legend.entries.size(); ++e) {
        const Series& se = p.series[pl.legend.entries[e]];
        const double cy = L.y + 4 + (e + 0.5) * kLegendRow;
        const Rgb col = series_color(se, pl.legend.entries[e]);
        cv.line(L.x + 8, cy, L.x + 8 + kLegendSwatch, cy, col, 2.0);
        if (se.markers) {
          detail::set_color(cr, col);
          cairo_arc(cr, L.x + 8 + kLegendSwatch / 2.0, cy, 3.5, 0, 2 * std::numbers::pi);
          cairo_fill(cr);
        }
        cv.text(se.name, L.x + 8 + kLegendSwatch + 6, cy, HAlign::Left, VAlign::Middle);
      }
    }

    // Title and axis labels.
    cv.set_font(detail::kTitleFont, true);
    if (!p.title.empty()) cv.text(p.title, b.x + b.w / 2.0, b.y - 8, HAlign::Center, VAlign::Bottom);
    cv.set_font(detail::kLabelFont);
    if (!p.xlabel.empty()) cv.text(p.xlabel, b.x + b.w / 2.0, xlabel_y, HAlign::Center, VAlign::Top);
    if (!p.ylabel.empty())
      cv.text(p.ylabel, pl.ylabel_x, b.y + b.h / 2.0, HAlign::Center, VAlign::Middle, detail::kText,
              -std::numbers::pi / 2);
    out.areas.push_back(a);
  }
  out.image = cv.to_image();
  return out;
}

}  // namespace mha::plot
