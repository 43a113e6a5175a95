// Triggers of docs/errors.md's rows for masks, TorchMultiheadAttention and
// the modules' backward and gradients (see error_catalogue.h).
#include <cmath>

#include "error_catalogue.h"
#include "test_util.h"

namespace mha::test {

namespace {

// nn.MultiheadAttention(4, 2, bias=True)'s state dict, with `change` applied:
// an entry with an empty tensor is removed.
StateDict torch_state(const StateDict& change = {}) {
  StateDict s = {{"in_proj_weight", ones({12, 4})}, {"in_proj_bias", ones({12})},
                 {"out_proj.weight", ones({4, 4})}, {"out_proj.bias", ones({4})}};
  for (const auto& [name, t] : change) {
    if (t.empty()) s.erase(name);
    else s[name] = t;
  }
  return s;
}

// The same with separate q/k/v_proj_weight (kdim 5, vdim 3) instead of in_proj_weight.
StateDict separate_state(const StateDict& change = {}) {
  StateDict s = torch_state({{"in_proj_weight", Tensor()}, {"q_proj_weight", ones({4, 4})},
                             {"k_proj_weight", ones({4, 5})}, {"v_proj_weight", ones({4, 3})}});
  for (const auto& [name, t] : change) {
    if (t.empty()) s.erase(name);
    else s[name] = t;
  }
  return s;
}

TorchMultiheadAttention torch_mha(const StateDict& s = torch_state(), int64_t heads = 2,
                                  const TorchMhaOptions& o = test::batch_first_options()) {
  return TorchMultiheadAttention::from_state_dict(s, heads, o);
}

// A batch-first call: query (2, 3, 4), key and value (2, 6, 4) unless given.
void torch_call(const Tensor& q, const Tensor& k, const Tensor& v, const TorchMhaCall& call = {}) {
  torch_mha().forward(q, k, v, call);
}
const Tensor Q = ones({2, 3, 4}), KV = ones({2, 6, 4});

}  // namespace

Triggers torch_triggers() {
  return {
      // masks
      {"mask.keep_count", [] { Mask::keep({2, 2}, {1, 0, 1}); }},
      {"torch_mha.set_dropout_cpp", [] { torch_mha().set_dropout(2.0f); }},
      {"mask.additive", [] { Mask::additive(Tensor({2}, std::vector<float>{0.0f, NAN})); }},
      {"mask.to_torch", [] { mask_to_torch_mha(Mask::additive(ones({2, 6}))); }},
      {"mask.to_sdpa", [] { mask_to_sdpa(Mask()); }},
      // TorchMultiheadAttention.from_state_dict
      {"tmha.unexpected", [] { torch_mha(torch_state({{"in_proj.weight", ones({12, 4})}})); }},
      {"tmha.missing_out", [] { torch_mha(torch_state({{"out_proj.weight", Tensor()}})); }},
      {"tmha.out_shape", [] { torch_mha(torch_state({{"out_proj.weight", ones({4, 3})}})); }},
      {"tmha.num_heads", [] { torch_mha(torch_state(), 0); }},
      {"tmha.divide", [] { torch_mha(torch_state(), 3); }},
      {"tmha.kv_heads", [] { torch_mha(torch_state(), 2, {.num_kv_heads = 3}); }},
      {"tmha.dropout", [] { torch_mha(torch_state(), 2, {.dropout = 1.5f}); }},
      {"tmha.both", [] { torch_mha(torch_state({{"q_proj_weight", ones({4, 4})}})); }},
      {"tmha.no_in_proj", [] { torch_mha(torch_state({{"in_proj_weight", Tensor()}})); }},
      {"tmha.missing_proj", [] { torch_mha(separate_state({{"v_proj_weight", Tensor()}})); }},
      {"tmha.in_proj_shape", [] { torch_mha(torch_state({{"in_proj_weight", ones({12, 5})}})); }},
      {"tmha.in_proj_shape_kv", [] { torch_mha(torch_state(), 2, {.num_kv_heads = 1}); }},
      {"tmha.q_proj_shape", [] { torch_mha(separate_state({{"q_proj_weight", ones({4, 5})}})); }},
      {"tmha.k_proj_shape", [] { torch_mha(separate_state({{"k_proj_weight", ones({3, 5})}})); }},
      {"tmha.v_proj_shape", [] { torch_mha(separate_state({{"v_proj_weight", ones({4})}})); }},
      {"tmha.kdim", [] { torch_mha(separate_state(), 2, {.kdim = 4}); }},
      {"tmha.vdim", [] { torch_mha(separate_state(), 2, {.vdim = 4}); }},
      {"tmha.bias_pair", [] { torch_mha(torch_state({{"out_proj.bias", Tensor()}})); }},
      {"tmha.bias_shape", [] { torch_mha(torch_state({{"out_proj.bias", ones({3})}})); }},
      {"tmha.bias_kv_pair", [] { torch_mha(torch_state({{"bias_k", ones({1, 1, 4})}})); }},
      // TorchMultiheadAttention.forward
      {"tmha.query_rank", [] { torch_call(ones({4}), ones({4}), ones({4})); }},
      {"tmha.rank", [] { torch_call(Q, ones({6, 4}), KV); }},
      {"tmha.query_width", [] { torch_call(ones({2, 3, 5}), KV, KV); }},
      {"tmha.key_width", [] { torch_call(Q, ones({2, 6, 5}), KV); }},
      {"tmha.value_width", [] { torch_call(Q, KV, ones({2, 6, 3})); }},
      {"tmha.batch", [] { torch_call(Q, ones({1, 6, 4}), ones({1, 6, 4})); }},
      {"tmha.positions", [] { torch_call(Q, KV, ones({2, 5, 4})); }},
      {"tmha.no_keys", [] { torch_call(Q, ones({2, 0, 4}), ones({2, 0, 4})); }},
      {"tmha.attn_mask_rank", [] {
         TorchMhaCall call;
         call.attn_mask = Mask::additive(ones({6}));
         torch_call(Q, KV, KV, call);
       }},
      {"tmha.mask_sum", [] {
         TorchMhaCall call;
         call.key_padding_mask = Mask::additive(Tensor({2, 6}, 3e38f));
         call.attn_mask = Mask::additive(Tensor({3, 6}, 3e38f));
         torch_call(Q, KV, KV, call);
       }},
      {"tmha.window", [] {
         TorchMhaCall call;
         call.window = {-2, 0};
         torch_call(Q, KV, KV, call);
       }},
      {"scores.softcap", [] {
         TorchMhaCall call;
         call.scores.softcap = -1.0f;
         torch_call(Q, KV, KV, call);
       }},
      {"scores.alibi_count", [] {
         TorchMhaCall call;
         call.scores.alibi_slopes = {0.5f};
         torch_call(Q, KV, KV, call);
       }},
      {"scores.alibi_finite", [] {
         TorchMhaCall call;
         call.scores.alibi_slopes = {0.5f, INFINITY};
         torch_call(Q, KV, KV, call);
       }},
      {"scores.sinks_count", [] {
         TorchMhaCall call;
         call.scores.sinks = {0.5f};
         torch_call(Q, KV, KV, call);
       }},
      {"scores.sinks_finite", [] {
         TorchMhaCall call;
         call.scores.sinks = {0.5f, INFINITY};
         torch_call(Q, KV, KV, call);
       }},
      {"scores.alibi_appended", [] {
         TorchMhaCall call;
         call.scores.alibi_slopes = {0.1f, 0.2f};
         torch_mha(torch_state({{"bias_k", ones({1, 1, 4})}, {"bias_v", ones({1, 1, 4})}})).forward(Q, KV, KV, call);
       }},
      {"tmha.overflow", [] { torch_call(Tensor({2, 3, 4}, 1e20f), Tensor({2, 6, 4}, 1e20f), KV); }},
      {"tmha.mask_shape", [] {
         TorchMhaCall call;
         call.key_padding_mask = mask_from_torch_mha({2, 5}, std::vector<uint8_t>(10, 0));
         torch_call(Q, KV, KV, call);
       }},
      // TorchMultiheadAttention training
      {"tmha.dropout_mask", [] {
         TorchMultiheadAttention m = torch_mha();
         m.eval();
         m.forward(Q, KV, KV);
         m.last_dropout_mask();
       }},
      {"tmha.backward_no_forward", [] { torch_mha().backward(Q); }},
      {"tmha.backward_shape", [] {
         TorchMultiheadAttention m = torch_mha();
         m.forward(Q, KV, KV);
         m.backward(ones({3, 2, 4}));
       }},
      // MultiHeadAttention training
      {"mha.initialize", [] { MultiHeadAttention(8, 2).initialize(4, 0, 4); }},
      {"mha.initialize_width", [] {
         MultiHeadAttention m(8, 2);
         m.initialize(4, 4, 4);
         m.initialize(4, 5, 4);
       }},
      {"mha.set_grads_name", [] {
         MultiHeadAttention m(8, 2);
         m.initialize(4, 4, 4);
         m.set_grads({{"W_x.weight", ones({8, 4})}});
       }},
      {"mha.set_grads_shape", [] {
         MultiHeadAttention m(8, 2);
         m.initialize(4, 4, 4);
         m.set_grads({{"W_q.weight", ones({4, 8})}});
       }},
      {"mha.dropout_mask", [] { MultiHeadAttention(8, 2).last_dropout_mask(); }},
      {"prune.grouped", [] {
         StateDict s{{"in_proj_weight", Tensor({16, 8}, 1.0f)}, {"out_proj.weight", Tensor({8, 8}, 1.0f)}};
         TorchMhaOptions o = test::batch_first_options();
         o.num_kv_heads = 2;
         TorchMultiheadAttention::from_state_dict(s, 4, o).prune_heads({0});
       }},
      {"context.empty", [] { ForwardContext().attention_weights(); }},
      {"context.owner", [] {
         MultiHeadAttention m(8, 2), other(8, 2);
         const Tensor X = ones({2, 3, 8});
         ForwardContext ctx = m.forward_with_context(X, X, X).context;
         other.backward(ctx, X);
       }},
      {"context.eval", [] {
         MultiHeadAttention m(8, 2);
         m.eval();
         const Tensor X = ones({2, 3, 8});
         m.backward(m.forward_with_context(X, X, X).context, X);
       }},
      {"context.heads", [] {
         MultiHeadAttention m(8, 2);
         const Tensor X = ones({2, 3, 8});
         ForwardContext ctx = m.forward_with_context(X, X, X).context;
         m.prune_heads({0});
         m.backward(ctx, X);
       }},
      {"mha.backward_no_forward", [] {
         MultiHeadAttention m(8, 2);
         m.eval();
         m(ones({2, 3, 4}), ones({2, 5, 4}), ones({2, 5, 4}));
         m.backward(ones({2, 3, 8}));
       }},
      {"mha.backward_shape", [] {
         MultiHeadAttention m(8, 2);
         m(ones({2, 3, 4}), ones({2, 5, 4}), ones({2, 5, 4}));
         m.backward(ones({2, 5, 8}));
       }},
  };
}

}  // namespace mha::test
