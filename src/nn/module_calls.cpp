// Each module's forward as a function of its layers (nn/module_calls.h).
// The drop-in's projections read and write rows in the caller's layout
// (batch- or sequence-first), and the kernel sees heads through strides, so
// neither layout costs a transpose. bias_k/bias_v and add_zero_attn append
// key/value rows after projection, as PyTorch does, and every mask gets a
// "takes part" column for each appended key.
#include "nn/module_calls.h"

#include "core/memory.h"
#include "mha/error.h"
#include "nn/call_masks.h"

namespace mha::nn {

namespace {

void check_rank3(const char* op, const Tensor& t, const char* name, const char* wanted) {
  if (t.dim() != 3) fail(op, name, ": shape ", shape_str(t.shape()), " is not ", wanted);
}

void check_width(const char* op, const LayerRef& layer, const char* layer_name, const Tensor& x, const char* name) {
  if (x.size(2) <= 0) fail(op, name, ": shape ", shape_str(x.shape()), " has no features");
  if (layer.initialized() && x.size(2) != layer.in_features())
    fail(op, name, ": width ", x.size(2), " (shape ", shape_str(x.shape()), ") differs from ",
         layer_name, "'s input width ", layer.in_features(),
         ", fixed by the first call or by load_state_dict");
}

void apply_settings(EngineCall& c, const CallSettings& s) {
  c.kernel = s.kernel;
  c.precision = s.precision;
  c.rotary = s.rotary;
  c.keep_for_backward = s.keep_for_backward;
  c.keep_for_weights = s.keep_for_weights;
  c.dropout = s.dropout;
}

}  // namespace

void draw_dropout_key(EngineCall& c, const CallSettings& s) {
  if (s.dropout_keys && s.dropout.p > 0.0f) c.dropout.key = s.dropout_keys->next();
}

namespace {

}  // namespace

EngineCall chapter_call(const char* op, const Tensor& queries, const Tensor& keys, const Tensor& values,
                        const ValidLens& valid_lens, const CallMasks& masks, int64_t H, int64_t d, int64_t Dout,
                        const CallSettings& settings) {
  check_rank3(op, queries, "queries", "(B, Q, Dq)");
  check_rank3(op, keys, "keys", "(B, K, Dk)");
  check_rank3(op, values, "values", "(B, K, Dv)");
  const int64_t B = queries.size(0), Q = queries.size(1), K = keys.size(1);
  if (keys.size(0) != B)
    fail(op, "keys: batch size ", keys.size(0), " differs from queries' ", B,
         " (keys ", shape_str(keys.shape()), ", queries ", shape_str(queries.shape()), ")");
  if (values.size(0) != B)
    fail(op, "values: batch size ", values.size(0), " differs from queries' ", B,
         " (values ", shape_str(values.shape()), ", queries ", shape_str(queries.shape()), ")");
  if (values.size(1) != K)
    fail(op, "values: shape ", shape_str(values.shape()), " has ", values.size(1),
         " positions but keys ", shape_str(keys.shape()), " have ", K);
  if (K == 0) fail(op, "keys: shape ", shape_str(keys.shape()), " has no keys to attend to");
  valid_lens.check(op, B, Q);
  // Batch-major rows, the chapter's lengths and any masks beside them.
  EngineCall call;
  call.op = op;
  call.inputs = "queries, keys, values";
  call.layout = {false, B};
  call.Q = Q, call.K = K;
  call.H = call.Hkv = H, call.d = d;
  call.out_shape = {B, Q, Dout};
  call.lens = valid_lens;
  const MaskGeometry geometry{true, B, Q, K, K, H};
  call.masks = build_masks(op, masks.key_padding_mask, masks.attn_mask, masks.causal, masks.window, masks.fully_masked_rows,
                           geometry);
  add_score_options(op, masks.scores, geometry, call.masks);
  apply_settings(call, settings);
  return call;
}

void check_chapter_widths(const char* op, const EngineLayers& layers, const Tensor& queries, const Tensor& keys,
                          const Tensor& values) {
  check_width(op, layers.q, "W_q", queries, "queries");
  check_width(op, layers.k, "W_k", keys, "keys");
  check_width(op, layers.v, "W_v", values, "values");
}

TorchMhaForward torch_mha_forward(const char* op, const TorchMhaShape& s, const EngineLayers& layers,
                                  const Tensor& query, const Tensor& key, const Tensor& value,
                                  const TorchMhaCall& call, const CallSettings& settings,
                                  std::vector<Tensor>* reuse) {
  const int64_t E = s.embed_dim, H = s.num_heads, d = s.head_dim;
  const int64_t kdim = layers.k.in_features(), vdim = layers.v.in_features();
  // --- shapes ---
  const bool batched = query.dim() == 3;
  if (query.dim() != 2 && query.dim() != 3)
    fail(op, "query: shape ", shape_str(query.shape()), " is neither ",
         s.batch_first ? "(B, L, E)" : "(L, B, E)", " nor unbatched (L, E)");
  if (key.dim() != query.dim() || value.dim() != query.dim())
    fail(op, "key/value: shapes ", shape_str(key.shape()), " and ", shape_str(value.shape()),
         " do not have the rank of query ", shape_str(query.shape()));
  // Rows of every buffer are (b, position) pairs in the caller's layout:
  // b-major when batch_first, position-major otherwise (and for an
  // unbatched call, B = 1).
  const bool seq_first = !batched || !s.batch_first;
  const int bax = batched && s.batch_first ? 0 : 1;  // batch axis when batched
  const int pax = batched && s.batch_first ? 1 : 0;  // position axis
  const int64_t B = batched ? query.size(bax) : 1, Q = query.size(pax), K = key.size(pax);
  const int64_t Kt = K + (layers.bias_k ? 1 : 0) + (layers.zero_row ? 1 : 0);
  const char* layout = !batched ? "(S, width)" : s.batch_first ? "(B, S, width)" : "(S, B, width)";
  if (query.size(-1) != E)
    fail(op, "query: shape ", shape_str(query.shape()), " has width ", query.size(-1), "; wanted embed_dim ", E);
  if (key.size(-1) != kdim)
    fail(op, "key: shape ", shape_str(key.shape()), " has width ", key.size(-1), "; wanted kdim ", kdim);
  if (value.size(-1) != vdim)
    fail(op, "value: shape ", shape_str(value.shape()), " has width ", value.size(-1), "; wanted vdim ", vdim);
  if (batched && (key.size(bax) != B || value.size(bax) != B))
    fail(op, "key/value: shapes ", shape_str(key.shape()), " and ", shape_str(value.shape()),
         " do not have query's batch size ", B, " (layout ", layout, ")");
  if (value.size(pax) != K)
    fail(op, "value: shape ", shape_str(value.shape()), " has ", value.size(pax), " positions but key ",
         shape_str(key.shape()), " has ", K);
  if (Kt == 0) fail(op, "key: shape ", shape_str(key.shape()), " has no keys to attend to");
  // --- the engine (nn/attention_engine.h) ---
  EngineCall c;
  c.op = op;
  c.inputs = "query, key, value";
  c.layout = {seq_first, B};
  c.Q = Q, c.K = K;
  c.H = H, c.Hkv = s.num_kv_heads, c.d = d;
  c.out_shape = query.shape();
  const MaskGeometry geometry{batched, B, Q, K, Kt, H};
  c.masks = build_masks(op, call.key_padding_mask, call.attn_mask, call.causal, call.window, s.fully_masked,
                        geometry);
  add_score_options(op, call.scores, geometry, c.masks);
  apply_settings(c, settings);
  c.need_weights = call.need_weights;
  core::MemoryPlan plan(op);
  add_call_memory(plan, c, layers, layers.o.out_features());
  plan.check();
  draw_dropout_key(c, settings);
  const kernels::Dropout dropout = c.dropout;
  EngineOutput r = attention_forward(query, key, value, layers, std::move(c), reuse);
  TorchMhaForward f;
  f.context = std::move(r.context);
  f.result.output = std::move(r.output);
  if (!call.need_weights) return f;
  Tensor weights = std::move(r.weights);
  // PyTorch returns the weights after dropout; the kernel's are before it,
  // and its counter-based mask is recomputed here from the same key.
  if (dropout.active())
    for (int64_t x = 0; x < weights.numel(); ++x) weights.data()[x] *= dropout.multiplier(static_cast<uint64_t>(x));
  if (call.average_attn_weights) {
    Tensor avg({B, Q, Kt}, 0.0f);
    const int64_t QK = Q * Kt;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < QK; ++x) avg.data()[b * QK + x] += weights.data()[(b * H + h) * QK + x];
    for (float& x : avg.values()) x /= static_cast<float>(H);
    weights = batched ? avg : avg.reshape({Q, Kt});
  } else if (!batched) {
    weights = weights.reshape({H, Q, Kt});
  }
  f.result.weights = std::move(weights);
  return f;
}

}  // namespace mha::nn
