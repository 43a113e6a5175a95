// Images to PNG and back, and the atomic write.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <random>
#include <string>

#include "mha/error.h"
#include "mha/plot.h"
#include "png_decode.h"

using namespace mha::plot;

namespace {

std::string make_temp_dir() {
  char tmpl[] = "/tmp/mha-plot-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (!d) throw std::runtime_error("mkdtemp failed");
  return d;
}

int count_files(const std::string& dir) {
  int n = 0;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

Image random_image(int w, int h, bool opaque, uint32_t seed) {
  std::mt19937 gen(seed);
  Image im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 4)};
  for (size_t i = 0; i < im.rgba.size(); ++i) im.rgba[i] = static_cast<uint8_t>(gen());
  if (opaque)
    for (size_t i = 3; i < im.rgba.size(); i += 4) im.rgba[i] = 255;
  return im;
}

}  // namespace

TEST(PlotPng, OpaqueImageRoundTripsExactly) {
  for (auto [w, h] : {std::pair{1, 1}, std::pair{7, 3}, std::pair{64, 65}}) {
    const Image im = random_image(w, h, true, 11u + w);
    const Image back = decode_png(encode_png(im));
    EXPECT_EQ(back.width, w);
    EXPECT_EQ(back.height, h);
    EXPECT_EQ(back.rgba, im.rgba) << w << " x " << h;
  }
}

TEST(PlotPng, TranslucentPixelsKeepAlphaAndNearlyTheirColour) {
  // cairo stores premultiplied colour, so a channel survives to within 255 / alpha / 2 + 1.
  const Image im = random_image(40, 30, false, 5);
  const Image back = decode_png(encode_png(im));
  for (size_t p = 0; p < im.rgba.size(); p += 4) {
    const int a = im.rgba[p + 3];
    ASSERT_EQ(back.rgba[p + 3], a);
    if (a == 0) continue;
    for (int c = 0; c < 3; ++c)
      EXPECT_LE(std::abs(back.rgba[p + c] - im.rgba[p + c]), 255.0 / a / 2 + 1) << "alpha " << a;
  }
}

TEST(PlotPng, WritePngIsReadableByCairosOwnReader) {
  const std::string dir = make_temp_dir();
  const std::string path = dir + "/a.png";
  const Image im = random_image(9, 4, true, 3);
  write_png(path, im);
  DecodedPng png(path);
  ASSERT_TRUE(png.ok());
  EXPECT_EQ(png.width, 9);
  EXPECT_EQ(png.height, 4);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 9; ++x) EXPECT_EQ(png.rgb(x, y), im.rgb_at(x, y));
  EXPECT_EQ(count_files(dir), 1);  // no temporary left beside it
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST(PlotPng, FailedWriteThrowsAndLeavesTheOldFile) {
  const std::string dir = make_temp_dir();
  EXPECT_THROW(write_png(dir + "/no/such/folder/a.png", random_image(2, 2, true, 1)), mha::Error);
  const std::string path = dir + "/keep.png";
  write_png(path, random_image(3, 3, true, 2));
  const Image bad{2, 2, std::vector<uint8_t>(5)};  // wrong byte count
  EXPECT_THROW(write_png(path, bad), mha::Error);
  EXPECT_EQ(read_png(path).width, 3);
  EXPECT_EQ(count_files(dir), 1);
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST(PlotPng, GarbageIsAnErrorNamingTheSource) {
  const std::vector<uint8_t> junk = {'n', 'o', 't', ' ', 'p', 'n', 'g'};
  try {
    decode_png(junk, "junk.bin");
    FAIL() << "no error";
  } catch (const mha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk.bin"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_png("/nonexistent/x.png"), mha::Error);
}

TEST(PlotPng, PixelOutsideTheImageIsAnError) {
  const Image im = random_image(3, 2, true, 1);
  EXPECT_THROW(im.rgb_at(3, 0), mha::Error);
  EXPECT_THROW(im.rgb_at(0, -1), mha::Error);
}
