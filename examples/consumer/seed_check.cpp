// The d2l chapter's check, as a user of the installed library writes it:
//
//   num_hiddens, num_heads = 100, 5
//   attention = MultiHeadAttention(num_hiddens, num_heads, 0.5)
//   batch_size, num_queries, num_kvpairs = 2, 4, 6
//   valid_lens = torch.tensor([3, 2])
//   X = torch.ones((batch_size, num_queries, num_hiddens))
//   Y = torch.ones((batch_size, num_kvpairs, num_hiddens))
//   d2l.check_shape(attention(X, Y, Y, valid_lens),
//                   (batch_size, num_queries, num_hiddens))
//
// Exit status 0 when the output has the d2l chapter's shape.
#include <cstdio>

#include <mha/mha.h>

int main() {
  const int64_t num_hiddens = 100, num_heads = 5;
  mha::MultiHeadAttention attention(num_hiddens, num_heads, /*dropout=*/0.5f);
  const int64_t batch_size = 2, num_queries = 4, num_kvpairs = 6;
  const mha::ValidLens valid_lens = mha::ValidLens::per_batch({3, 2});
  const mha::Tensor X({batch_size, num_queries, num_hiddens}, 1.0f);
  const mha::Tensor Y({batch_size, num_kvpairs, num_hiddens}, 1.0f);
  const mha::Tensor out = attention(X, Y, Y, valid_lens);

  const mha::Shape wanted = {batch_size, num_queries, num_hiddens};
  std::printf("mha %s: output shape %s, wanted %s: %s\n", mha::kVersion,
              mha::shape_str(out.shape()).c_str(), mha::shape_str(wanted).c_str(),
              out.shape() == wanted ? "ok" : "MISMATCH");
  return out.shape() == wanted ? 0 : 1;
}
