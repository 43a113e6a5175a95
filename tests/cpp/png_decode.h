// tests/cpp/png_decode.h: reading a PNG file straight through cairo's own
// file reader (cairo_image_surface_create_from_png), independent of
// mha::plot's stream decoder, so the tests check what a viewer would show.
#pragma once

#include <cairo.h>

#include <cstdint>
#include <string>

#include "mha/plot.h"

struct DecodedPng {
  int width = 0, height = 0;
  cairo_surface_t* surface = nullptr;

  explicit DecodedPng(const std::string& path) {
    surface = cairo_image_surface_create_from_png(path.c_str());
    if (cairo_surface_status(surface) != CAIRO_STATUS_SUCCESS) return;
    cairo_surface_flush(surface);
    width = cairo_image_surface_get_width(surface);
    height = cairo_image_surface_get_height(surface);
  }
  ~DecodedPng() { cairo_surface_destroy(surface); }
  DecodedPng(const DecodedPng&) = delete;
  DecodedPng& operator=(const DecodedPng&) = delete;

  bool ok() const { return cairo_surface_status(surface) == CAIRO_STATUS_SUCCESS; }

  // The colour of an opaque pixel (cairo's ARGB32 / RGB24 word, read as such).
  mha::plot::Rgb rgb(int x, int y) const {
    const unsigned char* data = cairo_image_surface_get_data(surface);
    const int stride = cairo_image_surface_get_stride(surface);
    const uint32_t px = reinterpret_cast<const uint32_t*>(data + static_cast<size_t>(y) * stride)[x];
    return {static_cast<uint8_t>(px >> 16), static_cast<uint8_t>(px >> 8), static_cast<uint8_t>(px)};
  }
};
