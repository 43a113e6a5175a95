// `mha demo`: the seed's check, with each head's attention weights shown.
#include <cstdio>

#include "commands.h"
#include "mha/mha.h"

namespace mha::tools {

namespace {

struct DemoOptions {
  uint64_t seed = 0;
};

void run_demo(const DemoOptions& opt) {
  // The seed: num_hiddens 100, 5 heads, dropout 0.5; B 2, Q 4, K 6;
  // valid_lens [3, 2]; X = ones(2, 4, 100), Y = ones(2, 6, 100).
  const int64_t num_hiddens = 100, num_heads = 5, batch = 2, queries = 4, kvpairs = 6;
  MultiHeadAttention attention(num_hiddens, num_heads, 0.5f, /*bias=*/false, opt.seed);
  const ValidLens valid_lens = ValidLens::per_batch({3, 2});
  const Tensor X({batch, queries, num_hiddens}, 1.0f);
  const Tensor Y({batch, kvpairs, num_hiddens}, 1.0f);
  const Tensor out = attention(X, Y, Y, valid_lens);  // training mode, as in the seed

  const Shape wanted = {batch, queries, num_hiddens};
  std::printf("mha %s: the seed's check\n", kVersion);
  std::printf("  MultiHeadAttention(num_hiddens=%lld, num_heads=%lld, dropout=0.5), training mode\n",
              static_cast<long long>(num_hiddens), static_cast<long long>(num_heads));
  std::printf("  queries X = ones(2, 4, 100), keys = values Y = ones(2, 6, 100), valid_lens = [3, 2]\n");
  std::printf("output shape: %s  (batch_size, num_queries, num_hiddens) = %s: %s\n",
              shape_str(out.shape()).c_str(), shape_str(wanted).c_str(),
              out.shape() == wanted ? "ok" : "MISMATCH");
  if (out.shape() != wanted) throw Error("[demo] output shape differs from the seed's check");

  const Tensor& w = attention.attention_weights();  // (B, h, Q, K)
  std::printf("\nattention weights of batch row 0 (valid_len 3: keys 3..5 are masked)\n");
  for (int64_t h = 0; h < num_heads; ++h) {
    std::printf("head %lld    ", static_cast<long long>(h));
    for (int64_t k = 0; k < kvpairs; ++k) std::printf("   key %lld", static_cast<long long>(k));
    std::printf("\n");
    for (int64_t q = 0; q < queries; ++q) {
      std::printf("  query %lld ", static_cast<long long>(q));
      for (int64_t k = 0; k < kvpairs; ++k) std::printf("  %6.4f", w.at({0, h, q, k}));
      std::printf("\n");
    }
  }
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "Run the seed's check and show each head's weights");
  cmd->add_option("--seed", opt->seed, "Seed of the initialisation and dropout")->capture_default_str();
  cmd->callback([opt] { run_demo(*opt); });
}

}  // namespace mha::tools
