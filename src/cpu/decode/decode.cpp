// The decode kernel's dispatcher: validates, splits each (batch row, cache
// head)'s keys into chunks, runs the chunks on OpenMP threads, then merges
// each row's chunk partials in chunk order.
//
// Determinism: the chunk size depends on the shapes and lengths only
// (decode_chunk_keys), each chunk is computed by one thread from start to
// end into its own slot, and the merge visits the slots in a fixed order, so
// the output is bitwise the same at any thread count.
//
// Memory: besides the cache, the partials (at most about kDecodeMaxChunks +
// B*Hkv chunks, each group*Qn rows of dv + 2 floats) and one scratch per
// thread (group*Qn rows of d + kDecodeTile + dv + 2 floats), and the task
// list; nothing grows with the cache length once it passes
// kDecodeMaxChunks * kDecodeMinChunk keys summed over rows and cache heads
// (decode_working_bytes; tests/cpp/memory/decode_memory.cpp counts the
// allocations of a call against it).

#include <algorithm>
#include <atomic>
#include <memory>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "cpu/decode/decode.h"
#include "cpu/decode/decode_job.h"
#include "cpu/isa/have_x86.h"
#include "kernels/params.h"
#include "kernels/softmax_merge.h"
#include "kernels/validate.h"
#include "mha/error.h"
#include "mha/threads.h"

namespace mha::kernels {

namespace {

using decode::DecodeIsaKernels;
using decode::DecodeJob;
using decode::Task;

const DecodeIsaKernels& kernels_for(FusedIsa isa) {
  return cpu::isa_entry<DecodeIsaKernels>(isa, decode::kScalarDecode, MHA_X86_ONLY(decode::kAvx2Decode),
                                          MHA_X86_ONLY(decode::kAvx512Decode));
}

// A query row of (b, g) whose every score is -inf: zeros, or the mean of the
// row's K value rows (uniform weights 1/K), as the fused kernel's policy
// (kernels/masked_row.h). Rare (a padding mask that hides every key), so a
// plain loop.
void fully_masked_row(const DecodeParams& p, int64_t b, int64_t g, float* out) {
  const int64_t K = p.lengths[b], lo = p.held_from(b), dv = p.dv;  // a ring's keys: the held ones
  std::fill(out, out + dv, 0.0f);
  if (p.masks.fully_masked == FullyMaskedRows::Zeros) return;
  for (int64_t j = lo; j < K; ++j) {
    const int64_t at = b * p.v_stride_b + g * p.v_stride_h + p.slot(j) * p.v_stride_j;
    for (int64_t x = 0; x < dv; ++x)
      out[x] += p.dtype == CacheDtype::BF16 ? core::from_bf16(static_cast<const uint16_t*>(p.v)[at + x])
                                            : static_cast<const float*>(p.v)[at + x];
  }
  for (int64_t x = 0; x < dv; ++x) out[x] /= static_cast<float>(K - lo);
}

// out[r, :] for the R rows of (b, g) from its chunks' partials, in chunk
// order, by the one split-K merge (kernels/softmax_merge.h).
void merge(const DecodeJob& job, const Task& first, int64_t n_chunks, const float* partials) {
  const DecodeParams& p = *job.p;
  const int64_t G = p.group(), R = job.rows(), S = job.partial_stride(), dv = p.dv;
  for (int64_t r = 0; r < R; ++r) {
    float* out = p.out + first.b * p.out_stride_b + (first.g * G + r / p.Qn) * p.out_stride_h +
                 (r % p.Qn) * p.out_stride_i;
    std::fill(out, out + dv, 0.0f);  // no keys: the output is 0 (kernels/params.h, DecodeParams)
    float row_max = -INFINITY, row_sum = 0.0f;
    const SoftmaxMergeRow row{out, row_max, row_sum};
    for (int64_t c = 0; c < n_chunks; ++c) {
      const float* part = partials + (c * R + r) * S;
      merge_partial(row, part + 2, part[0], part[1], dv);
    }
    // The head's sink, once per row (not per chunk): a logit with no value.
    if (p.masks.sinks) merge_sink(row, p.masks.sinks[first.g * G + r / p.Qn] * kLog2e, dv);
    // Every key dropped out (-inf fill or bias): the fully-masked policy
    // (never with a sink, which is always in the denominator).
    if (!finish_row(row, dv) && n_chunks > 0) fully_masked_row(p, first.b, first.g, out);
  }
}

}  // namespace

int64_t decode_chunk_keys(const DecodeParams& p) {
  if (p.chunk_keys > 0) return p.chunk_keys;
  double key_rows = 0;  // keys summed over batch rows and cache heads
  for (int64_t b = 0; b < p.B; ++b) key_rows += static_cast<double>(p.lengths[b] - p.held_from(b)) * p.Hkv;
  const auto wanted = static_cast<int64_t>(std::ceil(key_rows / kDecodeMaxChunks));
  const int64_t c = std::max(kDecodeMinChunk, wanted);
  return (c + kDecodeTile - 1) / kDecodeTile * kDecodeTile;
}

namespace {

std::vector<Task> make_tasks(const DecodeParams& p, int64_t chunk_keys, std::vector<int64_t>* first) {
  std::vector<Task> tasks;
  int64_t n = 0;  // reserved exactly: no doubling growth (decode_working_bytes counts the tasks)
  // Chunk c covers positions [c, c + 1) * chunk_keys of the row's held ones
  // (a ring's start from held_from(b), wherever it falls).
  for (int64_t b = 0; b < p.B; ++b)
    n += ((p.lengths[b] + chunk_keys - 1) / chunk_keys - p.held_from(b) / chunk_keys) * p.Hkv;
  tasks.reserve(static_cast<size_t>(n));
  first->assign(static_cast<size_t>(p.B * p.Hkv + 1), 0);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t g = 0; g < p.Hkv; ++g) {
      (*first)[static_cast<size_t>(b * p.Hkv + g)] = static_cast<int64_t>(tasks.size());
      for (int64_t c = p.held_from(b) / chunk_keys; c * chunk_keys < p.lengths[b]; ++c) tasks.push_back({b, g, c});
    }
  first->back() = static_cast<int64_t>(tasks.size());
  return tasks;
}

}  // namespace

int64_t decode_working_bytes(const DecodeParams& p, int threads) {
  std::vector<int64_t> first;
  const std::vector<Task> tasks = make_tasks(p, decode_chunk_keys(p), &first);
  const int64_t R = p.group() * p.Qn;
  const int64_t partials = static_cast<int64_t>(tasks.size()) * R * (p.dv + 2);
  const int64_t scratch = static_cast<int64_t>(kernels_for(FusedIsa::Scalar).scratch_floats(p));
  // The task list, each (b, g)'s first task and its count of chunks left.
  const int64_t bookkeeping = static_cast<int64_t>(tasks.size() * sizeof(Task)) +
                              static_cast<int64_t>(first.size() * sizeof(int64_t)) +
                              p.B * p.Hkv * static_cast<int64_t>(sizeof(std::atomic<int64_t>));
  return 4 * (partials + scratch * threads) + bookkeeping;
}

void decode_attention(const DecodeParams& p) { decode_attention(p, fused_isa()); }

void decode_attention(const DecodeParams& p, FusedIsa isa) {
  check_decode_params(p, "decode_attention");
  if (!cpu::isa_supported(isa))
    fail("decode_attention", "isa: ", cpu::isa_name(isa), " is not supported by this CPU; wanted at most ",
         cpu::isa_name(cpu::detected_isa()));
  const DecodeIsaKernels& kern = kernels_for(isa);
  DecodeJob job;
  job.p = &p;
  job.chunk_keys = decode_chunk_keys(p);
  job.c2 = kLog2e / p.scale_divisor;
  std::vector<int64_t> first;
  const std::vector<Task> tasks = make_tasks(p, job.chunk_keys, &first);
  const int64_t R = job.rows(), S = job.partial_stride();
  std::vector<float> partials(static_cast<size_t>(tasks.size() * R * S));
  job.partials = partials.data();
  const size_t scratch_floats = kern.scratch_floats(p);

  double work = 0;
  for (int64_t b = 0; b < p.B; ++b) work += static_cast<double>(p.lengths[b] - p.held_from(b));
  work *= static_cast<double>(p.Hq * p.Qn * (p.d + p.dv));
  const auto n_tasks = static_cast<int64_t>(tasks.size());
  const int threads = core::team_for(work, n_tasks);
  const int64_t n_groups = p.B * p.Hkv;
  // Rows without keys are merged (zeroed) here; every other (b, g) is merged
  // by whichever thread finishes its last chunk, in chunk order all the
  // same, so no barrier separates the chunks from the merge (under load, a
  // thread waiting at one cost a scheduler tick).
  auto merge_group = [&](int64_t bg) {
    const int64_t t0 = first[static_cast<size_t>(bg)], t1 = first[static_cast<size_t>(bg + 1)];
    merge(job, {bg / p.Hkv, bg % p.Hkv, 0}, t1 - t0, partials.data() + t0 * R * S);
  };
  std::unique_ptr<std::atomic<int64_t>[]> left(new std::atomic<int64_t>[static_cast<size_t>(n_groups)]);
  for (int64_t bg = 0; bg < n_groups; ++bg) {
    left[static_cast<size_t>(bg)].store(first[static_cast<size_t>(bg + 1)] - first[static_cast<size_t>(bg)]);
    if (first[static_cast<size_t>(bg + 1)] == first[static_cast<size_t>(bg)]) merge_group(bg);
  }
  core::parallel_for_with(
      n_tasks, threads, [&](int) { return std::vector<float>(scratch_floats); },
      [&](int64_t t, std::vector<float>& scratch) {
        const Task& task = tasks[static_cast<size_t>(t)];
        kern.chunk(job, task, partials.data() + t * R * S, scratch.data());
        // acq_rel: the last finisher sees every other chunk's partials.
        const int64_t bg = task.b * p.Hkv + task.g;
        if (left[static_cast<size_t>(bg)].fetch_sub(1, std::memory_order_acq_rel) == 1) merge_group(bg);
      });
}

}  // namespace mha::kernels
