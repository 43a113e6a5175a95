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

// torch.optim.SGD's arguments (lr is required there; 0.01 here).
struct SGDOptions {
  // Learning rate, >= 0.
  double lr = 0.01;
  // Momentum factor, >= 0 (0: plain SGD, no buffer kept).
  double momentum = 0.0;
  // Dampening of the momentum's new gradient, finite.
  double dampening = 0.0;
  // L2 penalty added to the gradient (g += weight_decay * w), >= 0.
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening = 0, as in PyTorch
};

// torch.optim.Adam's (and AdamW's) arguments, with PyTorch's defaults.
struct AdamOptions {
  // Learning rate, >= 0.
  double lr = 1e-3;
  // betas[0]: decay of the running mean of gradients, in [0, 1).
  double beta1 = 0.9;
  // betas[1]: decay of the running mean of squared gradients, in [0, 1).
  double beta2 = 0.999;
  // Added to the denominator for stability, >= 0.
  double eps = 1e-8;
  double weight_decay = 0.0;  // AdamW's default is 1e-2 (see AdamW::defaults())
  // Keep the maximum of the squared-gradient means (AMSGrad).
  bool amsgrad = false;
};

// What SGD, Adam and AdamW share: the parameters, the learning rate, the
// step count and the state buffers. Every optimiser checks its parameters
// at construction: mha::Error for an empty list, a missing value or
// gradient, a gradient shaped unlike its value, or a name given twice.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update of every parameter from its gradient.
  virtual void step() = 0;
  // Zeroes every parameter's gradient.
  void zero_grad();

  // The parameters this optimiser updates.
  const ParamList& params() const { return params_; }
  int64_t steps() const { return steps_; }  // step() calls so far
  // The current learning rate.
  double lr() const { return lr_; }
  // Changes the learning rate for the next steps (a schedule); mha::Error
  // unless lr >= 0.
  void set_lr(double lr);
  virtual const char* name() const = 0;  // "sgd", "adam", "adamw"

  // The state buffers by "<parameter>.<buffer>" ("W_q.weight.exp_avg", ...);
  // empty before the first step, as in PyTorch.
  const std::map<std::string, Tensor>& state() const { return state_; }
  // Restores buffers saved by state() after `steps` steps. Every buffer the
  // optimiser keeps must be present with its parameter's shape (none when
  // steps is 0); nothing changes if a check fails (mha::Error naming the
  // buffer: missing, misshapen or unexpected, or negative steps).
  void load_state(const std::map<std::string, Tensor>& state, int64_t steps);

 protected:
  // Checks `params` and `lr` (>= 0), naming `op` ("SGD", "Adam", ...) in
  // the mha::Error of a failed check.
  Optimizer(ParamList params, double lr, const char* op);
  // The buffer names this optimiser keeps for each parameter.
  virtual std::vector<std::string> buffer_names() const = 0;
  // The buffer `buf` of parameter p ("<p.name>.<buf>" in state()), made
  // with p's shape and zeros on first use.
  Tensor& buffer(const ParamRef& p, const std::string& buf);

  // The parameters, as given to the constructor.
  ParamList params_;
  // The learning rate of the next step.
  double lr_;
  // step() calls so far (the t of Adam's bias corrections).
  int64_t steps_ = 0;
  // The buffers by "<parameter>.<buffer>".
  std::map<std::string, Tensor> state_;
};

// torch.optim.SGD: plain, with momentum, dampening, Nesterov momentum and
// weight decay; its buffer is "momentum_buffer".
class SGD : public Optimizer {
 public:
  // Throws mha::Error for a negative lr, momentum or weight_decay, a
  // non-finite dampening, or nesterov without momentum > 0 and dampening 0.
  SGD(ParamList params, const SGDOptions& options);
  void step() override;
  const char* name() const override { return "sgd"; }
  // The options it was built with.
  const SGDOptions& options() const { return options_; }

 private:
  std::vector<std::string> buffer_names() const override;
  SGDOptions options_;
};

// torch.optim.Adam; its buffers are "exp_avg", "exp_avg_sq" and, with
// amsgrad, "max_exp_avg_sq".
class Adam : public Optimizer {
 public:
  // Throws mha::Error for a negative lr, eps or weight_decay, or betas
  // outside [0, 1).
  Adam(ParamList params, const AdamOptions& options);
  void step() override;
  const char* name() const override { return decoupled_ ? "adamw" : "adam"; }
  // The options it was built with.
  const AdamOptions& options() const { return options_; }

 protected:
  // For AdamW: `decoupled` applies the weight decay to the weights rather
  // than to the gradient; `op` names the class in error messages.
  Adam(ParamList params, const AdamOptions& options, bool decoupled, const char* op);

 private:
  std::vector<std::string> buffer_names() const override;
  AdamOptions options_;
  bool decoupled_;
};

// Adam with decoupled weight decay (Loshchilov & Hutter), torch.optim.AdamW.
class AdamW : public Adam {
 public:
  // Adam's checks; pass defaults() for PyTorch's weight_decay of 1e-2.
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
// clipping. Throws mha::Error for any other norm_type or a negative
// max_norm.
double clip_grad_norm(const ParamList& params, double max_norm, double norm_type = 2.0);

}  // namespace mha::optim
