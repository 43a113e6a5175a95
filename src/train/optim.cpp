// The optimisers of mha/optim.h. Each element update is written as PyTorch
// 1.13's single-tensor code performs it: float32 arithmetic on the tensors,
// with the scalar coefficients (1 - beta1, lr / (1 - beta1^t), ...) computed
// in double, as Python computes them, and rounded to float where PyTorch
// passes them to a float kernel.
#include "mha/optim.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "mha/error.h"

namespace mha::optim {

namespace {

void check_params(const ParamList& params, const char* op) {
  if (params.empty()) fail(op, "params: the list is empty (a lazy module has no parameters until its first call)");
  std::set<std::string> names;
  for (const ParamRef& p : params) {
    if (!p.value || !p.grad) fail(op, "params: '", p.name, "' has no value or gradient tensor");
    if (p.value->shape() != p.grad->shape())
      fail(op, "params: '", p.name, "' has value ", shape_str(p.value->shape()), " but gradient ",
           shape_str(p.grad->shape()));
    if (!names.insert(p.name).second) fail(op, "params: '", p.name, "' appears twice");
  }
}

void check_nonnegative(const char* op, const char* what, double x) {
  if (!(x >= 0.0)) fail(op, what, ": ", x, " is not a number >= 0");
}

// An infinite learning rate makes every parameter infinite or NaN on the
// first step.
void check_lr(const char* op, double lr) {
  check_nonnegative(op, "lr", lr);
  if (std::isinf(lr)) fail(op, "lr: ", lr, " is not finite; wanted a finite learning rate >= 0");
}

}  // namespace

Optimizer::Optimizer(ParamList params, double lr, const char* op) : params_(std::move(params)), lr_(lr) {
  check_params(params_, op);
  check_lr(op, lr);
}

void Optimizer::zero_grad() {
  for (ParamRef& p : params_) std::fill(p.grad->values().begin(), p.grad->values().end(), 0.0f);
}

void Optimizer::set_lr(double lr) {
  check_lr("Optimizer.set_lr", lr);
  lr_ = lr;
}

Tensor& Optimizer::buffer(const ParamRef& p, const std::string& buf) {
  Tensor& t = state_[p.name + "." + buf];
  if (t.shape() != p.value->shape()) t = Tensor(p.value->shape());
  return t;
}

void Optimizer::load_state(const std::map<std::string, Tensor>& state, int64_t steps) {
  static const char* op = "Optimizer.load_state";
  if (steps < 0) fail(op, "steps: ", steps, " is negative");
  std::set<std::string> wanted;
  if (steps > 0)
    for (const ParamRef& p : params_)
      for (const std::string& b : buffer_names()) {
        const std::string n = p.name + "." + b;
        wanted.insert(n);
        auto it = state.find(n);
        if (it == state.end()) fail(op, "missing buffer '", n, "' of a ", name(), " optimiser");
        if (it->second.shape() != p.value->shape())
          fail(op, "buffer '", n, "': shape ", shape_str(it->second.shape()), " is not its parameter's ",
               shape_str(p.value->shape()));
      }
  for (const auto& [n, t] : state)
    if (!wanted.count(n))
      fail(op, "unexpected buffer '", n, "' for a ", name(), " optimiser after ", steps, " steps");
  state_ = state;
  steps_ = steps;
}

// --- SGD ---

SGD::SGD(ParamList params, const SGDOptions& o) : Optimizer(std::move(params), o.lr, "SGD"), options_(o) {
  check_nonnegative("SGD", "momentum", o.momentum);
  check_nonnegative("SGD", "weight_decay", o.weight_decay);
  if (!std::isfinite(o.dampening)) fail("SGD", "dampening: ", o.dampening, " is not finite");
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
    fail("SGD", "nesterov: needs momentum > 0 and dampening = 0 (momentum ", o.momentum,
         ", dampening ", o.dampening, ")");
}

std::vector<std::string> SGD::buffer_names() const {
  if (options_.momentum != 0.0) return {"momentum_buffer"};
  return {};
}

void SGD::step() {
  const float wd = static_cast<float>(options_.weight_decay);
  const float momentum = static_cast<float>(options_.momentum);
  const float one_minus_dampening = static_cast<float>(1.0 - options_.dampening);
  const float neg_lr = static_cast<float>(-lr_);
  const bool first = steps_ == 0;
  for (ParamRef& p : params_) {
    float* w = p.value->data();
    const float* grad = p.grad->data();
    float* buf = options_.momentum != 0.0 ? buffer(p, "momentum_buffer").data() : nullptr;
    for (int64_t i = 0; i < p.value->numel(); ++i) {
      float g = grad[i];
      if (options_.weight_decay != 0.0) g = g + wd * w[i];
      if (buf) {
        buf[i] = first ? g : buf[i] * momentum + one_minus_dampening * g;
        g = options_.nesterov ? g + momentum * buf[i] : buf[i];
      }
      w[i] = w[i] + neg_lr * g;
    }
    p.written();
  }
  ++steps_;
}

// --- Adam and AdamW ---

Adam::Adam(ParamList params, const AdamOptions& o) : Adam(std::move(params), o, false, "Adam") {}

Adam::Adam(ParamList params, const AdamOptions& o, bool decoupled, const char* op)
    : Optimizer(std::move(params), o.lr, op), options_(o), decoupled_(decoupled) {
  check_nonnegative(op, "eps", o.eps);
  check_nonnegative(op, "weight_decay", o.weight_decay);
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0)) fail(op, "betas[0]: ", o.beta1, " is not in [0, 1)");
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0)) fail(op, "betas[1]: ", o.beta2, " is not in [0, 1)");
}

AdamW::AdamW(ParamList params, const AdamOptions& o) : Adam(std::move(params), o, true, "AdamW") {}

std::vector<std::string> Adam::buffer_names() const {
  if (options_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

void Adam::step() {
  const AdamOptions& o = options_;
  const double t = static_cast<double>(steps_ + 1);
  // Python's scalars: doubles, rounded to float where a float kernel takes them.
  const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
  const float neg_step_size = static_cast<float>(-(lr_ / bias_correction1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float beta1 = static_cast<float>(o.beta1), beta2 = static_cast<float>(o.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  const float eps = static_cast<float>(o.eps);
  const float wd = static_cast<float>(o.weight_decay);
  const float decay = static_cast<float>(1.0 - lr_ * o.weight_decay);  // AdamW's w *= 1 - lr*wd
  for (ParamRef& p : params_) {
    float* w = p.value->data();
    const float* grad = p.grad->data();
    float* m = buffer(p, "exp_avg").data();
    float* v = buffer(p, "exp_avg_sq").data();
    float* v_max = o.amsgrad ? buffer(p, "max_exp_avg_sq").data() : nullptr;
    for (int64_t i = 0; i < p.value->numel(); ++i) {
      float g = grad[i];
      if (decoupled_) w[i] = w[i] * decay;
      else if (o.weight_decay != 0.0) g = g + wd * w[i];
      m[i] = m[i] * beta1 + one_minus_beta1 * g;
      v[i] = v[i] * beta2 + one_minus_beta2 * (g * g);
      float second = v[i];
      if (v_max) second = v_max[i] = std::max(v_max[i], v[i]);
      const float denom = std::sqrt(second) / bc2_sqrt + eps;
      w[i] = w[i] + neg_step_size * (m[i] / denom);
    }
    p.written();
  }
  ++steps_;
}

// --- clipping ---

double clip_grad_norm(const ParamList& params, double max_norm, double norm_type) {
  static const char* op = "clip_grad_norm";
  check_nonnegative(op, "max_norm", max_norm);
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  if (norm_type != 2.0 && !inf_norm)
    fail(op, "norm_type: ", norm_type, " is not supported (2 or inf)");
  double total = 0.0;
  for (const ParamRef& p : params) {
    for (float g : p.grad->values()) {
      if (inf_norm) total = std::max(total, static_cast<double>(std::fabs(g)));
      else total += static_cast<double>(g) * g;
    }
  }
  if (!inf_norm) total = std::sqrt(total);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    const float c = static_cast<float>(coef);
    for (const ParamRef& p : params)
      for (float& g : p.grad->values()) g *= c;
  }
  return total;
}

}  // namespace mha::optim
