// mha/optim.h: optimisers with PyTorch's update rules, and gradient clipping.
//
// Each optimiser follows torch.optim's single-tensor code of PyTorch 1.13
// step for step, in float32 with its scalars computed in double as Python
// computes them:
//   SGD:   g += wd*w;  b = g (first step) or b = momentum*b + (1-dampening)*g;
//          g = nesterov ? g + momentum*b : b;  w -= lr*g
//   Adam:  g += wd*w;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//          v_hat = amsgrad ? max(v_hat, v) : v;
//          w -= lr/(1-b1^t) * m / (sqrt(v_hat)/sqrt(1-b2^t) + eps)
//   AdamW: w *= 1 - lr*wd, then Adam without the g += wd*w term.
//
//   mha::optim::Adam opt(model.parameters(), {.lr = 3e-3});
//   model.zero_grad(); ... backward ...;
//   mha::optim::clip_grad_norm(model.parameters(), 1.0);
//   opt.step();
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "mha/parameter.h"
#include "mha/tensor.h"

namespace mha::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening = 0, as in PyTorch
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // AdamW's default is 1e-2 (see AdamW::defaults())
  bool amsgrad = false;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update of every parameter from its gradient.
  virtual void step() = 0;
  // Zeroes every parameter's gradient.
  void zero_grad();

  const ParamList& params() const { return params_; }
  int64_t steps() const { return steps_; }  // step() calls so far
  double lr() const { return lr_; }
  void set_lr(double lr);
  virtual const char* name() const = 0;  // "sgd", "adam", "adamw"

  // The state buffers by "<parameter>.<buffer>" ("W_q.weight.exp_avg", ...);
  // empty before the first step, as in PyTorch.
  const std::map<std::string, Tensor>& state() const { return state_; }
  // Restores buffers saved by state() after `steps` steps. Every buffer the
  // optimiser keeps must be present with its parameter's shape (none when
  // steps is 0); nothing changes if a check fails.
  void load_state(const std::map<std::string, Tensor>& state, int64_t steps);

 protected:
  Optimizer(ParamList params, double lr, const char* op);
  // The buffer names this optimiser keeps for each parameter.
  virtual std::vector<std::string> buffer_names() const = 0;
  Tensor& buffer(const ParamRef& p, const std::string& buf);

  ParamList params_;
  double lr_;
  int64_t steps_ = 0;
  std::map<std::string, Tensor> state_;
};

class SGD : public Optimizer {
 public:
  SGD(ParamList params, const SGDOptions& options);
  void step() override;
  const char* name() const override { return "sgd"; }
  const SGDOptions& options() const { return options_; }

 private:
  std::vector<std::string> buffer_names() const override;
  SGDOptions options_;
};

class Adam : public Optimizer {
 public:
  Adam(ParamList params, const AdamOptions& options);
  void step() override;
  const char* name() const override { return decoupled_ ? "adamw" : "adam"; }
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(ParamList params, const AdamOptions& options, bool decoupled, const char* op);

 private:
  std::vector<std::string> buffer_names() const override;
  AdamOptions options_;
  bool decoupled_;
};

// Adam with decoupled weight decay (Loshchilov & Hutter), torch.optim.AdamW.
class AdamW : public Adam {
 public:
  AdamW(ParamList params, const AdamOptions& options);
  // PyTorch's AdamW defaults: Adam's, with weight_decay 1e-2.
  static AdamOptions defaults() {
    AdamOptions o;
    o.weight_decay = 1e-2;
    return o;
  }
};

// torch.nn.utils.clip_grad_norm_: the norm of all gradients together (as one
// vector; norm_type 2 or +infinity), then every gradient scaled by
// max_norm / (norm + 1e-6) when that is below 1. Returns the norm before
// clipping.
double clip_grad_norm(const ParamList& params, double max_norm, double norm_type = 2.0);

}  // namespace mha::optim
