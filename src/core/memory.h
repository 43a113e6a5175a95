// src/core/memory.h: adding up what a call will allocate, before it does.
//
//   core::MemoryPlan plan("MultiHeadAttention.forward");
//   plan.add("attention weights", {B, H, Q, K});   // throws on overflow
//   plan.check();                                   // throws above the limit
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "mha/memory.h"
#include "mha/tensor.h"

namespace mha::core {

class MemoryPlan {
 public:
  explicit MemoryPlan(const char* op) : op_(op) {}

  // Adds a tensor called `what` (a string that outlives the plan: a literal)
  // of `shape` with `item_bytes` per element.
  // Throws mha::Error naming the op, `what` and the shape when a dimension is
  // negative or the element count or byte size overflows 64 bits.
  MemoryPlan& add(const char* what, const Shape& shape, uint64_t item_bytes = 4);
  MemoryPlan& add(const char* what, std::initializer_list<int64_t> shape, uint64_t item_bytes = 4) {
    return add(what, Shape(shape), item_bytes);
  }
  // Throws mha::Error when the total is above mha::memory_limit(), naming the
  // total, the limit and the largest part.
  void check() const;
  uint64_t total() const { return total_; }

 private:
  const char* op_;
  uint64_t total_ = 0;
  uint64_t largest_ = 0;
  // The largest part, named only when check() fails (formatting its shape
  // on every call showed in profiles of the d2l chapter's toy call).
  const char* largest_what_ = "";
  Shape largest_shape_;
};

// Throws like MemoryPlan::check() for one buffer of `bytes` called `what`.
void check_bytes(const char* op, const std::string& what, uint64_t bytes);

}  // namespace mha::core
