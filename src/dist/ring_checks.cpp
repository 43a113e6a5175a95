// src/dist/ring_checks.cpp: see dist/ring_checks.h.
#include "dist/ring_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/memory.h"
#include "dist/agree.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "nn/call_masks.h"

namespace mha::dist {

RingLayout check_ring_forward(const Communicator& c, const char* op, const RingModule& m, const RingArgs& a,
                              uint64_t* planned_bytes) {
  const Tensor &queries = *a.queries, &keys = *a.keys, &values = *a.values;
  const ValidLens& valid_lens = *a.valid_lens;
  const CallMasks& masks = *a.masks;
  const std::vector<float>& given_sinks = *a.given_sinks;
  const std::vector<int64_t>& doc_offsets = *a.doc_offsets;
  // The sinks come as the modules take them (masks.scores.sinks) or as the
  // argument; one place, not both.
  const std::vector<float>& sinks = given_sinks.empty() ? masks.scores.sinks : given_sinks;
  const int P = c.size(), r = c.rank();
  const int64_t H = m.heads, Hd = H * m.head_dim;
  agree(c, op, [&] {
    const char* names[] = {"queries", "keys", "values"};
    const char* wanted[] = {"(B, Q_r, Dq)", "(B, K_r, Dk)", "(B, K_r, Dv)"};
    const char* layer[] = {"W_q", "W_k", "W_v"};
    const Tensor* in[] = {&queries, &keys, &values};
    for (int i = 0; i < 3; ++i)
      if (in[i]->dim() != 3) fail(op, names[i], ": shape ", shape_str(in[i]->shape()), " is not ", wanted[i]);
    for (int i = 1; i < 3; ++i)
      if (in[i]->size(0) != queries.size(0))
        fail(op, names[i], ": batch size ", in[i]->size(0), " differs from queries' ", queries.size(0), " (",
             names[i], " ", shape_str(in[i]->shape()), ", queries ", shape_str(queries.shape()), ")");
    if (values.size(1) != keys.size(1))
      fail(op, "values: shape ", shape_str(values.shape()), " has ", values.size(1), " positions but keys ",
           shape_str(keys.shape()), " have ", keys.size(1));
    for (int i = 0; i < 3; ++i) {
      const int64_t want = m.params->at(std::string(layer[i]) + ".weight").size(1);
      if (in[i]->size(2) != want)
        fail(op, names[i], ": width ", in[i]->size(2), " (shape ", shape_str(in[i]->shape()), ") differs from ",
             layer[i], "'s input width ", want, " in the state dict");
    }
    valid_lens.check(op, queries.size(0), queries.size(1));
    if (!masks.key_padding_mask.is_none() || !masks.attn_mask.is_none())
      fail(op, !masks.key_padding_mask.is_none() ? "masks.key_padding_mask" : "masks.attn_mask",
           ": given; the ring takes valid lengths (global key positions), causal and window only");
    nn::check_window(op, masks.window);
    if (!given_sinks.empty() && !masks.scores.sinks.empty())
      fail(op, "sinks: ", given_sinks.size(), " logits given beside masks.scores.sinks (", masks.scores.sinks.size(),
           "); wanted the sinks in one of them");
    nn::AttentionMasks checked;  // the module's checks of softcap and the slopes (one per head of the module)
    nn::add_score_options(op, masks.scores, {true, queries.size(0), queries.size(1), keys.size(1), keys.size(1),
                                             m.module_heads}, checked);
    if (!sinks.empty() && static_cast<int64_t>(sinks.size()) != m.module_heads)
      fail(op, "sinks: ", sinks.size(), " logits for ", m.module_heads, " heads; wanted one per head of the module");
    for (size_t h = 0; h < sinks.size(); ++h)
      if (!std::isfinite(sinks[h])) fail(op, "sinks[", h, "]: ", sinks[h], "; wanted a finite logit per head");
    return 0;
  });
  // Every rank's block sizes, and one batch size for all.
  const std::vector<int64_t> batches = c.all_gather(queries.size(0));
  // The sinks and the documents, which every rank must pass alike: their
  // bytes hashed (FNV-1a), compared with rank 0's.
  uint64_t digest = 14695981039346656037ull;
  auto hash = [&digest](const void* data, size_t bytes) {
    for (size_t x = 0; x < bytes; ++x) digest = (digest ^ static_cast<const unsigned char*>(data)[x]) * 1099511628211ull;
  };
  hash(sinks.data(), sinks.size() * sizeof(float));
  hash(doc_offsets.data(), doc_offsets.size() * sizeof(int64_t));
  const std::vector<int64_t> digests = c.all_gather(static_cast<int64_t>(digest));
  const std::vector<int64_t> q_sizes = c.all_gather(queries.size(1));
  RingLayout layout;
  layout.q_sizes = q_sizes;
  layout.k_sizes = c.all_gather(keys.size(1));
  const int64_t B = queries.size(0), Qr = queries.size(1), Kr = keys.size(1);
  int64_t K = 0, Kmax = 0;
  for (int64_t n : layout.k_sizes) K += n, Kmax = std::max(Kmax, n);
  layout.K = K;
  agree(c, op, [&] {
    for (int o = 0; o < P; ++o)
      if (batches[static_cast<size_t>(o)] != queries.size(0))
        fail(op, "queries: batch size ", batches[static_cast<size_t>(o)], " on rank ", o, ", ", queries.size(0),
             " on rank ", r, "; every rank holds blocks of the same batch rows");
    if (K == 0) fail(op, "keys: no rank holds a key; a softmax over zero keys is undefined");
    for (int o = 1; o < P; ++o)
      if (digests[static_cast<size_t>(o)] != digests[0])
        fail(op, "sinks, doc_offsets: rank ", o, "'s differ from rank 0's; wanted the same on every rank");
    if (!kernels::runs_fused(AttentionKernel::Fused, Kmax))
      fail(op, "keys: a block of ", Kmax, " keys on one rank; wanted at most 2^24 per rank (the fused kernel's "
           "key axis): spread the sequence over more ranks");
    if (!doc_offsets.empty()) {
      int64_t Q = 0;
      for (int64_t n : q_sizes) Q += n;
      if (queries.size(0) != 1 || Q != K)
        fail(op, "doc_offsets: given for ", queries.size(0), " batch rows of ", Q, " queries and ", K,
             " keys; wanted one packed row of as many queries as keys");
      if (doc_offsets.size() < 2 || doc_offsets.front() != 0 || doc_offsets.back() != K ||
          !std::is_sorted(doc_offsets.begin(), doc_offsets.end()))
        fail(op, "doc_offsets: ", doc_offsets.size(), " offsets from ", doc_offsets.front(), " to ",
             doc_offsets.back(), "; wanted documents + 1 nondecreasing offsets from 0 to the sequence's ", K,
             " positions");
    }
    // What this rank allocates, before it does: a sequence whose share per
    // rank fits the limit runs, however long the whole.
    core::MemoryPlan plan(op);
    if (m.training)
      plan.add("inputs, kept for the backward", {B * (Qr * queries.size(2) + Kr * (keys.size(2) + values.size(2)))});
    plan.add("query projections", {B, Qr, Hd});
    plan.add("key/value blocks (the one computed on, the one arriving)", {2, 2, B, Kmax, Hd});
    plan.add("attention output before W_o", {B, Qr, Hd});
    plan.add("softmax statistics and value sums", {2 * B * H * Qr + B * Hd});
    plan.add("a block's attention output and statistics", {B * Qr * Hd + 2 * B * H * Qr});
    plan.add("per-query lengths over a block", {B * Qr});
    if (!doc_offsets.empty()) plan.add("a block's document mask", {Qr, Kmax}, 1);
    if (m.keep_weights) plan.add("a block's weights and every block's statistics", {B * H * Qr * (Kmax + 2 * P)});
    plan.add("output", {B, Qr, m.num_hiddens});
    if (m.keep_weights) plan.add("attention weights", {B, H, Qr, K});
    plan.check();
    *planned_bytes = plan.total();
    return 0;
  });
  return layout;
}

}  // namespace mha::dist
