#include "mha/multihead.h"

#include <cmath>
#include <mutex>
#include <utility>
#include <set>
#include <shared_mutex>

#include "core/finite.h"
#include "core/memory.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "nn/attention_state.h"
#include "nn/padding.h"
#include "nn/projections.h"

namespace mha {

namespace {

const char* kForward = "MultiHeadAttention.forward";

void check_rank3(const Tensor& t, const char* name, const char* wanted) {
  if (t.dim() != 3) fail(kForward, name, ": shape ", shape_str(t.shape()), " is not ", wanted);
}

// Every lazy width must agree with the layer's, so a failing call changes
// nothing. `layer_name` is the layer's name in the seed (W_q, ...).
void check_width(const LazyLinear& layer, const char* layer_name, const Tensor& x, const char* name) {
  if (x.size(2) <= 0) fail(kForward, name, ": shape ", shape_str(x.shape()), " has no features");
  if (layer.initialized() && x.size(2) != layer.in_features())
    fail(kForward, name, ": width ", x.size(2), " (shape ", shape_str(x.shape()), ") differs from ",
         layer_name, "'s input width ", layer.in_features(),
         ", fixed by the first call or by load_state_dict");
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t num_hiddens, int64_t num_heads, float dropout,
                                       bool bias, uint64_t seed)
    : num_hiddens_(num_hiddens),
      num_heads_(num_heads),
      dropout_(dropout),
      bias_(bias),
      gen_(seed),
      W_q_(num_hiddens > 0 ? num_hiddens : 1, bias),
      W_k_(num_hiddens > 0 ? num_hiddens : 1, bias),
      W_v_(num_hiddens > 0 ? num_hiddens : 1, bias),
      W_o_(num_hiddens > 0 ? num_hiddens : 1, bias) {
  static const char* op = "MultiHeadAttention";
  if (num_heads <= 0) fail(op, "num_heads: ", num_heads, " is not positive");
  if (num_hiddens <= 0) fail(op, "num_hiddens: ", num_hiddens, " is not positive");
  if (num_hiddens % num_heads != 0)
    fail(op, "num_hiddens: ", num_hiddens, " is not divisible by num_heads ", num_heads);
  if (!(dropout >= 0.0f && dropout <= 1.0f))
    fail(op, "dropout: ", dropout, " is not a probability in [0, 1]");
  // Per head: its number, gate and gate gradient (16 bytes); refused above
  // the memory limit before anything is allocated (num_heads = 2^31).
  core::MemoryPlan(op).add("head layout (num_heads numbers, gates and gate gradients)", {num_heads}, 16).check();
  init_head_layout();
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                   const ValidLens& valid_lens) {
  check_rank3(queries, "queries", "(B, Q, Dq)");
  check_rank3(keys, "keys", "(B, K, Dk)");
  check_rank3(values, "values", "(B, K, Dv)");
  const int64_t B = queries.size(0), Q = queries.size(1), K = keys.size(1);
  if (keys.size(0) != B)
    fail(kForward, "keys: batch size ", keys.size(0), " differs from queries' ", B,
         " (keys ", shape_str(keys.shape()), ", queries ", shape_str(queries.shape()), ")");
  if (values.size(0) != B)
    fail(kForward, "values: batch size ", values.size(0), " differs from queries' ", B,
         " (values ", shape_str(values.shape()), ", queries ", shape_str(queries.shape()), ")");
  if (values.size(1) != K)
    fail(kForward, "values: shape ", shape_str(values.shape()), " has ", values.size(1),
         " positions but keys ", shape_str(keys.shape()), " have ", K);
  if (K == 0) fail(kForward, "keys: shape ", shape_str(keys.shape()), " has no keys to attend to");
  valid_lens.check(kForward, B, Q);

  // One consistent snapshot of the mutable state for the whole call (the
  // dropout key is drawn later, after any lazy initialisation, in the
  // serial order); the buffers of replaced states are taken for reuse.
  AttentionKernel kernel;
  bool training;
  std::vector<Tensor> spare;
  {
    std::lock_guard state(state_mutex_);
    kernel = kernel_;
    training = training_;
    spare = std::move(spare_);
    spare_.clear();
  }
  // Whether the fused kernel will run (the dispatcher decides: past its key
  // limit the BLAS path runs instead).
  const bool fused = kernels::runs_fused(kernel, K);

  // Concurrency (see multihead.h): the parameters are read under a shared
  // lock; the first call initialises them under the exclusive lock, then
  // takes the shared one and checks the widths again, since load_state_dict
  // may have run in between.
  std::shared_lock params(params_mutex_);
  // D: the width of q, k, v and the heads' concatenation (num_hiddens
  // unless heads were pruned); the output is W_o's num_hiddens wide. Read
  // under the lock, since prune_heads changes them under the exclusive one.
  int64_t D = inner_dim(), H = num_heads_;
  // Everything this call allocates, checked before anything is: a size
  // whose product overflows 64 bits or exceeds mha::memory_limit() throws.
  // The fused kernel forms no (B, h, Q, K) weights, only two floats per
  // query (and per thread, one head's keys and values, packed).
  core::MemoryPlan plan(kForward);
  if (fused)
    plan.add("softmax statistics", {2, B, H, Q});
  else
    plan.add("attention weights", {B, H, Q, K});
  plan.add("projected queries", {B, Q, D}).add("projected keys", {B, K, D})
      .add("projected values", {B, K, D}).add("concatenated heads", {B, Q, D})
      .add("output", {B, Q, num_hiddens_});
  if (!W_o_.initialized())
    plan.add("W_q, W_k, W_v, W_o", {D, queries.size(2) + keys.size(2) + values.size(2) + D + 4});
  plan.check();
  if (!W_q_.initialized() || !W_k_.initialized() || !W_v_.initialized() || !W_o_.initialized()) {
    params.unlock();
    initialize_layers(queries, keys, values);
    params.lock();
    D = inner_dim(), H = num_heads_;  // as they are now, under the lock
  }
  check_width(W_q_, "W_q", queries, "queries");
  check_width(W_k_, "W_k", keys, "keys");
  check_width(W_v_, "W_v", values, "values");

  auto st = std::make_shared<nn::AttentionState>();
  st->B = B, st->H = H, st->Q = Q, st->K = K;
  st->lens = valid_lens;
  st->scale_divisor = std::sqrt(static_cast<float>(head_dim()));
  // Projections (B, L, width) -> (B, L, D), heads being strided views. The
  // fused kernels (forward and backward) never read keys past the lengths,
  // so their projections are skipped (nn/padding.h); the other kernels read
  // every row.
  nn::RowNeeds needs = fused ? nn::padding_row_needs(st->lens, B, Q, K) : nn::RowNeeds{};
  st->proj = nn::project_qkv(queries, keys, values, W_q_, W_k_, W_v_, needs, &spare);
  std::vector<uint8_t> read_all_keys;
  if (fused) {
    read_all_keys = nn::complete_nonfinite_values(st->proj, needs, keys, values, W_k_, W_v_);
    nn::complete_values_near_fill(st->proj, needs, values, W_v_, H, st->scale_divisor);
  }

  // The kernel writes each head's output into its columns of `concat`, so
  // the seed's transpose_output costs nothing.
  Tensor concat = nn::take_buffer({B, Q, D}, &spare);  // fully written by the kernel
  spare.clear();
  kernels::AttentionForward p;
  p.q = st->proj.q.split_heads(H);
  p.k = st->proj.k.split_heads(H);
  p.v = st->proj.v.split_heads(H);
  p.out = concat.view().split_heads(H);
  kernels::set_lengths(p, st->lens);
  p.scale_divisor = st->scale_divisor;
  {
    std::lock_guard state(state_mutex_);
    if (training && dropout_ > 0.0f) p.dropout = {dropout_, gen_.next()};
  }
  if (fused) {
    st->stats.resize(static_cast<size_t>(2 * B * H * Q));
    p.stats = {st->stats.data(), st->stats.data() + B * H * Q};
    p.read_all_keys = read_all_keys.empty() ? nullptr : read_all_keys.data();
  } else {
    st->weights = Tensor({B, H, Q, K});
    p.weights = st->weights.data();
  }
  if (kernels::attention_forward(kernel, p).empty()) {
    st->stats.clear();  // none saved: the weights are (runs_fused said so)
    st->have_all = true;
    if (!training) st->proj = {};  // the weights are all a later access needs
  }
  Tensor ungated = apply_head_gates(concat, training);  // head gates (src/nn/prune.cpp)
  Tensor out = W_o_.forward(concat, gen_, kForward);  // initialised: gen_ is not used
  // Finite inputs and parameters whose projections or scores overflow
  // float32 (inputs ~1e20) would give NaN: an error instead. NaN or infinite
  // inputs are computed through, as PyTorch does (docs/errors.md).
  if (!core::all_finite(out) && core::all_finite(queries) && core::all_finite(keys) && core::all_finite(values) &&
      finite_parameters())
    fail(kForward, "finite queries, keys, values and parameters give a projection or score that overflows float32 "
         "(largest input magnitude ", std::fmax(core::max_abs(queries), std::fmax(core::max_abs(keys), core::max_abs(values))),
         "); scale the inputs down");
  st->concat = std::move(concat);

  std::lock_guard state(state_mutex_);
  // Publish this call; the state it replaces gives its buffers to the next
  // call unless someone still reads it (a copy of this module, or an
  // attention_weights() in progress on another thread).
  std::shared_ptr<nn::AttentionState> old = std::exchange(state_, std::move(st));
  if (old && old.use_count() == 1) {
    spare_ = std::move(old->proj.buffers);
    spare_.push_back(std::move(old->concat));
  }
  // What backward() needs from this call (the last call's, in training mode).
  last_dropout_p_ = p.dropout.p;
  last_dropout_key_ = p.dropout.key;
  if (training) {
    saved_ = {true, queries, keys, values, std::move(ungated)};
  } else {
    saved_ = {};
  }
  return out;
}

bool MultiHeadAttention::finite_parameters() const {
  for (const LazyLinear* l : {&W_q_, &W_k_, &W_v_, &W_o_})
    if (!core::all_finite(l->weight()) || !core::all_finite(l->bias())) return false;
  return true;
}

Tensor MultiHeadAttention::attention_weights() const {
  std::shared_ptr<nn::AttentionState> st;
  {
    std::lock_guard state(state_mutex_);
    st = state_;
  }
  if (!st) return Tensor();
  // The weights, and the copy returned, are this call's allocation.
  core::MemoryPlan plan("MultiHeadAttention.attention_weights");
  plan.add("attention weights", {st->B, st->H, st->Q, st->K}).check();
  return nn::all_weights(*st);
}

int64_t MultiHeadAttention::last_batch_size() const {
  std::lock_guard state(state_mutex_);
  return state_ ? state_->B : 0;
}

Tensor MultiHeadAttention::attention_weights(const std::vector<int64_t>& batch_rows,
                                             const std::vector<int64_t>& heads) const {
  static const char* op = "MultiHeadAttention.attention_weights";
  std::shared_ptr<nn::AttentionState> st;
  {
    std::lock_guard state(state_mutex_);
    st = state_;
  }
  if (!st) fail(op, "no forward call yet: there are no weights to show");
  for (size_t i = 0; i < batch_rows.size(); ++i)
    if (batch_rows[i] < 0 || batch_rows[i] >= st->B)
      fail(op, "batch_rows: entry ", i, " is ", batch_rows[i], "; the last call had rows 0..",
           st->B - 1, " (batch size ", st->B, ")");
  for (size_t i = 0; i < heads.size(); ++i)
    if (heads[i] < 0 || heads[i] >= st->H)
      fail(op, "heads: entry ", i, " is ", heads[i], "; wanted 0 <= head < ", st->H);
  core::MemoryPlan plan(op);
  plan.add("attention weights", {static_cast<int64_t>(batch_rows.size()),
                                 static_cast<int64_t>(heads.size()), st->Q, st->K})
      .check();
  return nn::weights_of(*st, batch_rows, heads);
}

void MultiHeadAttention::initialize_layers(const Tensor& queries, const Tensor& keys,
                                           const Tensor& values) {
  std::unique_lock params(params_mutex_);
  std::lock_guard state(state_mutex_);  // gen_
  // Another call may have done it meanwhile; the widths are checked against
  // whatever it chose. The draw order (W_q, W_k, W_v, W_o) is the serial one.
  check_width(W_q_, "W_q", queries, "queries");
  check_width(W_k_, "W_k", keys, "keys");
  check_width(W_v_, "W_v", values, "values");
  W_q_.initialize(queries.size(2), gen_, kForward);
  W_k_.initialize(keys.size(2), gen_, kForward);
  W_v_.initialize(values.size(2), gen_, kForward);
  W_o_.initialize(inner_dim(), gen_, kForward);
}

StateDict MultiHeadAttention::state_dict() const {
  std::shared_lock params(params_mutex_);
  StateDict s;
  const std::pair<const char*, const LazyLinear*> layers[] = {
      {"W_q", &W_q_}, {"W_k", &W_k_}, {"W_v", &W_v_}, {"W_o", &W_o_}};
  for (const auto& [name, layer] : layers) {
    if (!layer->initialized()) continue;
    s[std::string(name) + ".weight"] = layer->weight();
    if (bias_) s[std::string(name) + ".bias"] = layer->bias();
  }
  return s;
}

void MultiHeadAttention::load_state_dict(const StateDict& state) {
  static const char* op = "MultiHeadAttention.load_state_dict";
  std::unique_lock params(params_mutex_);  // waits for running calls
  const char* names[] = {"W_q", "W_k", "W_v", "W_o"};
  std::set<std::string> expected;
  for (const char* n : names) {
    expected.insert(std::string(n) + ".weight");
    if (bias_) expected.insert(std::string(n) + ".bias");
  }
  for (const auto& [name, t] : state)
    if (!expected.count(name))
      fail(op, "unexpected parameter '", name, "'",
           bias_ ? "" : " (this module was built with bias=false)");
  for (const auto& name : expected)
    if (!state.count(name)) fail(op, "missing parameter '", name, "'");
  LazyLinear* layers[] = {&W_q_, &W_k_, &W_v_, &W_o_};
  // Validate everything first so that a failure leaves the module unchanged.
  // W_q, W_k, W_v: (inner, in); W_o: (num_hiddens, inner). inner is
  // num_hiddens unless heads were pruned.
  for (int i = 0; i < 4; ++i) {
    const std::string n = names[i];
    const Tensor& w = state.at(n + ".weight");
    const int64_t out = i == 3 ? num_hiddens_ : inner_dim();
    const int64_t in = i == 3 ? inner_dim() : (w.dim() == 2 ? w.size(1) : -1);
    if (w.dim() != 2 || w.size(0) != out || w.size(1) != in || in <= 0)
      fail(op, n, ".weight: shape ", shape_str(w.shape()), " is not (", out, ", ",
           i == 3 ? std::to_string(in) : std::string("in"), ")",
           num_heads_ < original_num_heads_ ? " (this module has pruned heads)" : "");
    if (layers[i]->initialized() && layers[i]->in_features() != in)
      fail(op, n, ".weight: shape ", shape_str(w.shape()), " differs from the initialised ",
           shape_str({out, layers[i]->in_features()}));
    if (bias_) {
      const Tensor& b = state.at(n + ".bias");
      if (b.dim() != 1 || b.size(0) != out)
        fail(op, n, ".bias: shape ", shape_str(b.shape()), " is not ", shape_str({out}));
    }
  }
  for (int i = 0; i < 4; ++i) {
    const std::string n = names[i];
    layers[i]->set_weight(state.at(n + ".weight"), op);
    if (bias_) layers[i]->set_bias(state.at(n + ".bias"), op);
  }
}

}  // namespace mha
