#include "mha/multihead.h"

#include <cmath>
#include <utility>
#include <set>

#include "core/memory.h"
#include "mha/error.h"
#include "nn/attention_engine.h"
#include "nn/call_masks.h"
#include "nn/module_calls.h"

namespace mha {

namespace {

const char* kForward = "MultiHeadAttention.forward";

// Every lazy width must agree with the layer's, so a failing call changes
// nothing. `layer_name` is the layer's name in the d2l chapter (W_q, ...).
void check_width(const LazyLinear& layer, const char* layer_name, const Tensor& x, const char* name) {
  if (x.size(2) <= 0) fail(kForward, name, ": shape ", shape_str(x.shape()), " has no features");
  if (layer.initialized() && x.size(2) != layer.in_features())
    fail(kForward, name, ": width ", x.size(2), " (shape ", shape_str(x.shape()), ") differs from ",
         layer_name, "'s input width ", layer.in_features(),
         ", fixed by the first call or by load_state_dict");
}

}  // namespace

void MultiHeadAttention::check_widths(const Params& p, const Tensor& queries, const Tensor& keys, const Tensor& values) {
  check_width(p.W_q, "W_q", queries, "queries");
  check_width(p.W_k, "W_k", keys, "keys");
  check_width(p.W_v, "W_v", values, "values");
}

MultiHeadAttention::MultiHeadAttention(int64_t num_hiddens, int64_t num_heads, float dropout,
                                       bool bias, uint64_t seed)
    : num_hiddens_(num_hiddens),
      bias_(bias),
      dropout_(dropout),
      dropout_keys_(seed),
      gen_(seed),
      params_(Params{LazyLinear(num_hiddens > 0 ? num_hiddens : 1, bias), LazyLinear(num_hiddens > 0 ? num_hiddens : 1, bias),
                     LazyLinear(num_hiddens > 0 ? num_hiddens : 1, bias), LazyLinear(num_hiddens > 0 ? num_hiddens : 1, bias),
                     {}, num_heads}) {
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
  params_.live().heads.init(num_heads, num_hiddens / num_heads);  // no call can run yet
}

void MultiHeadAttention::set_rotary(const Rotary& r) {
  check_rotary("MultiHeadAttention.set_rotary", r, head_dim());
  rotary_.store(r.enabled() ? std::make_shared<const Rotary>(r) : nullptr);
}

Rotary MultiHeadAttention::rotary() const {
  const std::shared_ptr<const Rotary> r = rotary_.load();
  return r ? *r : Rotary{};
}

void MultiHeadAttention::seed(uint64_t s) {
  params_.exclusive([&] { gen_.seed(s); });
  dropout_keys_.seed(s);
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

MultiHeadAttention::Pinned MultiHeadAttention::initialize_for(const char* op, const Tensor& queries, const Tensor& keys,
                                                               const Tensor& values) {
  // Another call may have initialised them meanwhile: the widths are checked
  // against whatever it chose. The draw order (W_q, W_k, W_v, W_o) is the
  // serial one.
  params_.update([&](Params& live) {
    check_widths(live, queries, keys, values);
    if (!live.W_q.initialized()) live.W_q.initialize(queries.size(2), gen_, op);
    if (!live.W_k.initialized()) live.W_k.initialize(keys.size(2), gen_, op);
    if (!live.W_v.initialized()) live.W_v.initialize(values.size(2), gen_, op);
    if (!live.W_o.initialized()) live.W_o.initialize(live.inner_dim(), gen_, op);
  });
  return params_.pin();
}

std::pair<Tensor, std::shared_ptr<nn::AttentionContext>> MultiHeadAttention::run(
    const Tensor& queries, const Tensor& keys, const Tensor& values, const ValidLens& valid_lens,
    const CallMasks& masks, bool publish) {
  // One snapshot of the settings for the whole call (see multihead.h).
  nn::CallSettings settings;
  settings.kernel = kernel_.get();
  settings.precision = precision_.get();
  settings.rotary = rotary();
  settings.keep_for_backward = training_.get();
  settings.keep_for_weights = true;  // attention_weights() of the last call
  const float dropout = dropout_.get();
  if (settings.keep_for_backward && dropout > 0.0f) {
    settings.dropout.p = dropout;
    settings.dropout_keys = &dropout_keys_;
  }
  // Everything this call allocates, checked before anything is (the first
  // call's parameters included): a size whose product overflows 64 bits or
  // exceeds mha::memory_limit() throws and changes nothing.
  Pinned p = params_.pin();
  nn::EngineCall call;
  auto prepare = [&](const Params& params) {  // the call with these parameters' heads
    call = nn::chapter_call(kForward, queries, keys, values, valid_lens, masks, params.num_heads,
                            params.heads.head_dim, num_hiddens_, settings);
    nn::EngineLayers layers{&params.W_q, &params.W_k, &params.W_v, &params.W_o};
    layers.head_gates = params.heads.gates.data();
    return layers;
  };
  {
    core::MemoryPlan plan(kForward);
    nn::add_call_memory(plan, call, prepare(*p), num_hiddens_);
    if (!p->initialized())
      plan.add("W_q, W_k, W_v, W_o", {p->inner_dim(), queries.size(2) + keys.size(2) + values.size(2) + p->inner_dim() + 4});
    plan.check();
  }
  if (!p->initialized()) {
    p.reset();  // the lazy initialisation waits for the calls that hold a pin
    p = initialize_for(kForward, queries, keys, values);
  }
  check_widths(*p, queries, keys, values);
  const nn::EngineLayers layers = prepare(*p);
  nn::draw_dropout_key(call, settings);
  // The buffers of a replaced state, taken for reuse.
  std::shared_ptr<std::vector<Tensor>> spare = publish ? spare_.exchange(nullptr) : nullptr;
  nn::EngineOutput r = nn::attention_forward(queries, keys, values, layers, std::move(call), spare.get());
  r.context->owner = id_.value();
  if (!publish) return {std::move(r.output), std::move(r.context)};
  // Publish this call; the context it replaces gives its buffers to the next
  // call unless someone still reads it (a copy of this module, or an
  // attention_weights() in progress on another thread).
  std::shared_ptr<nn::AttentionContext> old = state_.exchange(r.context);
  pruned_last_call_.set(false);
  if (old && old.use_count() == 1) spare_.store(std::make_shared<std::vector<Tensor>>(nn::release_buffers(*old)));
  return {std::move(r.output), std::move(r.context)};
}

Tensor MultiHeadAttention::attention_weights() const {
  const std::shared_ptr<nn::AttentionContext> st = state_.load();
  if (!st) return Tensor();
  return nn::checked_all_weights("MultiHeadAttention.attention_weights", *st);
}

int64_t MultiHeadAttention::last_batch_size() const {
  const std::shared_ptr<nn::AttentionContext> st = state_.load();
  return st ? st->B() : 0;
}

Tensor MultiHeadAttention::attention_weights(const std::vector<int64_t>& batch_rows,
                                             const std::vector<int64_t>& heads) const {
  static const char* op = "MultiHeadAttention.attention_weights";
  const std::shared_ptr<nn::AttentionContext> st = state_.load();
  if (!st && pruned_last_call_.get())
    fail(op, "prune_heads discarded the last call (it had the removed heads): call the module again");
  if (!st) fail(op, "no forward call yet: there are no weights to show");
  return nn::checked_weights_of(op, "the last call", *st, batch_rows, heads);
}

StateDict MultiHeadAttention::state_dict() const {
  const Pinned p = params_.pin();
  StateDict s;
  const std::pair<const char*, const LazyLinear*> layers[] = {
      {"W_q", &p->W_q}, {"W_k", &p->W_k}, {"W_v", &p->W_v}, {"W_o", &p->W_o}};
  for (const auto& [name, layer] : layers) {
    if (!layer->initialized()) continue;
    s[std::string(name) + ".weight"] = layer->weight();
    if (bias_) s[std::string(name) + ".bias"] = layer->bias();
  }
  return s;
}

void MultiHeadAttention::load_state_dict(const StateDict& state) {
  static const char* op = "MultiHeadAttention.load_state_dict";
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
  params_.update([&](Params& live) {  // running calls finish on the old values
    LazyLinear* layers[] = {&live.W_q, &live.W_k, &live.W_v, &live.W_o};
    // Validate everything first so that a failure leaves the module unchanged.
    // W_q, W_k, W_v: (inner, in); W_o: (num_hiddens, inner). inner is
    // num_hiddens unless heads were pruned.
    for (int i = 0; i < 4; ++i) {
      const std::string n = names[i];
      const Tensor& w = state.at(n + ".weight");
      const int64_t out = i == 3 ? num_hiddens_ : live.inner_dim();
      const int64_t in = i == 3 ? live.inner_dim() : (w.dim() == 2 ? w.size(1) : -1);
      if (w.dim() != 2 || w.size(0) != out || w.size(1) != in || in <= 0)
        fail(op, n, ".weight: shape ", shape_str(w.shape()), " is not (", out, ", ",
             i == 3 ? std::to_string(in) : std::string("in"), ")",
             live.heads.pruned() ? " (this module has pruned heads)" : "");
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
  });
}

}  // namespace mha
