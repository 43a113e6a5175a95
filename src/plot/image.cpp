// src/plot/image.cpp: Image pixels and PNG encoding, both through cairo.
#include <cairo.h>

#include <cstring>

#include "canvas.h"
#include "io/atomic_file.h"
#include "mha/error.h"
#include "mha/plot.h"

namespace mha::plot {

namespace {

void check_pixel(const Image& im, int x, int y) {
  if (x < 0 || y < 0 || x >= im.width || y >= im.height)
    fail("plot.Image", "pixel (", x, ", ", y, ") is outside the ", im.width, " x ", im.height,
         " image");
}

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  auto* out = static_cast<std::vector<uint8_t>*>(closure);
  out->insert(out->end(), data, data + length);
  return CAIRO_STATUS_SUCCESS;
}

struct Reader {
  const std::vector<uint8_t>* bytes;
  size_t pos = 0;
};

cairo_status_t read_bytes(void* closure, unsigned char* data, unsigned int length) {
  auto* r = static_cast<Reader*>(closure);
  if (r->bytes->size() - r->pos < length) return CAIRO_STATUS_READ_ERROR;
  std::memcpy(data, r->bytes->data() + r->pos, length);
  r->pos += length;
  return CAIRO_STATUS_SUCCESS;
}

}  // namespace

Rgb Image::rgb_at(int x, int y) const {
  check_pixel(*this, x, y);
  const uint8_t* p = &rgba[(static_cast<size_t>(y) * width + x) * 4];
  return {p[0], p[1], p[2]};
}

uint8_t Image::alpha_at(int x, int y) const {
  check_pixel(*this, x, y);
  return rgba[(static_cast<size_t>(y) * width + x) * 4 + 3];
}

namespace detail {

Image image_from_surface(cairo_surface_t* surface) {
  cairo_surface_flush(surface);
  const cairo_format_t format = cairo_image_surface_get_format(surface);
  if (format != CAIRO_FORMAT_ARGB32 && format != CAIRO_FORMAT_RGB24)
    fail("plot.Image", "cairo surface format ", static_cast<int>(format),
         " where ARGB32 or RGB24 is wanted");
  Image im;
  im.width = cairo_image_surface_get_width(surface);
  im.height = cairo_image_surface_get_height(surface);
  im.rgba.resize(static_cast<size_t>(im.width) * im.height * 4);
  const int stride = cairo_image_surface_get_stride(surface);
  const unsigned char* data = cairo_image_surface_get_data(surface);
  for (int y = 0; y < im.height; ++y) {
    const auto* row = reinterpret_cast<const uint32_t*>(data + static_cast<size_t>(y) * stride);
    uint8_t* out = &im.rgba[static_cast<size_t>(y) * im.width * 4];
    for (int x = 0; x < im.width; ++x) {
      const uint32_t px = row[x];
      const uint32_t a = format == CAIRO_FORMAT_RGB24 ? 255u : px >> 24;
      uint32_t r = (px >> 16) & 255u, g = (px >> 8) & 255u, b = px & 255u;
      if (a != 0 && a != 255) {  // cairo premultiplies; Image does not
        r = (r * 255 + a / 2) / a;
        g = (g * 255 + a / 2) / a;
        b = (b * 255 + a / 2) / a;
      }
      out[4 * x + 0] = static_cast<uint8_t>(r);
      out[4 * x + 1] = static_cast<uint8_t>(g);
      out[4 * x + 2] = static_cast<uint8_t>(b);
      out[4 * x + 3] = static_cast<uint8_t>(a);
    }
  }
  return im;
}

cairo_surface_t* surface_from_image(const Image& im) {
  if (im.width <= 0 || im.height <= 0 ||
      im.rgba.size() != static_cast<size_t>(im.width) * im.height * 4)
    fail("plot.encode_png", "image: ", im.width, " x ", im.height, " with ", im.rgba.size(),
         " bytes, wanted a positive size and width * height * 4 bytes");
  cairo_surface_t* s = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, im.width, im.height);
  if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
    cairo_surface_destroy(s);
    fail("plot.encode_png", "cannot make a ", im.width, " x ", im.height, " cairo surface");
  }
  cairo_surface_flush(s);
  const int stride = cairo_image_surface_get_stride(s);
  unsigned char* data = cairo_image_surface_get_data(s);
  for (int y = 0; y < im.height; ++y) {
    auto* row = reinterpret_cast<uint32_t*>(data + static_cast<size_t>(y) * stride);
    const uint8_t* in = &im.rgba[static_cast<size_t>(y) * im.width * 4];
    for (int x = 0; x < im.width; ++x) {
      const uint32_t a = in[4 * x + 3];
      auto pre = [a](uint32_t c) { return (c * a + 127) / 255; };
      row[x] = (a << 24) | (pre(in[4 * x]) << 16) | (pre(in[4 * x + 1]) << 8) | pre(in[4 * x + 2]);
    }
  }
  cairo_surface_mark_dirty(s);
  return s;
}

}  // namespace detail

std::vector<uint8_t> encode_png(const Image& image) {
  cairo_surface_t* s = detail::surface_from_image(image);
  std::vector<uint8_t> bytes;
  const cairo_status_t st = cairo_surface_write_to_png_stream(s, append_bytes, &bytes);
  cairo_surface_destroy(s);
  if (st != CAIRO_STATUS_SUCCESS)
    fail("plot.encode_png", "cairo could not encode the ", image.width, " x ", image.height, " image: ",
         cairo_status_to_string(st));
  return bytes;
}

void write_png(const std::string& path, const Image& image) {
  io::write_file_atomic(path, encode_png(image));
}

Image decode_png(const std::vector<uint8_t>& png, const std::string& origin) {
  Reader reader{&png};
  cairo_surface_t* s = cairo_image_surface_create_from_png_stream(read_bytes, &reader);
  const cairo_status_t st = cairo_surface_status(s);
  if (st != CAIRO_STATUS_SUCCESS) {
    cairo_surface_destroy(s);
    fail("plot.read_png", origin, ": not a PNG cairo can read (", cairo_status_to_string(st), ")");
  }
  Image im = detail::image_from_surface(s);
  cairo_surface_destroy(s);
  return im;
}

Image read_png(const std::string& path) { return decode_png(io::read_file(path), path); }

}  // namespace mha::plot
