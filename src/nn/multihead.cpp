#include "mha/multihead.h"

#include <cmath>
#include <mutex>
#include <utility>
#include <set>
#include <shared_mutex>

#include "core/memory.h"
#include "mha/error.h"
#include "nn/attention_engine.h"
#include "nn/call_masks.h"

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
  heads_.init(num_heads, num_hiddens / num_heads);
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                   const ValidLens& valid_lens) {
  return forward(queries, keys, values, valid_lens, CallMasks{});
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                   const ValidLens& valid_lens, const CallMasks& masks) {
  return run(queries, keys, values, valid_lens, masks, true).first;
}

MultiHeadAttention::ForwardResult MultiHeadAttention::forward_with_context(const Tensor& queries, const Tensor& keys,
                                                                           const Tensor& values,
                                                                           const ValidLens& valid_lens,
                                                                           const CallMasks& masks) {
  auto [out, ctx] = run(queries, keys, values, valid_lens, masks, false);
  return {std::move(out), ForwardContext(std::move(ctx))};
}

std::pair<Tensor, std::shared_ptr<nn::AttentionContext>> MultiHeadAttention::run(
    const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens,
    const CallMasks& masks, bool publish) {
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
    if (publish) {
      spare = std::move(spare_);
      spare_.clear();
    }
  }
  // Concurrency (see multihead.h): the parameters are read under a shared
  // lock; the first call initialises them under the exclusive lock, then
  // takes the shared one and checks the widths again, since load_state_dict
  // may have run in between.
  std::shared_lock params(params_mutex_);
  // D: the width of q, k, v and the heads' concatenation (num_hiddens
  // unless heads were pruned); the output is W_o's num_hiddens wide. Read
  // under the lock, since prune_heads changes them under the exclusive one.
  int64_t D = inner_dim(), H = num_heads_;
  // The call as the engine runs it (nn/attention_engine.h): batch-major
  // rows, the chapter's lengths and any masks beside them.
  nn::EngineCall call;
  call.op = kForward;
  call.inputs = "queries, keys, values";
  call.layout = {false, B};
  call.Q = Q, call.K = K;
  call.H = H, call.Hkv = H, call.d = head_dim();
  call.out_shape = {B, Q, num_hiddens_};
  call.lens = valid_lens;
  call.masks = nn::build_masks(kForward, masks.key_padding_mask, masks.attn_mask, masks.causal,
                               masks.fully_masked_rows, {true, B, Q, K, K, H});
  call.kernel = kernel;
  call.keep_for_backward = training;
  call.keep_for_weights = true;  // attention_weights() of the last call
  // Everything this call allocates, checked before anything is: a size
  // whose product overflows 64 bits or exceeds mha::memory_limit() throws.
  core::MemoryPlan plan(kForward);
  nn::add_call_memory(plan, call, {&W_q_, &W_k_, &W_v_, &W_o_}, num_hiddens_);
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

  nn::EngineLayers layers{&W_q_, &W_k_, &W_v_, &W_o_};
  std::vector<float> gates = heads_.gates;  // read under the lock, like the parameters
  layers.head_gates = gates.data();
  call.H = H, call.Hkv = H, call.d = head_dim();
  {
    std::lock_guard state(state_mutex_);
    if (training && dropout_ > 0.0f) call.dropout = {dropout_, gen_.next()};
  }
  nn::EngineOutput r = nn::attention_forward(queries, keys, values, layers, std::move(call), &spare);
  spare.clear();
  r.context->owner = id_.value();
  if (!publish) return {std::move(r.output), std::move(r.context)};

  std::lock_guard state(state_mutex_);
  // Publish this call; the context it replaces gives its buffers to the next
  // call unless someone still reads it (a copy of this module, or an
  // attention_weights() in progress on another thread).
  std::shared_ptr<nn::AttentionContext> old = std::exchange(state_, r.context);
  if (old && old.use_count() == 1) {
    spare_ = std::move(old->proj.buffers);
    spare_.push_back(std::move(old->concat));
  }
  return {std::move(r.output), std::move(r.context)};
}

Tensor MultiHeadAttention::attention_weights() const {
  std::shared_ptr<nn::AttentionContext> st;
  {
    std::lock_guard state(state_mutex_);
    st = state_;
  }
  if (!st) return Tensor();
  return nn::checked_all_weights("MultiHeadAttention.attention_weights", *st);
}

int64_t MultiHeadAttention::last_batch_size() const {
  std::lock_guard state(state_mutex_);
  return state_ ? state_->B() : 0;
}

Tensor MultiHeadAttention::attention_weights(const std::vector<int64_t>& batch_rows,
                                             const std::vector<int64_t>& heads) const {
  static const char* op = "MultiHeadAttention.attention_weights";
  std::shared_ptr<nn::AttentionContext> st;
  {
    std::lock_guard state(state_mutex_);
    st = state_;
  }
  if (!st) fail(op, "no forward call yet: there are no weights to show");
  return nn::checked_weights_of(op, "the last call", *st, batch_rows, heads);
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
           heads_.pruned() ? " (this module has pruned heads)" : "");
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
