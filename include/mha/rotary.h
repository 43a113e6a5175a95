// mha/rotary.h: rotary position embeddings on the projected queries and keys.
//
// RoFormer's rotary embedding (Su et al. 2021), as LLaMA, GPT-NeoX, GPT-J
// and most decoders since apply it: after the projections, each head's q
// and k rows are rotated by angles that grow with their position, so that
// q_i . k_j depends on i - j alone. Values and the output are untouched.
//
// For a head of width d, the first `dims` entries (even, <= d) form dims/2
// pairs (x1, x2); pair m of the row at position p turns by
//   angle = p * theta_m,  theta_m = 1 / base^(2m / dims)
//   (x1, x2) -> (x1 cos(angle) - x2 sin(angle), x2 cos(angle) + x1 sin(angle))
// and entries past `dims` pass through (partial rotary, GPT-NeoX's
// rotary_pct). The pairs are laid out
//   Half:        (x[m], x[m + dims/2])   Hugging Face's rotate_half (LLaMA, GPT-NeoX, Mistral)
//   Interleaved: (x[2m], x[2m + 1])      GPT-J and Meta's LLaMA (complex pairs)
// theta, the angle and its cosine and sine are float32, computed as Hugging
// Face's LlamaRotaryEmbedding computes them (theta = 1 / base^(2m/dims) in
// float32, angle = float32(p) * theta), so a model ported from it sees the
// same rotations.
//
// Positions: query i and key j of an uncached call are at positions i and
// j. A cached call (mha/kv_cache.h) numbers the new positions of batch row b
// from that row's cached length, and the cache keeps the rotated keys, so a
// decoding loop sees the positions an uncached call over the whole sequence
// would. The backward rotates the gradients of q and k back (the transpose
// of a rotation is its inverse).
#pragma once

#include <cstdint>

namespace mha {

// A module's rotary embedding (see the file comment); dims = 0: off.
struct Rotary {
  // How a head's rotated entries pair up: Half (x[m], x[m + dims/2]) or
  // Interleaved (x[2m], x[2m + 1]).
  enum class Layout { Half, Interleaved };
  // Rotated entries per head: even, at most the head width; 0 = off.
  int64_t dims = 0;
  // The wavelength base (10000 in RoFormer and LLaMA 2; 500000 in LLaMA 3).
  float base = 10000.0f;
  // The pairs' layout (Half: Hugging Face's rotate_half).
  Layout layout = Layout::Half;

  // Whether any entry is rotated.
  bool enabled() const { return dims > 0; }
  // The same dims, base and layout.
  bool operator==(const Rotary& o) const { return dims == o.dims && base == o.base && layout == o.layout; }
};

// mha::Error (naming `op`) unless dims is even and >= 0 and base finite and
// > 1 (when dims > 0); with head_dim >= 0, unless dims <= head_dim too.
void check_rotary(const char* op, const Rotary& r, int64_t head_dim = -1);

}  // namespace mha
