// TorchMultiheadAttention's training half: backward(), gradients, parameters.
//
// The forward (torch_mha.cpp) is, with rows in the caller's layout,
//   q = query W_q^T + b_q                                  [B*L rows, E]
//   k = key W_k^T + b_k, then bias_k and a zero row        [B*S' rows, E_kv]
//   v = value W_v^T + b_v, then bias_v and a zero row      [B*S' rows, E_kv]
//   concat = heads(attention(q, k, v; masks, dropout))     [B*L rows, E]
//   out = concat W_o^T + b_o                               [B*L rows, E]
// and backward() runs it in reverse: out_proj's linear backward, the
// attention kernel's backward on the saved projections with the forward's
// masks and dropout key (kernels/attention_backward.h), the appended rows'
// gradients (bias_k/bias_v sum theirs over the batch; the zero row's is
// dropped), then the three projections' linear backwards.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/attention_backward.h"
#include "kernels/dispatch.h"
#include "mha/error.h"
#include "mha/torch_mha.h"
#include "nn/linear_backward.h"
#include "nn/torch_mha_impl.h"

namespace mha {

namespace {

// Layers in the order of PyTorch's parameters(): q, k, v projections, out.
const char* const kLayers[] = {"q_proj", "k_proj", "v_proj", "out_proj"};

// dy:[B*S' rows, width] -> the gradient of the K given rows through
// `layer` (x:[B*K rows, in] -> dx), laid out as project_keys() wrote them.
void keys_backward(const LazyLinear& layer, const Tensor& x, const float* dy,
                   const nn::TorchMhaGeometry& g, Tensor& dx, Tensor& dW, Tensor* db) {
  const int64_t width = layer.out_features(), in = layer.in_features();
  if (g.seq_first || g.Kt == g.K) {
    // The K given positions are the first B*K rows in both layouts here.
    nn::linear_backward(layer, x.data(), dy, g.B * g.K, dx.data(), dW, db);
    return;
  }
  for (int64_t b = 0; b < g.B; ++b)
    nn::linear_backward(layer, x.data() + b * g.K * in, dy + b * g.Kt * width, g.K,
                        dx.data() + b * g.K * in, dW, db);
}

// grad (1, 1, width) += the sum over the batch of dy's row at position K.
void appended_row_backward(const float* dy, const nn::TorchMhaGeometry& g, int64_t width,
                           Tensor& grad) {
  for (int64_t c = 0; c < width; ++c) {
    double sum = 0.0;
    for (int64_t b = 0; b < g.B; ++b) sum += dy[g.row(b, g.K, g.Kt) * width + c];
    grad.data()[c] += static_cast<float>(sum);
  }
}

}  // namespace

void TorchMultiheadAttention::ensure_grads() {
  const LazyLinear* layers[] = {&q_proj_, &k_proj_, &v_proj_, &out_proj_};
  auto zeros_like = [&](const std::string& name, const Tensor& t) {
    Tensor& g = grads_[name];
    if (g.shape() != t.shape()) g = Tensor(t.shape());
  };
  for (int i = 0; i < 4; ++i) {
    zeros_like(std::string(kLayers[i]) + ".weight", layers[i]->weight());
    if (bias_) zeros_like(std::string(kLayers[i]) + ".bias", layers[i]->bias());
  }
  if (has_bias_kv()) {
    zeros_like("bias_k", bias_k_);
    zeros_like("bias_v", bias_v_);
  }
}

void TorchMultiheadAttention::zero_grad() {
  ensure_grads();
  for (auto& [name, g] : grads_) std::fill(g.values().begin(), g.values().end(), 0.0f);
}

StateDict TorchMultiheadAttention::grads() const {
  auto grad = [&](const std::string& name, const Tensor& like) {
    auto it = grads_.find(name);
    return it != grads_.end() ? it->second : Tensor(like.shape());
  };
  StateDict s;
  const Tensor wq = grad("q_proj.weight", q_proj_.weight());
  const Tensor wk = grad("k_proj.weight", k_proj_.weight());
  const Tensor wv = grad("v_proj.weight", v_proj_.weight());
  if (packed_) {
    s["in_proj_weight"] = nn::concat_rows(wq, wk, wv);
  } else {
    s["q_proj_weight"] = wq;
    s["k_proj_weight"] = wk;
    s["v_proj_weight"] = wv;
  }
  if (bias_) {
    s["in_proj_bias"] = nn::concat_rows(grad("q_proj.bias", q_proj_.bias()), grad("k_proj.bias", k_proj_.bias()),
                                    grad("v_proj.bias", v_proj_.bias()));
    s["out_proj.bias"] = grad("out_proj.bias", out_proj_.bias());
  }
  s["out_proj.weight"] = grad("out_proj.weight", out_proj_.weight());
  if (has_bias_kv()) {
    s["bias_k"] = grad("bias_k", bias_k_);
    s["bias_v"] = grad("bias_v", bias_v_);
  }
  return s;
}

ParamList TorchMultiheadAttention::parameters() {
  ensure_grads();
  ParamList out;
  LazyLinear* proj[] = {&q_proj_, &k_proj_, &v_proj_};
  const char* names[] = {"q_proj", "k_proj", "v_proj"};
  // PyTorch's order: in_proj_weight (or q/k/v_proj_weight), in_proj_bias,
  // out_proj.weight, out_proj.bias, then bias_k, bias_v.
  for (int i = 0; i < 3; ++i)
    out.push_back({std::string(names[i]) + "_weight", &proj[i]->weight(),
                   &grads_.at(std::string(kLayers[i]) + ".weight")});
  if (bias_)
    for (int i = 0; i < 3; ++i)
      out.push_back({std::string(names[i]) + "_bias", &proj[i]->bias(),
                     &grads_.at(std::string(kLayers[i]) + ".bias")});
  out.push_back({"out_proj.weight", &out_proj_.weight(), &grads_.at("out_proj.weight")});
  if (bias_) out.push_back({"out_proj.bias", &out_proj_.bias(), &grads_.at("out_proj.bias")});
  if (has_bias_kv()) {
    out.push_back({"bias_k", &bias_k_, &grads_.at("bias_k")});
    out.push_back({"bias_v", &bias_v_, &grads_.at("bias_v")});
  }
  return out;
}

Tensor TorchMultiheadAttention::last_dropout_mask() const {
  if (!saved_)
    fail("TorchMultiheadAttention.last_dropout_mask",
         "no training-mode forward since the last eval-mode one: there is no mask to show");
  const nn::TorchMhaGeometry& g = saved_->g;
  Tensor mask({g.B, num_heads_, g.Q, g.Kt});
  float* m = mask.data();
  for (int64_t i = 0; i < mask.numel(); ++i) m[i] = saved_->dropout.multiplier(static_cast<uint64_t>(i));
  return mask;
}

TorchMultiheadAttention::InputGrads TorchMultiheadAttention::backward(const Tensor& grad_output) {
  static const char* op = "TorchMultiheadAttention.backward";
  if (!saved_)
    fail(op, "no training-mode forward to differentiate: call the module in training mode "
             "(train()) before backward()");
  const nn::TorchMhaSaved& s = *saved_;
  const nn::TorchMhaGeometry& g = s.g;
  const int64_t E = embed_dim_, H = num_heads_, Hkv = num_kv_heads_, d = head_dim();
  const int64_t Ekv = Hkv * d;
  if (grad_output.shape() != s.query.shape())
    fail(op, "grad_output: shape ", shape_str(grad_output.shape()), " is not the output's ",
         shape_str(s.query.shape()));
  ensure_grads();
  auto grad = [&](int layer, const char* what) -> Tensor& {
    return grads_.at(std::string(kLayers[layer]) + what);
  };
  auto grad_b = [&](int layer) -> Tensor* { return bias_ ? &grad(layer, ".bias") : nullptr; };

  // out = concat W_o^T + b_o.
  Tensor d_concat({g.B * g.Q, E});
  nn::linear_backward(out_proj_, s.concat.data(), grad_output.data(), g.B * g.Q, d_concat.data(),
                      grad(3, ".weight"), grad_b(3));

  // concat = heads(attention(q, k, v)) with the forward's masks and dropout.
  Tensor dq({g.B * g.Q, E});
  std::vector<float> dk(s.k.size()), dv(s.v.size());
  auto view = [&](const float* data, int64_t L, int64_t heads) {
    return nn::head_view(const_cast<float*>(data), g, L, heads, d);
  };
  kernels::AttentionBackward p;
  p.fwd.q = view(s.q.data(), g.Q, H);
  p.fwd.k = view(s.k.data(), g.Kt, Hkv);
  p.fwd.v = view(s.v.data(), g.Kt, Hkv);
  p.grad_out = view(d_concat.data(), g.Q, H);
  p.fwd.out = view(s.concat.data(), g.Q, H);
  p.fwd.scale_divisor = std::sqrt(static_cast<float>(d));
  p.fwd.dropout = s.dropout;
  p.fwd.masks = s.masks.options();
  p.fwd.weights = s.weights.empty() ? nullptr : const_cast<float*>(s.weights.data());
  p.grad_q = view(dq.data(), g.Q, H);
  p.grad_k = view(dk.data(), g.Kt, Hkv);
  p.grad_v = view(dv.data(), g.Kt, Hkv);
  if (!s.stats.empty()) {
    // The forward saved statistics: the fused backward recomputes P from
    // them, tile by tile (the kernels only read them).
    const size_t n = s.stats.size() / 2;
    float* stats = const_cast<float*>(s.stats.data());
    p.fwd.stats = {stats, stats + n};
  }
  kernels::attention_backward(kernel_, p);

  // bias_k / bias_v: row K of every batch row's keys / values.
  if (has_bias_kv()) {
    appended_row_backward(dk.data(), g, Ekv, grads_.at("bias_k"));
    appended_row_backward(dv.data(), g, Ekv, grads_.at("bias_v"));
  }

  // q = query W_q^T + b_q, and likewise for the K given keys and values.
  InputGrads out{Tensor(s.query.shape()), Tensor(s.key.shape()), Tensor(s.value.shape())};
  nn::linear_backward(q_proj_, s.query.data(), dq.data(), g.B * g.Q, out.query.data(),
                      grad(0, ".weight"), grad_b(0));
  keys_backward(k_proj_, s.key, dk.data(), g, out.key, grad(1, ".weight"), grad_b(1));
  keys_backward(v_proj_, s.value, dv.data(), g, out.value, grad(2, ".weight"), grad_b(2));
  return out;
}

}  // namespace mha
