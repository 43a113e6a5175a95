// `mha run --parallel`: the evaluation of `mha run` over MPI ranks (see run_parallel.h).
#include "run_parallel.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "mha/atomic_file.h"
#include "mha/dist.h"
#include "mha/mha.h"
#include "model_io.h"
#include "outputs.h"

namespace mha::tools {

namespace {

const char* kOp = "run";

// Where one rank's piece [B, hn, qn, X] lies in the whole [B, H, Q, X].
struct Piece {
  int64_t h0 = 0, hn = 0, q0 = 0, qn = 0;
  bool sent = true;  // false: another rank sends the same piece
};

// Rank 0 assembles `whole` (laid out as [B, H, Q, X]) from every rank's
// piece; the other ranks send theirs. `tag` tells the gathers apart.
void gather(const dist::Communicator& c, const Tensor& mine, const std::vector<Piece>& pieces, Tensor& whole,
            int64_t B, int64_t H, int64_t Q, int64_t X, int tag) {
  const Piece& own = pieces[static_cast<size_t>(c.rank())];
  if (c.rank() != 0) {
    if (own.sent && own.hn * own.qn > 0) c.send(mine.data(), mine.numel(), 0, tag);
    return;
  }
  for (int r = 0; r < c.size(); ++r) {
    const Piece& p = pieces[static_cast<size_t>(r)];
    if (!p.sent || p.hn * p.qn == 0) continue;
    Tensor part = r == 0 ? mine : Tensor({B, p.hn, p.qn, X});
    if (r != 0) c.recv(part.data(), part.numel(), r, tag);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < p.hn; ++h)
        std::copy(part.data() + ((b * p.hn + h) * p.qn) * X, part.data() + ((b * p.hn + h) * p.qn + p.qn) * X,
                  whole.data() + ((b * H + p.h0 + h) * Q + p.q0) * X);
  }
}

// Rows [begin, begin + n) of axis 1 of x:[B, L, D] -> [B, n, D].
Tensor rows(const Tensor& x, int64_t begin, int64_t n) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  Tensor out({B, n, D});
  for (int64_t b = 0; b < B; ++b)
    std::copy(x.data() + (b * L + begin) * D, x.data() + (b * L + begin + n) * D, out.data() + b * n * D);
  return out;
}

// The lengths of queries [begin, begin + n): per-query lengths sliced, others as they are.
ValidLens query_lens(const ValidLens& lens, int64_t B, int64_t Q, int64_t begin, int64_t n) {
  if (lens.kind() != ValidLens::Kind::PerQuery) return lens;
  std::vector<float> mine;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) mine.push_back(lens.values()[static_cast<size_t>(b * Q + begin + i)]);
  return ValidLens::per_query(B, n, mine);
}

// G for a grid of P ranks: the largest divisor of P with G^2 <= P and G <= num_heads.
int default_head_groups(int P, int64_t num_heads) {
  int best = 1;
  for (int g = 1; g * g <= P; ++g)
    if (P % g == 0 && g <= num_heads) best = g;
  return best;
}

}  // namespace

void run_parallel(const ParallelRun& run) {
  dist::Environment mpi;  // MPI while the command runs (P = 1 without mpirun)
  const dist::Communicator c = dist::Communicator::world();
  const int P = c.size(), rank = c.rank();
  // Every rank checks and reads the same files, so every rank fails alike.
  io::check_output_path(run.out);
  check_outputs(kOp, {{"--out", run.out}}, {".safetensors"}, {{"--weights", run.weights}, {"--inputs", run.inputs}});
  MultiHeadAttention attention = load_attention(run.weights, run.heads, kOp);
  if (attention.num_heads() < attention.original_num_heads())
    fail(kOp, "--parallel: weights '", run.weights, "' hold a pruned module (", attention.num_heads(), " of ",
         attention.original_num_heads(), " heads kept); --parallel takes an unpruned module's weights");
  const AttentionInputs in = load_inputs(run.inputs, kOp);
  const int64_t B = in.queries.size(0), Q = in.queries.size(1), K = in.keys.size(1);
  const int64_t D = attention.num_hiddens(), H = attention.num_heads();
  const StateDict state = attention.state_dict();
  in.valid_lens.check(kOp, B, Q);

  std::vector<Piece> out_pieces(static_cast<size_t>(P)), weight_pieces(static_cast<size_t>(P));
  Tensor output, weights;
  if (run.mode == Parallel::Heads) {
    dist::HeadParallelAttention heads(c, D, H, state);
    heads.eval();
    heads.set_precision(run.precision);
    output = heads.forward(in.queries, in.keys, in.values, in.valid_lens, run.masks);
    if (heads.shard()) weights = heads.shard()->attention_weights();
    for (int r = 0; r < P; ++r) {
      const std::vector<int64_t> hs = dist::HeadParallelAttention::heads_of(H, P, r);
      out_pieces[static_cast<size_t>(r)] = {0, 1, 0, Q, r == 0};
      weight_pieces[static_cast<size_t>(r)] = {hs.empty() ? 0 : hs.front(), static_cast<int64_t>(hs.size()), 0, Q};
    }
  } else if (run.mode == Parallel::Sequence) {
    dist::RingAttention ring(c, D, H, state);
    ring.eval();
    ring.set_precision(run.precision);
    ring.keep_attention_weights(true);
    const auto [q0, qn] = dist::RingAttention::block_of(Q, P, rank);
    const auto [k0, kn] = dist::RingAttention::block_of(K, P, rank);
    output = ring.forward(rows(in.queries, q0, qn), rows(in.keys, k0, kn), rows(in.values, k0, kn),
                          query_lens(in.valid_lens, B, Q, q0, qn), run.masks);
    weights = ring.attention_weights();
    for (int r = 0; r < P; ++r) {
      const auto [b0, bn] = dist::RingAttention::block_of(Q, P, r);
      out_pieces[static_cast<size_t>(r)] = {0, 1, b0, bn};
      weight_pieces[static_cast<size_t>(r)] = {0, H, b0, bn};
    }
  } else {
    const int G = run.head_groups > 0 ? run.head_groups : default_head_groups(P, H);
    dist::GridAttention grid(c, G, D, H, state);
    grid.eval();
    grid.set_precision(run.precision);
    grid.keep_attention_weights(true);
    const auto [q0, qn] = grid.query_block(Q);
    const auto [k0, kn] = grid.key_block(K);
    output = grid.forward(rows(in.queries, q0, qn), rows(in.keys, k0, kn), rows(in.values, k0, kn),
                          query_lens(in.valid_lens, B, Q, q0, qn), run.masks);
    weights = grid.attention_weights();
    const int S = P / G;
    for (int r = 0; r < P; ++r) {
      const auto [b0, bn] = dist::RingAttention::block_of(Q, S, r % S);
      const std::vector<int64_t> hs = dist::HeadParallelAttention::heads_of(H, G, r / S);
      out_pieces[static_cast<size_t>(r)] = {0, 1, b0, bn, r / S == 0};  // group 0's copy of block r % S
      weight_pieces[static_cast<size_t>(r)] = {hs.front(), static_cast<int64_t>(hs.size()), b0, bn};
    }
  }
  // Rank 0 holds the whole output and weights (as one process does): if it
  // cannot (--memory-limit), every rank stops before sending it anything, and
  // each, rank 0 included, gives the same message with rank 0's reason: a
  // rank that exits first makes mpiexec stop the others, so any one of them
  // may be the only one printed.
  Tensor whole_out, whole_weights;
  bool failed = false;
  std::string why;
  if (rank == 0) {
    try {
      whole_out = Tensor({B, Q, D});
      whole_weights = Tensor({B, H, Q, K});
    } catch (const std::exception& e) {
      failed = true;
      why = e.what();
    } catch (...) {
      failed = true;
      why = "an error that is not a std::exception";
    }
  }
  if (c.all_gather(failed ? 1 : 0)[0]) {
    why = c.broadcast(why, 0);
    fail(kOp, "--parallel: rank 0 cannot hold the whole output and attention weights (" + why +
                  "); every rank stops");
  }
  gather(c, output, out_pieces, whole_out, B, 1, Q, D, 1);
  gather(c, weights, weight_pieces, whole_weights, B, H, Q, K, 2);
  if (rank != 0) return;
  save_safetensors(run.out, {{"output", whole_out}, {"attention_weights", whole_weights}},
                   {{"num_heads", std::to_string(H)}});
  std::printf("wrote %s: output %s, attention_weights %s (%d ranks, --parallel %s)\n", run.out.c_str(),
              shape_str(whole_out.shape()).c_str(), shape_str(whole_weights.shape()).c_str(), P,
              run.mode == Parallel::Heads ? "heads" : run.mode == Parallel::Sequence ? "sequence" : "grid");
}

}  // namespace mha::tools
