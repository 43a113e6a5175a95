#include "mha/multihead.h"

#include <cmath>
#include <set>

#include "kernels/dispatch.h"
#include "mha/error.h"

namespace mha {

namespace {

const char* kForward = "MultiHeadAttention.forward";

void check_rank3(const Tensor& t, const char* name, const char* wanted) {
  if (t.dim() != 3) fail(kForward, name, ": shape ", shape_str(t.shape()), " is not ", wanted);
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
  init_head_layout();
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                   const ValidLens& valid_lens) {
  check_rank3(queries, "queries", "(B, Q, Dq)");
  check_rank3(keys, "keys", "(B, K, Dk)");
  check_rank3(values, "values", "(B, K, Dv)");
  const int64_t B = queries.size(0), Q = queries.size(1), K = keys.size(1);
  // D: the width of q, k, v and the heads' concatenation (num_hiddens
  // unless heads were pruned); the output is W_o's num_hiddens wide.
  const int64_t D = inner_dim(), H = num_heads_;
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
  // Check every lazy width before initialising any, so a failing call
  // changes nothing.
  auto check_width = [&](const LazyLinear& layer, const Tensor& x, const char* name) {
    if (x.size(2) <= 0) fail(kForward, name, ": shape ", shape_str(x.shape()), " has no features");
    if (layer.initialized() && x.size(2) != layer.in_features())
      fail(kForward, name, ": width ", x.size(2), " (shape ", shape_str(x.shape()),
           ") differs from the width ", layer.in_features(), " of the first call");
  };
  check_width(W_q_, queries, "queries");
  check_width(W_k_, keys, "keys");
  check_width(W_v_, values, "values");

  // Projections (B, L, width) -> (B, L, D); heads are strided views of these.
  Tensor q = W_q_.forward(queries, gen_, kForward);
  Tensor k = W_k_.forward(keys, gen_, kForward);
  Tensor v = W_v_.forward(values, gen_, kForward);
  if (!W_o_.initialized()) W_o_.initialize(D, gen_, kForward);

  // The kernel writes each head's output into its columns of `concat`, so
  // the seed's transpose_output costs nothing.
  Tensor concat({B, Q, D});
  weights_ = Tensor({B, H, Q, K});
  kernels::AttentionForward p;
  p.q = q.view().split_heads(H);
  p.k = k.view().split_heads(H);
  p.v = v.view().split_heads(H);
  p.out = concat.view().split_heads(H);
  p.weights = weights_.data();
  kernels::set_lengths(p, valid_lens);
  p.scale_divisor = std::sqrt(static_cast<float>(head_dim()));
  if (training_ && dropout_ > 0.0f) p.dropout = {dropout_, gen_.next()};
  last_dropout_p_ = p.dropout.p;
  last_dropout_key_ = p.dropout.key;
  kernels::attention_forward(kernel_, p);
  Tensor ungated = apply_head_gates(concat);  // head gates (src/nn/prune.cpp)
  Tensor out = W_o_.forward(concat, gen_, kForward);
  if (training_) {
    saved_ = {true, queries, keys, values, std::move(q), std::move(k), std::move(v),
              std::move(concat), valid_lens, std::move(ungated)};
  } else {
    saved_ = {};
  }
  return out;
}

StateDict MultiHeadAttention::state_dict() const {
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
