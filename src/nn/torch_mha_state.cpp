// TorchMultiheadAttention: construction from PyTorch's state dict, and back.
// Every check runs before anything is built, so a bad dict builds nothing.
#include <functional>
#include <set>
#include <string>

#include "mha/error.h"
#include "mha/safetensors.h"
#include "mha/torch_mha.h"

namespace mha {

namespace {

const char* kLoad = "TorchMultiheadAttention.from_state_dict";

// Rows [begin, begin + count) of a (R, C) tensor, as a (count, C) tensor.
Tensor row_slice(const Tensor& t, int64_t begin, int64_t count) {
  const int64_t C = t.dim() == 2 ? t.size(1) : 1;
  const float* from = t.data() + begin * C;
  return Tensor({count, C}, std::vector<float>(from, from + count * C));
}

Tensor element_slice(const Tensor& t, int64_t begin, int64_t count) {
  const float* from = t.data() + begin;
  return Tensor({count}, std::vector<float>(from, from + count));
}

void want_shape(const StateDict& s, const std::string& name, const Shape& wanted,
                const std::string& why) {
  const Tensor& t = s.at(name);
  if (t.shape() != wanted)
    fail(kLoad, name, ": shape ", shape_str(t.shape()), " is not ", shape_str(wanted), why);
}

// a, b, c stacked along axis 0 (PyTorch's packed in_proj_weight / in_proj_bias
// from the q, k, v parts): [Na, ...], [Nb, ...], [Nc, ...] -> [Na+Nb+Nc, ...].
Tensor concat_rows(const Tensor& a, const Tensor& b, const Tensor& c) {
  std::vector<float> all(a.values());
  all.insert(all.end(), b.values().begin(), b.values().end());
  all.insert(all.end(), c.values().begin(), c.values().end());
  Shape shape = a.shape();
  shape[0] = a.size(0) + b.size(0) + c.size(0);
  return Tensor(shape, std::move(all));
}

}  // namespace


TorchMultiheadAttention::TorchMultiheadAttention(int64_t embed_dim, int64_t num_heads,
                                                 int64_t num_kv_heads, bool bias,
                                                 const TorchMhaOptions& o)
    : embed_dim_(embed_dim),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      bias_(bias),
      batch_first_(o.batch_first),
      add_zero_attn_(o.add_zero_attn),
      dropout_(o.dropout),
      fully_masked_(o.fully_masked_rows),
      gen_(o.seed),
      dropout_keys_(o.seed),
      q_proj_(embed_dim, bias),
      k_proj_(embed_dim / num_heads * num_kv_heads, bias),
      v_proj_(embed_dim / num_heads * num_kv_heads, bias),
      out_proj_(embed_dim, bias) {
  heads_.init(num_heads, embed_dim / num_heads);
}

void TorchMultiheadAttention::set_rotary(const Rotary& r) {
  check_rotary("TorchMultiheadAttention.set_rotary", r, head_dim());
  rotary_ = r;
}

void TorchMultiheadAttention::set_dropout(float p) {
  if (!(p >= 0.0f && p <= 1.0f))
    fail("TorchMultiheadAttention.set_dropout", "p: ", p, " is not a probability in [0, 1]");
  dropout_ = p;
}

TorchMultiheadAttention TorchMultiheadAttention::from_state_dict(const StateDict& s,
                                                                 int64_t num_heads,
                                                                 const TorchMhaOptions& o) {
  static const std::set<std::string> known = {
      "in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight", "v_proj_weight",
      "out_proj.weight", "out_proj.bias", "bias_k", "bias_v"};
  for (const auto& [name, t] : s)
    if (!known.count(name))
      fail(kLoad, "unexpected parameter '", name, "'; nn.MultiheadAttention's are in_proj_weight, ",
           "in_proj_bias, q/k/v_proj_weight, out_proj.weight, out_proj.bias, bias_k, bias_v");
  auto has = [&](const char* n) { return s.count(n) > 0; };
  if (!has("out_proj.weight")) fail(kLoad, "missing parameter 'out_proj.weight'");
  const Tensor& wo = s.at("out_proj.weight");
  if (wo.dim() != 2 || wo.size(0) != wo.size(1) || wo.size(0) <= 0)
    fail(kLoad, "out_proj.weight: shape ", shape_str(wo.shape()), " is not (E, E) with E > 0");
  const int64_t E = wo.size(0);
  if (num_heads <= 0) fail(kLoad, "num_heads: ", num_heads, " is not positive");
  if (E % num_heads != 0)
    fail(kLoad, "num_heads: ", num_heads, " does not divide embed_dim ", E,
         " (out_proj.weight ", shape_str(wo.shape()), ")");
  const int64_t Hkv = o.num_kv_heads == 0 ? num_heads : o.num_kv_heads;
  if (Hkv <= 0 || num_heads % Hkv != 0)
    fail(kLoad, "num_kv_heads: ", o.num_kv_heads, " does not divide num_heads ", num_heads);
  if (!(o.dropout >= 0.0f && o.dropout <= 1.0f))
    fail(kLoad, "dropout: ", o.dropout, " is not a probability in [0, 1]");
  const int64_t Ekv = E / num_heads * Hkv;
  const std::string kv_note =
      Hkv == num_heads ? "" : " (E_kv = " + std::to_string(Ekv) + " for num_kv_heads " + std::to_string(Hkv) + ")";

  // Projection weights: packed, or one per input when kdim/vdim differ from E.
  const bool packed = has("in_proj_weight");
  const bool separate = has("q_proj_weight") || has("k_proj_weight") || has("v_proj_weight");
  if (packed && separate)
    fail(kLoad, "in_proj_weight and q/k/v_proj_weight are both present; a module has one or the other");
  if (!packed && !separate)
    fail(kLoad, "missing parameter 'in_proj_weight' (or q_proj_weight, k_proj_weight, v_proj_weight)");
  int64_t kdim = E, vdim = E;
  if (packed) {
    want_shape(s, "in_proj_weight", {E + 2 * Ekv, E}, kv_note);
  } else {
    for (const char* n : {"q_proj_weight", "k_proj_weight", "v_proj_weight"})
      if (!has(n)) fail(kLoad, "missing parameter '", n, "' (the others of q/k/v_proj_weight are present)");
    want_shape(s, "q_proj_weight", {E, E}, "");
    const Tensor& wk = s.at("k_proj_weight");
    const Tensor& wv = s.at("v_proj_weight");
    if (wk.dim() != 2 || wk.size(0) != Ekv || wk.size(1) <= 0)
      fail(kLoad, "k_proj_weight: shape ", shape_str(wk.shape()), " is not (", Ekv, ", kdim)", kv_note);
    if (wv.dim() != 2 || wv.size(0) != Ekv || wv.size(1) <= 0)
      fail(kLoad, "v_proj_weight: shape ", shape_str(wv.shape()), " is not (", Ekv, ", vdim)", kv_note);
    kdim = wk.size(1);
    vdim = wv.size(1);
  }
  if (o.kdim != 0 && o.kdim != kdim)
    fail(kLoad, "kdim: ", o.kdim, " differs from the state dict's key width ", kdim);
  if (o.vdim != 0 && o.vdim != vdim)
    fail(kLoad, "vdim: ", o.vdim, " differs from the state dict's value width ", vdim);

  // bias=True gives both in_proj_bias and out_proj.bias; add_bias_kv both of its.
  const bool bias = has("in_proj_bias");
  if (bias != has("out_proj.bias"))
    fail(kLoad, bias ? "missing parameter 'out_proj.bias'" : "missing parameter 'in_proj_bias'",
         " (nn.MultiheadAttention has both biases or neither)");
  if (bias) {
    want_shape(s, "in_proj_bias", {E + 2 * Ekv}, kv_note);
    want_shape(s, "out_proj.bias", {E}, "");
  }
  const bool bias_kv = has("bias_k");
  if (bias_kv != has("bias_v"))
    fail(kLoad, bias_kv ? "missing parameter 'bias_v'" : "missing parameter 'bias_k'",
         " (add_bias_kv gives both or neither)");
  if (bias_kv) {
    want_shape(s, "bias_k", {1, 1, Ekv}, kv_note);
    want_shape(s, "bias_v", {1, 1, Ekv}, kv_note);
  }

  TorchMultiheadAttention m(E, num_heads, Hkv, bias, o);
  m.packed_ = packed;
  if (packed) {
    const Tensor& w = s.at("in_proj_weight");
    m.q_proj_.set_weight(row_slice(w, 0, E), kLoad);
    m.k_proj_.set_weight(row_slice(w, E, Ekv), kLoad);
    m.v_proj_.set_weight(row_slice(w, E + Ekv, Ekv), kLoad);
  } else {
    m.q_proj_.set_weight(s.at("q_proj_weight"), kLoad);
    m.k_proj_.set_weight(s.at("k_proj_weight"), kLoad);
    m.v_proj_.set_weight(s.at("v_proj_weight"), kLoad);
  }
  m.out_proj_.set_weight(wo, kLoad);
  if (bias) {
    const Tensor& b = s.at("in_proj_bias");
    m.q_proj_.set_bias(element_slice(b, 0, E), kLoad);
    m.k_proj_.set_bias(element_slice(b, E, Ekv), kLoad);
    m.v_proj_.set_bias(element_slice(b, E + Ekv, Ekv), kLoad);
    m.out_proj_.set_bias(s.at("out_proj.bias"), kLoad);
  }
  if (bias_kv) {
    m.bias_k_ = s.at("bias_k");
    m.bias_v_ = s.at("bias_v");
  }
  return m;
}

TorchMultiheadAttention TorchMultiheadAttention::from_safetensors(const std::string& path,
                                                                  int64_t num_heads,
                                                                  const TorchMhaOptions& options) {
  return from_state_dict(load_f32_tensors(path), num_heads, options);
}

StateDict TorchMultiheadAttention::by_torch_names(const std::function<Tensor(const char*, const Tensor&)>& get) const {
  // Pruned heads come back as zero rows of the projections and zero columns
  // of out_proj: PyTorch's shapes, computing what the pruned module computes.
  const int64_t d = heads_.head_dim, rows = heads_.original * d;
  const std::vector<int64_t>& kept = heads_.kept;
  auto rows_of = [&](const char* name, const Tensor& t) {
    const Tensor x = get(name, t);
    return heads_.pruned() ? detail::put_row_blocks(x, kept, d, rows) : x;
  };
  auto appended = [&](const char* name, const Tensor& t) {  // (1, 1, E_kv)
    const Tensor x = get(name, t);
    if (!heads_.pruned()) return x;
    return detail::put_column_blocks(x.reshape({1, x.numel()}), kept, d, rows).reshape({1, 1, rows});
  };
  StateDict s;
  const Tensor wq = rows_of("q_proj.weight", q_proj_.weight());
  const Tensor wk = rows_of("k_proj.weight", k_proj_.weight());
  const Tensor wv = rows_of("v_proj.weight", v_proj_.weight());
  if (packed_) {
    s["in_proj_weight"] = concat_rows(wq, wk, wv);
  } else {
    s["q_proj_weight"] = wq;
    s["k_proj_weight"] = wk;
    s["v_proj_weight"] = wv;
  }
  if (bias_) {
    s["in_proj_bias"] = concat_rows(rows_of("q_proj.bias", q_proj_.bias()), rows_of("k_proj.bias", k_proj_.bias()),
                                    rows_of("v_proj.bias", v_proj_.bias()));
    s["out_proj.bias"] = get("out_proj.bias", out_proj_.bias());
  }
  const Tensor wo = get("out_proj.weight", out_proj_.weight());
  s["out_proj.weight"] = heads_.pruned() ? detail::put_column_blocks(wo, kept, d, rows) : wo;
  if (has_bias_kv()) {
    s["bias_k"] = appended("bias_k", bias_k_);
    s["bias_v"] = appended("bias_v", bias_v_);
  }
  return s;
}

StateDict TorchMultiheadAttention::state_dict() const {
  return by_torch_names([](const char*, const Tensor& t) { return t; });
}

StateDict TorchMultiheadAttention::grads() const {
  return by_torch_names([&](const char* name, const Tensor& like) {
    auto it = grads_.find(name);
    return it != grads_.end() && !it->second.empty() ? it->second : Tensor(like.shape());
  });
}

}  // namespace mha
