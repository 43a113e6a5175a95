// src/plot/canvas.cpp: text, rectangles and lines on a cairo image surface,
// and the round tick values of axes.
#include "canvas.h"

#include <cmath>
#include <cstdio>

#include "mha/error.h"

namespace mha::plot::detail {

void set_color(cairo_t* cr, Rgb c) { cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0); }

Canvas::Canvas(int width, int height) : width_(width), height_(height) {
  if (width <= 0 || height <= 0 || width > kMaxCanvasSide || height > kMaxCanvasSide)
    fail("plot", "image size ", width, " x ", height, " is outside 1 .. ", kMaxCanvasSide, " pixels a side");
  surface_ = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, width, height);
  cr_ = cairo_create(surface_);
  if (cairo_status(cr_) != CAIRO_STATUS_SUCCESS) {
    const char* why = cairo_status_to_string(cairo_status(cr_));
    cairo_destroy(cr_);
    cairo_surface_destroy(surface_);
    fail("plot", "cannot make a ", width, " x ", height, " cairo surface: ", why);
  }
  set_color(cr_, kWhite);
  cairo_paint(cr_);
  cairo_select_font_face(cr_, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
}

Canvas::~Canvas() {
  cairo_destroy(cr_);
  cairo_surface_destroy(surface_);
}

void Canvas::set_font(double size, bool bold) {
  cairo_select_font_face(cr_, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr_, size);
}

double Canvas::text_width(const std::string& s) {
  cairo_text_extents_t e;
  cairo_text_extents(cr_, s.c_str(), &e);
  return e.x_advance;
}

double Canvas::ascent() {
  cairo_font_extents_t e;
  cairo_font_extents(cr_, &e);
  return e.ascent;
}

double Canvas::descent() {
  cairo_font_extents_t e;
  cairo_font_extents(cr_, &e);
  return e.descent;
}

void Canvas::text(const std::string& s, double x, double y, HAlign h, VAlign v, Rgb color,
                  double angle) {
  if (s.empty()) return;
  const double w = text_width(s);
  double dx = 0, dy = 0;
  if (h == HAlign::Center) dx = -w / 2;
  if (h == HAlign::Right) dx = -w;
  // Vertical placement uses the font's ascent and descent, not the string's
  // ink, so labels with and without descenders line up.
  const double a = ascent() * 0.78, d = descent();  // cap height is about 0.78 of the ascent
  if (v == VAlign::Top) dy = a;
  if (v == VAlign::Middle) dy = a / 2;
  if (v == VAlign::Bottom) dy = -d;
  cairo_save(cr_);
  set_color(cr_, color);
  cairo_translate(cr_, x, y);
  cairo_rotate(cr_, angle);
  cairo_move_to(cr_, dx, dy);
  cairo_show_text(cr_, s.c_str());
  cairo_restore(cr_);
}

void Canvas::fill_rect(int x, int y, int w, int h, Rgb color) {
  if (w <= 0 || h <= 0) return;
  cairo_save(cr_);
  cairo_set_antialias(cr_, CAIRO_ANTIALIAS_NONE);
  set_color(cr_, color);
  cairo_rectangle(cr_, x, y, w, h);
  cairo_fill(cr_);
  cairo_restore(cr_);
}

void Canvas::frame(const Box& b, Rgb color) {
  cairo_save(cr_);
  set_color(cr_, color);
  cairo_set_line_width(cr_, 1.0);
  // Half-pixel offsets put the one-pixel line on whole pixels just outside the box.
  cairo_rectangle(cr_, b.x - 0.5, b.y - 0.5, b.w + 1.0, b.h + 1.0);
  cairo_stroke(cr_);
  cairo_restore(cr_);
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb color, double width) {
  cairo_save(cr_);
  set_color(cr_, color);
  cairo_set_line_width(cr_, width);
  cairo_move_to(cr_, x0, y0);
  cairo_line_to(cr_, x1, y1);
  cairo_stroke(cr_);
  cairo_restore(cr_);
}

Image Canvas::to_image() { return image_from_surface(surface_); }

double nice_step(double raw) {
  if (!(raw > 0) || !std::isfinite(raw)) return 1.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

std::vector<double> nice_ticks(double lo, double hi, int target, double* step_out) {
  std::vector<double> ticks;
  if (!(hi > lo) || target < 1) return ticks;
  const double step = nice_step((hi - lo) / target);
  if (step_out) *step_out = step;
  const double eps = step * 1e-9;
  for (double k = std::ceil((lo - eps) / step); k * step <= hi + eps; k += 1) {
    const double v = k * step;
    ticks.push_back(std::abs(v) < eps ? 0.0 : v);  // no "-0"
  }
  return ticks;
}

std::string format_tick(double v, double step) {
  char buf[32];
  const double a = std::abs(v);
  if (v != 0 && (a >= 1e6 || a < 1e-4)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
  }
  int decimals = 0;
  if (step > 0 && step < 1) decimals = static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  // A step like 0.25 (from a 2.5 multiple of a tick count) needs one more.
  if (step > 0 && std::abs(std::round(step * std::pow(10.0, decimals)) - step * std::pow(10.0, decimals)) > 1e-6)
    ++decimals;
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string str(long long v) { return std::to_string(v); }

}  // namespace mha::plot::detail
