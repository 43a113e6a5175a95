// The fused attention kernel's dispatcher: picks the instruction set, counts
// each query's valid keys, and runs the chunks on OpenMP threads.
//
// Threads: OpenMP over (batch, head, query tile) chunks, dynamically
// scheduled (their cost varies with the valid lengths), more chunks than
// threads; in a packed batch the query tiles are cut at each document's
// first row and ordered document by document (fused_job.h QueryTile). Inside a chunk nothing calls the BLAS: the tile products are the
// register-blocked micro-kernels of kernel_impl.h, faster than BLAS calls on
// tiles this small. The projections around this kernel run on the same
// OpenMP threads (cpu/gemm/parallel_gemm.h), never beside OpenBLAS's own pool. The
// tiling depends only on the shapes and each chunk is computed by one thread
// from start to end, so the output is bitwise the same at any thread count.

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "cpu/fused/attention_amx.h"
#include "cpu/fused/attention_fused.h"
#include "cpu/fused/fused_job.h"
#include "cpu/isa/have_x86.h"
#include "mha/error.h"
#include "mha/threads.h"

namespace mha::kernels {

namespace {

using fused::IsaKernels;

cpu::IsaChoice g_isa(cpu::best_vector_isa());

const IsaKernels& kernels_for(FusedIsa isa) {
  return cpu::isa_entry<IsaKernels>(isa, fused::kScalarKernels, MHA_X86_ONLY(fused::kAvx2Kernels),
                                    MHA_X86_ONLY(fused::kAvx512Kernels));
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Runs body(chunk, scratch) for every chunk; each thread gets its own 64-byte
// aligned scratch of `scratch_floats` (first 64 bytes zeroed), allocated
// before the threads start.
template <class Body>
void run_chunks(int64_t chunks, size_t scratch_floats, double work, const Body& body) {
  if (chunks <= 0) return;
  const int threads = core::team_for(work, chunks);
  const size_t stride = (scratch_floats + 15) / 16 * 16;
  std::unique_ptr<float, FreeDeleter> pool(
      static_cast<float*>(std::aligned_alloc(64, stride * sizeof(float) * threads)));
  if (!pool) throw std::bad_alloc();
  float* base = pool.get();
  // Denormals are kept (no FTZ/DAZ), as the reference kernel and PyTorch
  // keep them: flushing them measured no faster here, on ordinary inputs
  // or on denormal keys and values (B8 L512 D768 h12 forward 174 vs 186
  // ms, B32 L65 D192 h3 6.5 vs 7.8 ms, one thread, AVX-512; the softmax's
  // exp2 never makes one), and it made the fused kernel alone disagree.
  core::parallel_for_with(
      chunks, threads,
      [&](int t) {
        float* scratch = base + stride * static_cast<size_t>(t);
        for (int i = 0; i < 16; ++i) scratch[i] = 0.0f;  // the kernel's slice tag: none yet
        return scratch;
      },
      [&](int64_t c, float* scratch) { body(c, scratch); });
}

// Keys and values for ForwardJob::kv_shared: a (b, kv head) slice whose rows
// already follow one another (a contiguous (B, H, K, d) input, as from
// mha.torch.scaled_dot_product_attention) is read in place by every thread.
// Packed per thread instead, two threads on one long slice each stream their
// own copy from beyond L2 (8 MiB each at K = 16384, d = 64). Measured on the
// 2-core AMD EPYC (1 MiB L2), B1 h4 d64 K = 16384, 2 threads, interleaved
// rounds: 805 ms in place against 891 ms packed per thread; equal within 1%
// at K = 1024..4096 and at 1 thread. A strided slice (the projections' rows,
// H*d or 3*H*d floats apart) is still packed per thread: one shared copy made
// before the threads start measured slower for the module (B1 L16384 D256
// h4, 2 threads: 862-893 ms against 818-824), its fresh 32 MiB faulted in on
// every call.
void share_keys_values(const AttentionForward& p, fused::ForwardJob& job) {
  if (p.k.stride[2] != p.d() || p.v.stride[2] != p.dv()) return;
  job.kv_shared = true;
  job.keys = p.k;
  job.values = p.v;
}

// Per batch row, the largest valid count of its queries: the key rows the
// kernel reads.
std::vector<int64_t> rows_read(const std::vector<int32_t>& n_valid, int64_t B, int64_t Q) {
  std::vector<int64_t> rows(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t q = 0; q < Q; ++q)
      rows[static_cast<size_t>(b)] = std::max<int64_t>(rows[static_cast<size_t>(b)], n_valid[static_cast<size_t>(b * Q + q)]);
  return rows;
}

int64_t max_of(const std::vector<int64_t>& v) {
  int64_t m = 0;
  for (int64_t x : v) m = std::max(m, x);
  return m;
}

// float(k) is exact below 2^24: the kernels compare key indices as floats.
static_assert(kFusedMaxKeys == int64_t{1} << 24);

// The per-query key ranges of the fused kernels (fused_job.h, n_valid and
// first): n[b*Q + q] = min(the length count, causal last key + 1, row b's
// last kept key + 1), (*first)[b*Q + q] = max(0, first_key), both 0 where
// the range is empty. `tile_mask[b]` says whether keys in the range still
// need the masking pass: an additive mask, a pair mask, or a key_keep row
// with a hole below its last kept key (a padding mask, kept keys first,
// needs none).
std::vector<int32_t> key_limits(LengthKind kind, const float* lens, const MaskOptions& m,
                                int64_t B, int64_t Q, int64_t K, std::vector<uint8_t>* tile_mask,
                                std::vector<int32_t>* first) {
  std::vector<int32_t> n = valid_key_counts(kind, lens, B, Q, K);
  first->assign(static_cast<size_t>(B * Q), 0);
  const bool any_other = m.key_bias || m.pair_keep || m.pair_bias;
  tile_mask->assign(static_cast<size_t>(B), any_other ? 1 : 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t last = K - 1;  // the last kept key of row b
    if (m.key_keep) {
      const uint8_t* keep = m.keep_row(b, K);
      last = -1;
      for (int64_t j = 0; j < K; ++j)
        if (keep[j]) last = j;
      for (int64_t j = 0; j < last; ++j)
        if (!keep[j]) (*tile_mask)[static_cast<size_t>(b)] = 1;
    }
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t limit = std::min(last, m.last_key(q, Q, K)) + 1;
      int32_t& x = n[static_cast<size_t>(b * Q + q)];
      x = static_cast<int32_t>(std::max<int64_t>(0, std::min<int64_t>(x, limit)));
      const int64_t f = std::max<int64_t>(0, m.first_key(q, Q, K));
      if (f >= x) x = 0;  // no key in range: the kernels see n = 0 (and first 0)
      else (*first)[static_cast<size_t>(b * Q + q)] = static_cast<int32_t>(f);
    }
  }
  return n;
}

fused::MaskJob mask_job(const MaskOptions& m, int64_t K, const std::vector<uint8_t>& tile_mask) {
  fused::MaskJob j;
  j.m = &m;
  j.tile_mask = tile_mask.data();
  j.neg_inf = m.fill == MaskFill::NegInf;
  j.natural = m.key_bias || m.pair_bias;
  j.unit = j.natural ? kLog2e : 1.0f;
  j.fill = j.neg_inf ? -__builtin_inff() : j.natural ? kMaskFill : kMaskFill2;
  j.zeros = m.fully_masked == FullyMaskedRows::Zeros;
  // As the reference: the uniform weight rounded once from double.
  j.policy = j.zeros ? 0.0f : static_cast<float>(1.0 / static_cast<double>(K));
  j.scores = m.softcap > 0.0f || m.alibi_slopes;
  j.score_unit = j.natural ? 1.0f : kLog2e;
  j.cap = m.softcap > 0.0f ? m.softcap * j.score_unit : 0.0f;
  j.slopes = m.alibi_slopes;
  j.sinks = m.sinks;
  return j;
}

// The query tiles of a call (fused_job.h QueryTiles): `table` holds them
// with documents (fused_query_tiles), and stays empty without.
fused::QueryTiles query_tiles(const MaskOptions& m, int64_t Q, int64_t size, std::vector<fused::QueryTile>* table) {
  *table = fused_query_tiles(m, Q, size);
  fused::QueryTiles t;
  t.table = table->empty() ? nullptr : table->data();
  t.count = m.doc_offsets ? static_cast<int64_t>(table->size()) : (Q + size - 1) / size;
  t.size = size;
  t.Q = Q;
  return t;
}

void run_weights(const fused::WeightsJob& base_job, int64_t Q, int64_t K, int64_t d) {
  const IsaKernels& isa = kernels_for(g_isa.get());
  fused::WeightsJob job = base_job;
  std::vector<fused::QueryTile> table;
  job.tiles = query_tiles(*job.mask.m, Q, isa.query_tile, &table);
  job.q_tiles = job.tiles.count;
  const int64_t chunks = job.n_rows * job.n_heads * job.q_tiles;
  const double work = static_cast<double>(job.n_rows * job.n_heads) * Q * K * (d + 8);
  run_chunks(chunks, isa.scratch_floats(d, 0, job.pack_rows), work,
             [&](int64_t c, float* s) { isa.weights_chunk(job, c, s); });
}

}  // namespace

// n_valid[b*Q + q] = #{k < K : float(k) < length(b, q)}. Since float(k) is
// exact for k < 2^24 (checked by the callers), that is ceil(length) capped
// to [0, K].
std::vector<int32_t> valid_key_counts(LengthKind kind, const float* lens, int64_t B, int64_t Q,
                                  int64_t K) {
  std::vector<int32_t> n(static_cast<size_t>(B * Q));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t q = 0; q < Q; ++q) {
      const float len = kind == LengthKind::None       ? __builtin_inff()
                        : kind == LengthKind::PerBatch ? lens[b]
                                                       : lens[b * Q + q];
      int64_t c = 0;
      if (len >= static_cast<float>(K)) c = K;
      else if (len > 0.0f) c = static_cast<int64_t>(std::ceil(len));
      n[static_cast<size_t>(b * Q + q)] = static_cast<int32_t>(c);
    }
  return n;
}

std::vector<fused::QueryTile> fused_query_tiles(const MaskOptions& m, int64_t Q, int64_t size) {
  std::vector<fused::QueryTile> tiles;
  if (!m.doc_offsets) return tiles;
  for (int64_t x = 0; x < m.documents; ++x) {
    const int64_t s = m.doc_offsets[x], e = std::min(m.doc_offsets[x + 1], Q);
    const int64_t first_tile = static_cast<int64_t>(tiles.size()), doc_tiles = (e - s + size - 1) / size;
    for (int64_t i0 = s; i0 < e; i0 += size)
      tiles.push_back({i0, std::min(size, e - i0), s, e, first_tile, doc_tiles});
  }
  return tiles;
}

FusedIsa fused_isa() { return g_isa.get(); }
FusedIsa fused_best_isa() { return cpu::best_vector_isa(); }
bool set_fused_isa(FusedIsa isa) { return g_isa.set(isa); }

const char* fused_isa_name(FusedIsa isa) { return kernels_for(isa).name; }

void attention_forward_fused(const AttentionForward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  // Callers pick another kernel for longer keys (cpu/dispatch.cpp).
  assert(K <= kFusedMaxKeys);
  const IsaKernels& isa = kernels_for(g_isa.get());
  std::vector<uint8_t> tile_mask;
  std::vector<int32_t> first;
  const std::vector<int32_t> n_valid = key_limits(p.length_kind, p.lens, p.masks, B, Q, K, &tile_mask, &first);

  // The weights need the statistics; keep them here if the caller did not ask.
  SoftmaxStats stats = p.stats;
  std::vector<float> own_stats;
  if (p.weights && stats.empty()) {
    own_stats.resize(static_cast<size_t>(2 * B * H * Q));
    stats = {own_stats.data(), own_stats.data() + B * H * Q};
  }

  fused::ForwardJob job;
  job.p = &p;
  job.n_valid = n_valid.data();
  job.first = first.data();
  job.row_max2 = stats.row_max2;
  job.row_sum = stats.row_sum;
  job.mask = mask_job(p.masks, K, tile_mask);
  job.c2 = (job.mask.natural ? 1.0f : kLog2e) / p.scale_divisor;  // scores in the job's units
  // Bfloat16 mode on AMX: the same job, its products on tiles
  // (attention_amx.h), where the AVX-512 kernel would run.
  const bool amx = static_cast<int>(g_isa.get()) >= static_cast<int>(FusedIsa::Avx512) && fused::amx_forward_supports(p) && fused::amx_forward_pays(p);
  const int64_t query_tile = amx ? fused::kAmxQueryTile : isa.query_tile;
  std::vector<fused::QueryTile> table;
  job.tiles = query_tiles(p.masks, Q, query_tile, &table);
  job.q_tiles = job.tiles.count;
  std::vector<int64_t> kv_rows = rows_read(n_valid, B, Q);
  if (p.read_all_keys)
    for (int64_t b = 0; b < B; ++b)
      if (p.read_all_keys[b]) kv_rows[static_cast<size_t>(b)] = K;
  job.kv_rows = kv_rows.data();
  job.pack_rows = max_of(kv_rows);
  job.read_all = p.read_all_keys;
  double work = 0;
  for (size_t x = 0; x < n_valid.size(); ++x) work += n_valid[x] - first[x];
  work = work * H * static_cast<double>(d + dv) + static_cast<double>(B * H * Q) * (d + dv);
  if (amx)
    run_chunks(B * H * job.q_tiles, fused::amx_forward_scratch_floats(d, dv, job.pack_rows), work,
               [&](int64_t c, float* s) { fused::amx_forward_chunk(job, c, s); });
  else {
    share_keys_values(p, job);
    run_chunks(B * H * job.q_tiles, isa.scratch_floats(d, dv, job.kv_shared ? 0 : job.pack_rows), work,
               [&](int64_t c, float* s) { isa.forward_chunk(job, c, s); });
  }

  if (p.weights) {
    std::vector<int64_t> rows(static_cast<size_t>(B)), heads(static_cast<size_t>(H));
    for (int64_t b = 0; b < B; ++b) rows[static_cast<size_t>(b)] = b;
    for (int64_t h = 0; h < H; ++h) heads[static_cast<size_t>(h)] = h;
    fused::WeightsJob w;
    w.q = p.q;
    w.k = p.k;
    w.n_valid = n_valid.data();
    w.first = first.data();
    w.row_max2 = stats.row_max2;
    w.row_sum = stats.row_sum;
    w.c2 = job.c2;
    w.batch_rows = rows.data();
    w.heads = heads.data();
    w.n_rows = B;
    w.n_heads = H;
    w.out = p.weights;
    w.kv_rows = kv_rows.data();
    w.pack_rows = job.pack_rows;
    w.mask = job.mask;
    run_weights(w, Q, K, d);
  }
}

void attention_weights_fused(const AttentionWeightsParams& p) {
  const AttentionForward& f = p.fwd;
  const int64_t B = f.B(), Q = f.Q(), K = f.K(), d = f.d();
  assert(K <= kFusedMaxKeys);
  std::vector<uint8_t> tile_mask;
  std::vector<int32_t> first;
  const std::vector<int32_t> n_valid = key_limits(f.length_kind, f.lens, f.masks, B, Q, K, &tile_mask, &first);
  fused::WeightsJob w;
  w.mask = mask_job(f.masks, K, tile_mask);
  w.q = f.q;
  w.k = f.k;
  w.n_valid = n_valid.data();
  w.first = first.data();
  w.row_max2 = f.stats.row_max2;
  w.row_sum = f.stats.row_sum;
  w.c2 = (w.mask.natural ? 1.0f : kLog2e) / f.scale_divisor;
  w.batch_rows = p.batch_rows.data();
  w.heads = p.heads.data();
  w.n_rows = static_cast<int64_t>(p.batch_rows.size());
  w.n_heads = static_cast<int64_t>(p.heads.size());
  w.out = p.out;
  if (w.n_rows == 0 || w.n_heads == 0) return;
  const std::vector<int64_t> kv_rows = rows_read(n_valid, B, Q);
  w.kv_rows = kv_rows.data();
  w.pack_rows = max_of(kv_rows);
  run_weights(w, Q, K, d);
}

void attention_backward_fused(const AttentionBackward& p) {
  const int64_t B = p.B(), H = p.H(), Q = p.Q(), K = p.K(), d = p.d(), dv = p.dv();
  assert(K <= kFusedMaxKeys && p.fwd.out.data && !p.fwd.stats.empty());
  const IsaKernels& isa = kernels_for(g_isa.get());
  std::vector<uint8_t> tile_mask;
  std::vector<int32_t> first;
  const std::vector<int32_t> n_valid =
      key_limits(p.fwd.length_kind, p.fwd.lens, p.fwd.masks, B, Q, K, &tile_mask, &first);
  const std::vector<int64_t> kv_rows = rows_read(n_valid, B, Q);
  fused::BackwardJob job;
  job.mask = mask_job(p.fwd.masks, K, tile_mask);
  job.p = &p;
  job.n_valid = n_valid.data();
  job.first = first.data();
  job.row_max2 = p.fwd.stats.row_max2;
  job.row_sum = p.fwd.stats.row_sum;
  job.c2 = (job.mask.natural ? 1.0f : kLog2e) / p.fwd.scale_divisor;
  job.kv_rows = kv_rows.data();
  job.pack_rows = max_of(kv_rows);
  std::vector<fused::QueryTile> table;
  job.tiles = query_tiles(p.fwd.masks, Q, isa.query_tile, &table);
  job.segments = p.fwd.masks.doc_offsets && job.mask.neg_inf && job.mask.policy == 0.0f;
  const int64_t parts = job.segments ? p.fwd.masks.documents : B;  // chunks per kv head
  std::vector<double> sink_part(p.fwd.masks.sinks ? static_cast<size_t>(parts * H) : 0);
  job.sink_part = sink_part.data();
  double work = 0;
  for (int64_t r : kv_rows) work += static_cast<double>(r);
  work *= static_cast<double>(H) * Q * (d + dv) * 2.5;
  run_chunks(parts * p.Hkv(), isa.backward_scratch_floats(Q, d, dv, job.pack_rows), work,
             [&](int64_t c, float* s) { isa.backward_chunk(job, c, s); });
  // The sinks' gradient: each (b, h)'s share, summed over b in order (the
  // same bits at any thread count).
  if (p.fwd.masks.sinks)
    for (int64_t h = 0; h < H; ++h) {
      double acc = 0.0;
      for (int64_t b = 0; b < parts; ++b) acc += sink_part[static_cast<size_t>(b * H + h)];
      p.grad_sinks[h] = static_cast<float>(acc);
    }
}

}  // namespace mha::kernels
