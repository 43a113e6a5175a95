// kv_cache() and the cached forward() of both modules (mha/kv_cache.h): each
// checks its arguments in its own terms and hands the call to
// nn/cached_attention.h, which both share.
#include "core/memory.h"
#include "mha/error.h"
#include "mha/multihead.h"
#include "mha/torch_mha.h"
#include "nn/cached_attention.h"
#include "nn/kv_cache.h"

namespace mha {

namespace {

void check_positions(const char* op, const Tensor& queries, const Tensor& x, const char* name, int axis) {
  if (x.size(axis) != queries.size(axis))
    fail(op, name, ": shape ", shape_str(x.shape()), " has ", x.size(axis), " positions; a cached call wants the ",
         queries.size(axis), " new positions of the queries (", shape_str(queries.shape()), ") for keys and values alike");
}

}  // namespace

KVCache MultiHeadAttention::kv_cache(int64_t batch_size, int64_t max_len, KVCacheDtype dtype, int64_t window) const {
  const Pinned p = params_.pin();
  return nn::CacheAccess::make("MultiHeadAttention.kv_cache", {"MultiHeadAttention", id_.value(), p->num_heads, p->heads.head_dim},
                               batch_size, max_len, dtype, window);
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values, KVCache& cache) {
  return forward(queries, keys, values, ValidLens{}, cache);
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                   const ValidLens& valid_lens, KVCache& cache, const Window& window,
                                   const ScoreOptions& scores) {
  static const char* op = "MultiHeadAttention.forward";
  for (const auto& [t, name, wanted] : {std::tuple{&queries, "queries", "(B, n, Dq)"},
                                        std::tuple{&keys, "keys", "(B, n, Dk)"},
                                        std::tuple{&values, "values", "(B, n, Dv)"}}) {
    if (t->dim() != 3) fail(op, name, ": shape ", shape_str(t->shape()), " is not ", wanted);
    if (t->size(2) <= 0) fail(op, name, ": shape ", shape_str(t->shape()), " has no features");
  }
  const int64_t B = queries.size(0), n = queries.size(1);
  if (keys.size(0) != B || values.size(0) != B)
    fail(op, "keys/values: shapes ", shape_str(keys.shape()), " and ", shape_str(values.shape()),
         " do not have the batch size of queries ", shape_str(queries.shape()));
  check_positions(op, queries, keys, "keys", 1);
  check_positions(op, queries, values, "values", 1);
  if (n == 0) fail(op, "queries: shape ", shape_str(queries.shape()), " has no new positions");
  if (training())
    fail(op, "cache: cached calls run in evaluation mode only (this module is in training mode); call eval() first");

  Pinned p = params_.pin();
  if (!p->initialized()) {
    core::MemoryPlan(op).add("W_q, W_k, W_v, W_o", {p->inner_dim(), queries.size(2) + keys.size(2) + values.size(2) + p->inner_dim() + 4}).check();
    p.reset();  // the lazy initialisation waits for the calls that hold a pin
    p = initialize_for(op, queries, keys, values);
  }
  check_widths(*p, queries, keys, values);
  nn::EngineLayers layers{&p->W_q, &p->W_k, &p->W_v, &p->W_o};
  layers.head_gates = p->heads.gates.data();
  nn::CachedCall call;
  call.op = op;
  call.who = {"MultiHeadAttention", id_.value(), p->num_heads, p->heads.head_dim};
  call.layout = {false, B};
  call.n = n;
  call.H = p->num_heads;
  call.out_shape = {B, n, num_hiddens_};
  call.valid_lens = valid_lens;  // checked against (B, n) with the cache
  call.window = window;
  call.scores = scores;
  call.precision = precision_.get();
  call.rotary = rotary();
  return nn::cached_attention_forward(queries, keys, values, layers, call, cache);
}

KVCache TorchMultiheadAttention::kv_cache(int64_t batch_size, int64_t max_len, KVCacheDtype dtype,
                                          int64_t window) const {
  return nn::CacheAccess::make("TorchMultiheadAttention.kv_cache",
                               {"TorchMultiheadAttention", id_.value(), num_kv_heads_, head_dim()}, batch_size,
                               max_len, dtype, window);
}

Tensor TorchMultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value, KVCache& cache,
                                        const Mask& key_padding_mask, const Window& window,
                                        const ScoreOptions& scores) {
  static const char* op = "TorchMultiheadAttention.forward";
  const bool batched = query.dim() == 3;
  if (query.dim() != 2 && query.dim() != 3)
    fail(op, "query: shape ", shape_str(query.shape()), " is neither ", batch_first_ ? "(B, L, E)" : "(L, B, E)",
         " nor unbatched (L, E)");
  if (key.dim() != query.dim() || value.dim() != query.dim())
    fail(op, "key/value: shapes ", shape_str(key.shape()), " and ", shape_str(value.shape()),
         " do not have the rank of query ", shape_str(query.shape()));
  const int bax = batched && batch_first_ ? 0 : 1;  // batch axis when batched
  const int pax = batched && batch_first_ ? 1 : 0;  // position axis
  const int64_t B = batched ? query.size(bax) : 1, n = query.size(pax);
  if (query.size(-1) != embed_dim_)
    fail(op, "query: shape ", shape_str(query.shape()), " has width ", query.size(-1), "; wanted embed_dim ", embed_dim_);
  if (key.size(-1) != kdim())
    fail(op, "key: shape ", shape_str(key.shape()), " has width ", key.size(-1), "; wanted kdim ", kdim());
  if (value.size(-1) != vdim())
    fail(op, "value: shape ", shape_str(value.shape()), " has width ", value.size(-1), "; wanted vdim ", vdim());
  if (batched && (key.size(bax) != B || value.size(bax) != B))
    fail(op, "key/value: shapes ", shape_str(key.shape()), " and ", shape_str(value.shape()),
         " do not have query's batch size ", B);
  check_positions(op, query, key, "key", pax);
  check_positions(op, query, value, "value", pax);
  if (n == 0) fail(op, "query: shape ", shape_str(query.shape()), " has no new positions");
  if (training_)
    fail(op, "cache: cached calls run in evaluation mode only (this module is in training mode); call eval() first");
  if (has_bias_kv() || add_zero_attn_)
    fail(op, "cache: a module with add_bias_kv or add_zero_attn cannot decode with a cache yet (its appended "
         "key would sit between cached positions)");

  nn::EngineLayers layers{&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  layers.head_gates = heads_.gates.data();
  nn::CachedCall call;
  call.op = op;
  call.who = {"TorchMultiheadAttention", id_.value(), num_kv_heads_, head_dim()};
  call.layout = {!batched || !batch_first_, B};
  call.n = n;
  call.H = num_heads_;
  call.out_shape = query.shape();
  // nn.MultiheadAttention's masks: a masked key drops out (-inf), and a
  // query left with none gets the module's policy, as without a cache.
  call.key_padding_mask = key_padding_mask;  // its shape checked against the cache's lengths
  call.unbatched = !batched;
  call.fill = kernels::MaskFill::NegInf;
  call.fully_masked = fully_masked_;
  call.precision = precision_;
  call.rotary = rotary_;
  call.window = window;
  call.scores = scores;
  return nn::cached_attention_forward(query, key, value, layers, call, cache);
}

}  // namespace mha
