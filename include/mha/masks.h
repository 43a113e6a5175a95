// mha/masks.h: masks beside valid_lens, as typed values.
//
// A Mask is either boolean or additive. mha stores every boolean mask in ONE
// convention, "keep": true means the key takes part in attention. PyTorch has
// two opposite conventions, so a boolean array from PyTorch must come through
// the function named after where it came from (docs/masks.md has the table):
//
//   nn.MultiheadAttention key_padding_mask / attn_mask: True = masked out
//       -> mha::mask_from_torch_mha(shape, bits)
//   F.scaled_dot_product_attention attn_mask:           True = takes part
//       -> mha::mask_from_sdpa(shape, bits)
//
// An additive mask is a float added to the scaled score of each (query, key)
// pair; -inf removes the key, and NaN or +inf are refused.
//
//   mha::Mask pad = mha::mask_from_torch_mha({2, 6}, {0,0,0,1,1,1, 0,0,1,1,1,1});
//   // pad.keep_data()[3] == 0: key 3 of row 0 is masked out
//
// Causal masking and the policy for rows with every key masked are enums.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/tensor.h"

namespace mha {

// Causal masking for Q queries over K keys. With Q == K both alignments are
// the usual lower triangle; they differ when Q != K:
//   TopLeft:     query i sees keys j <= i            (PyTorch's is_causal,
//                                                     torch.ones(Q, K).tril())
//   BottomRight: query i sees keys j <= i + (K - Q)  (the last query sees
//                                                     every key: decoding with
//                                                     a cache of K - Q keys)
enum class Causal { None, TopLeft, BottomRight };

// A sliding window over the keys (local attention), as FlashAttention's
// window_size and aligned to the bottom right as it is: query i of Q sees
// key j of K iff
//   i + K - Q - left <= j <= i + K - Q + right,
// -1 leaving that side unbounded. {-1, -1} (the default) is no window;
// {w, 0} is the last w + 1 keys up to each query's diagonal (Mistral's
// sliding window of w + 1 with causal). It intersects causal and every
// other mask. Each side must be >= -1 (mha::Error otherwise).
struct Window {
  int64_t left = -1;   // keys before the diagonal a query sees (-1: all)
  int64_t right = -1;  // keys after the diagonal a query sees (-1: all)
  // Whether either side bounds anything.
  bool any() const { return left != -1 || right != -1; }
};

// What a row gets when every key of it is masked (by any mask, or by an
// additive -inf on every key). Never NaN, in either case.
enum class FullyMaskedRows {
  Uniform,  // weights 1/K over all K keys: the d2l chapter's -1e6 fill (its default)
  Zeros,    // weights 0, attention output 0: scaled_dot_product_attention's
};

// A mask with its meaning attached: none, boolean (mha's "keep" convention)
// or additive. Which shapes a mask may have is up to the module it is given
// to (see check_mask_shape); a Mask itself only holds its values.
class Mask {
 public:
  // None: no mask. Keep: boolean, nonzero = the key takes part. Additive:
  // floats added to the scaled scores.
  enum class Kind { None, Keep, Additive };

  Mask() = default;  // no mask
  // Boolean mask in mha's convention: keep[i] != 0 means "takes part".
  // Values are normalised to 0/1. `shape` must hold keep.size() elements.
  // Throws mha::Error when `shape` does not hold keep.size() elements.
  static Mask keep(Shape shape, std::vector<uint8_t> keep);
  // Additive mask: bias[i] is added to the scaled score. NaN and +inf are
  // refused (mha::Error naming the element); -inf removes the pair.
  static Mask additive(Tensor bias);

  // Which of the three kinds this mask is.
  Kind kind() const { return kind_; }
  // True for the default-constructed "no mask".
  bool is_none() const { return kind_ == Kind::None; }
  // True for a boolean mask (Mask::keep and the mask_from_* conversions).
  bool is_keep() const { return kind_ == Kind::Keep; }
  // True for an additive mask (Mask::additive).
  bool is_additive() const { return kind_ == Kind::Additive; }
  // The mask's shape as given; empty for no mask.
  const Shape& shape() const { return shape_; }
  // The number of axes of shape() (0 for no mask).
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // The number of elements of shape() (0 for no mask).
  int64_t numel() const;
  // Row-major 0/1 values of a boolean mask (1 = takes part); null otherwise.
  const uint8_t* keep_data() const { return keep_.empty() ? nullptr : keep_.data(); }
  // Row-major values of an additive mask; null otherwise.
  const float* bias_data() const { return bias_.empty() ? nullptr : bias_.data(); }
  // keep_data() as a vector (empty unless boolean).
  const std::vector<uint8_t>& keep_values() const { return keep_; }
  // bias_data() as a vector (empty unless additive).
  const std::vector<float>& bias_values() const { return bias_.values(); }

 private:
  Kind kind_ = Kind::None;
  Shape shape_;
  std::vector<uint8_t> keep_;
  Tensor bias_;
};

// nn.MultiheadAttention's boolean convention (key_padding_mask, attn_mask,
// and nn.Transformer's masks): masked_out[i] != 0 means "may NOT attend".
Mask mask_from_torch_mha(Shape shape, const std::vector<uint8_t>& masked_out);
// scaled_dot_product_attention's boolean convention (PyTorch 2.x):
// takes_part[i] != 0 means "takes part" (the same as mha's).
Mask mask_from_sdpa(Shape shape, const std::vector<uint8_t>& takes_part);
// The inverse conversions, for handing a boolean mask back to PyTorch:
// nn.MultiheadAttention's bits (nonzero = masked out), row-major in
// keep_mask.shape(). Throws mha::Error for a mask that is not boolean.
std::vector<uint8_t> mask_to_torch_mha(const Mask& keep_mask);
// scaled_dot_product_attention's bits (nonzero = takes part), row-major in
// keep_mask.shape(). Throws mha::Error for a mask that is not boolean.
std::vector<uint8_t> mask_to_sdpa(const Mask& keep_mask);

// Throws mha::Error naming `op` and `arg` unless the mask has `wanted` shape
// (or is none). Used by every module that takes masks.
void check_mask_shape(const char* op, const char* arg, const Mask& mask, const Shape& wanted);

// Score options beyond the d2l chapter (FlashAttention's softcap and
// alibi_slopes, gpt-oss's sinks), applied to each scaled score s of query i,
// key j, head h before any mask:
//   softcap > 0 (Gemma 2):   s -> softcap * tanh(s / softcap); 0: off
//   alibi_slopes [h] (ALiBi, BLOOM, MPT): s -= slope[h] * |i + K - Q - j|
//     (bottom right, as the window; slopes of either sign); empty: off
//   sinks [h] (attention sinks, gpt-oss): one more logit per head in every
//     row's softmax denominator, with no value: weights_j = exp(s_j) /
//     (exp(sink_h) + sum_k exp(s_k)), so a row's weights sum to less than 1
//     and a row with no live key gives 0 (never the fully-masked policy).
//     A learned parameter: the modules' backward returns its gradient
//     (InputGrads::sinks); empty: off
// They are not masks: a call with only these keeps the chapter's -1e6 fill.
struct ScoreOptions {
  // The cap of the scores (finite, >= 0); 0: no softcapping.
  float softcap = 0.0f;
  // One finite slope per query head, or empty (no ALiBi).
  std::vector<float> alibi_slopes;
  // One finite logit per query head, or empty (no sinks). ({}: aggregate
  // initialisers that stop at alibi_slopes stay complete.)
  std::vector<float> sinks{};

  // Whether any option is on.
  bool any() const { return softcap > 0.0f || !alibi_slopes.empty() || !sinks.empty(); }
};

// The masks beside the d2l chapter's valid lengths that one call of
// MultiHeadAttention takes, as nn.MultiheadAttention takes them (B batch
// rows, h heads, Q queries, K keys):
//   key_padding_mask (B, K): which keys of each row take part (or a bias)
//   attn_mask (Q, K) or (B*h, Q, K): which (query, key) pairs (or a bias)
//   causal: TopLeft (PyTorch's is_causal) or BottomRight
//   window: a sliding window {left, right} (Window)
// With any of them set, masked scores become -inf (the key drops out, valid
// lengths included), and a row with no live key gets `fully_masked_rows`
// (Uniform: weights 1/K, as the chapter's lengths give a row of length 0).
struct CallMasks {
  // (B, K): which keys of each batch row take part (or what is added to them).
  Mask key_padding_mask;
  // (Q, K) or (B*h, Q, K): which (query, key) pairs take part (or their bias).
  Mask attn_mask;
  // Causal masking (TopLeft is PyTorch's is_causal=True).
  Causal causal = Causal::None;
  // A sliding window (none by default).
  Window window;
  // What a row left without a live key gets.
  FullyMaskedRows fully_masked_rows = FullyMaskedRows::Uniform;
  // Softcapping, ALiBi and sinks (ScoreOptions), off by default.
  ScoreOptions scores;
};

}  // namespace mha
