// src/nn/module_grads.h: the gradients both modules keep beside their
// parameters, by name ("W_q.weight", "q_proj.bias", ...), shaped as the
// parameters and made on first use. parameters() hands out pointers to
// them, so they are refilled in place, never erased.
#pragma once

#include <algorithm>
#include <string>

#include "mha/linear.h"
#include "mha/multihead.h"
#include "mha/tensor.h"
#include "nn/attention_engine.h"

namespace mha::nn {

// grads[name], made as zeros unless it has `like`'s shape.
inline Tensor& grad_like(StateDict& grads, const std::string& name, const Shape& shape) {
  Tensor& g = grads[name];
  if (g.shape() != shape) g = Tensor(shape);
  return g;
}

// The gradients of the four layers q, k, v, o named names[i] + ".weight" /
// ".bias" (made as needed; an uninitialised layer gets none), as the
// engine's backward adds into them.
inline EngineGrads layer_grads(StateDict& grads, const char* const names[4], const EngineLayers& layers) {
  const LayerRef* all[] = {&layers.q, &layers.k, &layers.v, &layers.o};
  LinearGrads g[4];
  for (int i = 0; i < 4; ++i) {
    if (!all[i]->initialized()) continue;
    g[i].weight = &grad_like(grads, std::string(names[i]) + ".weight", {all[i]->out_features(), all[i]->in_features()});
    if (all[i]->has_bias()) g[i].bias = &grad_like(grads, std::string(names[i]) + ".bias", {all[i]->out_features()});
  }
  return {g[0], g[1], g[2], g[3]};
}

// Every gradient, and the head gates', to zero.
inline void zero_grads(StateDict& grads, Tensor& gate_grad) {
  for (auto& [name, g] : grads) std::fill(g.values().begin(), g.values().end(), 0.0f);
  std::fill(gate_grad.values().begin(), gate_grad.values().end(), 0.0f);
}

}  // namespace mha::nn
