// src/plot/canvas.h: the small part of cairo the plots use, behind one class,
// plus the style (colours, fonts, spacing) and tick arithmetic both kinds of
// plot share.
#pragma once

#include <cairo.h>

#include <string>
#include <vector>

#include "mha/plot.h"

namespace mha::plot::detail {

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};
inline constexpr Rgb kText{34, 34, 34};
inline constexpr Rgb kAxis{110, 110, 110};
inline constexpr Rgb kGrid{228, 228, 228};
inline constexpr Rgb kFaint{120, 120, 120};

// Font sizes in pixels.
inline constexpr double kTickFont = 11, kLabelFont = 13, kTitleFont = 13, kFigureTitleFont = 16,
                        kNoteFont = 11;

// Spacing every figure shares, in pixels: white space around the figure,
// the length of a tick mark.
inline constexpr int kMargin = 14, kTickLen = 4;

// The largest side of a canvas: pictures far beyond any screen are a bug
// upstream (a wrong shape), not a request.
inline constexpr int kMaxCanvasSide = 20000;

enum class HAlign { Left, Center, Right };
enum class VAlign { Top, Middle, Baseline, Bottom };

// An opaque RGB drawing surface of width x height pixels, filled white.
// Sizes can also be measured on a 1 x 1 canvas before the real one is made.
class Canvas {
 public:
  Canvas(int width, int height);
  ~Canvas();
  Canvas(const Canvas&) = delete;
  Canvas& operator=(const Canvas&) = delete;

  cairo_t* cr() { return cr_; }
  int width() const { return width_; }
  int height() const { return height_; }

  void set_font(double size, bool bold = false);
  double text_width(const std::string& s);
  double ascent();   // of the current font, above the baseline
  double descent();  // below the baseline

  // Draws `s` with its (h, v) anchor at (x, y), turned by `angle` radians
  // (-pi/2 reads bottom to top) around that anchor.
  void text(const std::string& s, double x, double y, HAlign h, VAlign v, Rgb color = kText,
            double angle = 0);

  // Pixel-exact filled rectangle (no antialiasing): integer coordinates.
  void fill_rect(int x, int y, int w, int h, Rgb color);
  // A one-pixel outline just outside the box.
  void frame(const Box& b, Rgb color);
  void line(double x0, double y0, double x1, double y1, Rgb color, double width = 1.0);

  Image to_image();

 private:
  int width_, height_;
  cairo_surface_t* surface_;
  cairo_t* cr_;
};

void set_color(cairo_t* cr, Rgb c);

// Between cairo's ARGB32 surfaces (premultiplied, native-endian 32-bit words)
// and Image (straight RGBA bytes). The caller destroys the returned surface.
Image image_from_surface(cairo_surface_t* surface);
cairo_surface_t* surface_from_image(const Image& image);

// Up to about `target` round tick values (1, 2 or 5 times a power of ten
// apart) inside [lo, hi]; `step` receives their spacing.
std::vector<double> nice_ticks(double lo, double hi, int target, double* step = nullptr);
// The smallest round step (1, 2 or 5 times a power of ten) >= raw.
double nice_step(double raw);
// A tick value printed with as many decimals as its step needs ("0.25", "1e-05").
std::string format_tick(double v, double step);

// "%d"-style helpers that keep call sites short.
std::string str(long long v);

}  // namespace mha::plot::detail
