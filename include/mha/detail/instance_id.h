// mha/detail/instance_id.h: a number no other module object ever has.
//
// A forward context (mha/context.h) records which module ran its call, so
// that another module cannot run its backward by mistake. An address would
// not do (a destroyed module's address is reused); this number is drawn anew
// for every object, copies and moved-to objects included. Not part of the API.
#pragma once

#include <atomic>
#include <cstdint>

namespace mha::detail {

class InstanceId {
 public:
  InstanceId() : id_(next()) {}
  InstanceId(const InstanceId&) : id_(next()) {}
  InstanceId& operator=(const InstanceId&) { return *this; }  // an object keeps its own number
  uint64_t value() const { return id_; }

 private:
  static uint64_t next() {
    static std::atomic<uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t id_;
};

}  // namespace mha::detail
