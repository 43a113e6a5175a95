// src/cpu/fused/attention_fused.h: the fused CPU attention kernels, by name.
//
// Modules reach them through kernels::attention_forward / attention_backward
// / attention_weights (kernels/dispatch.h), which route key axes longer than
// kFusedMaxKeys (cpu/fused/limits.h) elsewhere; tests of these kernels call
// them here by name.
//
// The forward runs an online softmax over key tiles in linear memory and can
// save, per (b, head, query), the two softmax statistics
// (kernels/params.h) from which the weights and the gradients are
// recomputed without ever storing a (Q, K) matrix. Keys it skips are the
// masked keys of rows whose largest unmasked score exceeds the fill by more
// than 104 (150 in base 2): their weights are exactly 0 in float32, in the
// d2l chapter's code as here.
//
// What it reads: k rows only below the largest length of the batch row's
// queries; v rows also beyond that only for queries whose masked keys carry
// weight (valid length 0, or scores within 104 of the fill), or for rows the
// caller flags (AttentionForward::read_all_keys). Callers that skip
// projecting padded rows rely on this (nn/row_plan.h). The backward reads the
// same rows.
//
// It honours every mask option and grouped heads. Causality, lengths and
// the last kept key of a key_keep row fold into one key limit per query, so
// tiles past it are skipped; other masks run a masking pass over each score
// tile. A fully masked row (kernels/masked_row.h) gets the policy and the
// statistics row_max2 = -inf, row_sum = 1, from which the weights and the
// backward recompute it.
#pragma once

#include <vector>

#include "cpu/fused/fused_job.h"
#include "cpu/fused/isa.h"
#include "cpu/fused/limits.h"
#include "kernels/params.h"

namespace mha::kernels {

// q:[B,h,Q,d] k:[B,hkv,K,d] v:[B,hkv,K,dv] -> out:[B,h,Q,dv]
//   (+ stats:[B,h,Q] when p.stats is set, + weights:[B,h,Q,K] when set, by a
//   second pass from the statistics). K <= kFusedMaxKeys (asserted).
// NaN and infinities propagate as in the chapter's code (a NaN or +inf score
// makes its row NaN; NaN in a value read with weight 0 makes the output
// NaN), except from value rows past every length, which it does not read
// unless p.read_all_keys says to.
void attention_forward_fused(const AttentionForward& p);

// The weights of a subset of (batch row, head) pairs from p.fwd.stats, by
// the same tile kernel: out:[rows.size(), heads.size(), Q, K].
void attention_weights_fused(const AttentionWeightsParams& p);

// Gradients of q, k, v from the statistics in p.fwd.stats (recomputing P tile
// by tile, never a (Q, K) matrix), in memory linear in the lengths, with the
// forward's masks and grouped heads. p.fwd.out is required; p.fwd.weights is
// ignored.
//   q:[B,h,Q,d] k,v:[B,hkv,K,d|dv] grad_out,out:[B,h,Q,dv] stats:[B,h,Q]
//     -> grad_q:[B,h,Q,d] grad_k:[B,hkv,K,d] grad_v:[B,hkv,K,dv]
void attention_backward_fused(const AttentionBackward& p);

// The query tiles of `size` queries at most of a packed batch
// (m.doc_offsets over Q rows): each non-empty document's rows cut from its
// first row, which is also the tiles' key0 (fused_job.h QueryTile); empty
// without documents (the kernels then tile [t*size, ...) themselves).
std::vector<fused::QueryTile> fused_query_tiles(const MaskOptions& m, int64_t Q, int64_t size);

}  // namespace mha::kernels
