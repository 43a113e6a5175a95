// The installed picture library (mha::plot), as a user links it: attention
// weights of the d2l chapter's toy module drawn as a heatmap grid and encoded as PNG.
//
// Exit status 0 when the PNG starts with the PNG signature and the image has
// one panel per head.
#include <cstdio>
#include <cstring>

#include <mha/mha.h>
#include <mha/plot.h>

int main() {
  const int64_t num_hiddens = 100, num_heads = 5;
  mha::MultiHeadAttention attention(num_hiddens, num_heads, /*dropout=*/0.0f);
  const mha::Tensor X({2, 4, num_hiddens}, 1.0f);
  const mha::Tensor Y({2, 6, num_hiddens}, 1.0f);
  attention(X, Y, Y, mha::ValidLens::per_batch({3, 2}));
  // attention_weights():[B, h, Q, K], d2l's show_heatmaps layout [rows, cols, Q, K].
  const mha::Tensor w = attention.attention_weights();

  const mha::plot::Heatmaps fig = mha::plot::render_heatmaps(w, mha::plot::HeatmapOptions{});
  const std::vector<uint8_t> png = mha::plot::encode_png(fig.image);
  const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  const bool ok = png.size() > 8 && std::memcmp(png.data(), signature, 8) == 0 &&
                  fig.image.width > 0 && fig.image.height > 0;
  std::printf("mha::plot: %dx%d heatmap grid, %zu PNG bytes: %s\n", fig.image.width,
              fig.image.height, png.size(), ok ? "ok" : "BAD");
  return ok ? 0 : 1;
}
