// mha/detail/published.h: module state that calls read without locks.
//
// A module's calls may run on many threads at once. None holds a lock while
// it computes, and none waits for a writer: each call copies one pointer to
// an immutable snapshot of what it needs, and what changes that state
// publishes a new snapshot with one pointer store, so a call sees one state
// or the next, never a mixture.
//
//   Published<T>  the parameters: a live object at a fixed address (the
//                 pointers parameters() hands to optimisers stay valid), a
//                 snapshot per call, and update() for what changes them.
//   Latest<T>     a value replaced whole, such as the last call's record.
//   Relaxed<T>    a flag or setting read once at the start of each call.
//   KeyStream     the dropout keys, one per training-mode call.
//
// Each copies as the value it holds, so a copied module is an independent
// module. Not part of the public API.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

namespace mha::detail {

// A shared pointer read and replaced atomically. libstdc++ 12's
// std::atomic<std::shared_ptr> guards the pointer with a spin bit that
// ThreadSanitizer cannot see (it reports every load beside a store); the
// C++11 functions below guard it with libstdc++'s pool of mutexes instead,
// held for the pointer copy only, never for a call.
template <typename T>
class SharedSlot {
 public:
  std::shared_ptr<T> load() const { return std::atomic_load_explicit(&ptr_, std::memory_order_acquire); }
  void store(std::shared_ptr<T> v) { std::atomic_store_explicit(&ptr_, std::move(v), std::memory_order_release); }
  std::shared_ptr<T> exchange(std::shared_ptr<T> v) {
    return std::atomic_exchange_explicit(&ptr_, std::move(v), std::memory_order_acq_rel);
  }

 private:
  std::shared_ptr<T> ptr_;
};

// A value replaced whole, read as a shared pointer to an immutable copy.
template <typename T>
class Latest {
 public:
  Latest() = default;
  Latest(const Latest& o) { value_.store(o.load()); }
  Latest& operator=(const Latest& o) {
    value_.store(o.load());
    return *this;
  }
  // The value now, kept alive by the pointer however it is replaced later.
  std::shared_ptr<T> load() const { return value_.load(); }
  // Replaces the value; returns the one replaced.
  std::shared_ptr<T> exchange(std::shared_ptr<T> v) { return value_.exchange(std::move(v)); }
  // Replaces the value.
  void store(std::shared_ptr<T> v) { value_.store(std::move(v)); }

 private:
  SharedSlot<T> value_;
};

// A setting (mode, kernel, probability) each call reads once when it starts.
template <typename T>
class Relaxed {
 public:
  Relaxed(T v) : value_(v) {}  // NOLINT: a setting converts from its value
  Relaxed(const Relaxed& o) : value_(o.get()) {}
  Relaxed& operator=(const Relaxed& o) {
    set(o.get());
    return *this;
  }
  T get() const { return value_.load(std::memory_order_relaxed); }
  void set(T v) { value_.store(v, std::memory_order_relaxed); }

 private:
  std::atomic<T> value_;
};

// The dropout keys: SplitMix64 (Steele, Lea and Flood 2014) on one atomic
// counter, so calls on many threads draw distinct keys in some serial order
// without a lock: n calls from seed s draw the keys n serial calls draw.
class KeyStream {
 public:
  explicit KeyStream(uint64_t seed = 0) : state_(seed) {}
  KeyStream(const KeyStream& o) : state_(o.state_.load(std::memory_order_relaxed)) {}
  KeyStream& operator=(const KeyStream& o) {
    state_.store(o.state_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
  // Restarts the stream: the next key is the first key of seed `s`.
  void seed(uint64_t s) { state_.store(s, std::memory_order_relaxed); }
  // The next key.
  uint64_t next() {
    uint64_t z = state_.fetch_add(kGamma, std::memory_order_relaxed) + kGamma;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  static constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
  std::atomic<uint64_t> state_;
};

// Parameters that calls read and a few operations replace (load_state_dict,
// pruning, gates, the lazy initialisation). There is one live object, at a
// fixed address: optimisers and views write it in place between calls, as
// they would a torch.nn.Module's parameters. A call pins the published
// snapshot, which is the live object itself while nothing changes it.
// update() changes the live object in place without a call ever waiting:
//   1. new calls are given a copy of the old value;
//   2. it waits until the calls that pinned the live object have finished
//      (the pin's deleter signals when the last one lets go);
//   3. it changes the live object and publishes it again.
// A call therefore sees the old value or the new one, whole. Writers are
// serialised among themselves; a thread must not hold a pin while it calls
// update() (it would wait for itself).
template <typename T>
class Published {
 public:
  explicit Published(T value) : live_(std::make_unique<T>(std::move(value))) { publish_live(); }
  Published(const Published& o) : Published(T(*o.pin())) {}
  Published& operator=(const Published& o) {
    if (this != &o) {
      T copy(*o.pin());
      update([&](T& live) { live = std::move(copy); });
    }
    return *this;
  }
  ~Published() { current_.store(nullptr); }  // before live_ goes

  // The value for one call: immutable while the pointer lives.
  std::shared_ptr<const T> pin() const { return current_.load(); }
  // The live object, for writes between calls (optimisers, tests) and for
  // the addresses parameters() hands out.
  T& live() { return *live_; }
  const T& live() const { return *live_; }

  // Runs change(live) as described above; returns what it returns. If it
  // throws, the live object is published again as change left it (so
  // change checks everything before it writes anything).
  template <typename Change>
  decltype(auto) update(Change&& change) {
    std::lock_guard lock(writer_);
    current_.store(std::make_shared<const T>(*live_));  // 1.
    drained_->wait(false, std::memory_order_acquire);                              // 2.
    struct Republish {
      Published* self;
      ~Republish() { self->publish_live(); }
    } republish{this};  // 3., also when change throws
    return change(*live_);
  }
  // Runs fn() among the writers (for state only writers touch, such as the
  // generator of the lazy initialisation), publishing nothing.
  template <typename Fn>
  decltype(auto) exclusive(Fn&& fn) {
    std::lock_guard lock(writer_);
    return fn();
  }

 private:
  void publish_live() {
    auto drained = std::make_shared<std::atomic<bool>>(false);
    drained_ = drained;
    current_.store(std::shared_ptr<const T>(live_.get(),
                                            [drained](const T*) {
                                              drained->store(true, std::memory_order_release);
                                              drained->notify_all();
                                            }));
  }

  std::unique_ptr<T> live_;
  // Set when every pin of the live object's current publication is gone.
  std::shared_ptr<std::atomic<bool>> drained_;
  SharedSlot<const T> current_;
  std::mutex writer_;  // serialises update() and exclusive(); never taken by a call
};

}  // namespace mha::detail
