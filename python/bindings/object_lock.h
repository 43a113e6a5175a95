// python/bindings/object_lock.h: one lock per C++ object that Python threads may share
// but whose C++ type is one thread's business.
//
// Python code shares objects between threads freely, and the bindings release
// the GIL while they compute. The modules' forward calls are safe to run at
// once (mha/multihead.h); a KVCache, a module's accumulated gradients, an
// AttentionModel's saved activations and an optimiser's state are not: two
// threads appending to one cache at once overran its capacity and corrupted
// the heap. Each such binding takes the object's lock for the whole
// operation, after releasing the GIL (so a thread waiting for the lock never
// holds the GIL that the lock's holder may need), and releases it before the
// GIL is taken back: declare the lock after the gil_scoped_release.
//
//   py::gil_scoped_release release;
//   ObjectLock lock(&cache);
//   ... the operation ...
//
// The calls then run one after the other, each whole (in the order the
// threads reach the lock). One operation takes one object's lock, never two,
// so there is no lock order to get wrong.
#pragma once

#include <pybind11/pybind11.h>

#include <mutex>
#include <unordered_map>

namespace mha::python {

class ObjectLock {
 public:
  explicit ObjectLock(const void* object) : object_(object) {
    {
      std::lock_guard<std::mutex> guard(registry_mutex());
      Entry& e = registry()[object_];  // node-based map: the entry stays put
      ++e.users;
      entry_ = &e;
    }
    entry_->mutex.lock();
  }
  ~ObjectLock() {
    entry_->mutex.unlock();
    std::lock_guard<std::mutex> guard(registry_mutex());
    if (--entry_->users == 0) registry().erase(object_);  // an object's address may be reused
  }
  ObjectLock(const ObjectLock&) = delete;
  ObjectLock& operator=(const ObjectLock&) = delete;

 private:
  struct Entry {
    std::mutex mutex;
    int users = 0;  // threads holding or waiting for this object's lock
  };
  static std::mutex& registry_mutex() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<const void*, Entry>& registry() {
    static std::unordered_map<const void*, Entry> r;
    return r;
  }
  const void* object_;
  Entry* entry_ = nullptr;
};

// fn() under `object`'s lock, with the GIL released.
template <typename Fn>
auto locked(const void* object, Fn&& fn) {
  pybind11::gil_scoped_release release;
  ObjectLock lock(object);
  return fn();
}

}  // namespace mha::python
