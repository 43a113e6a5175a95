// mha/detail/copyable_mutex.h: mutexes for classes that must stay copyable.
//
// A module guards its mutable state with mutexes, yet copying a module (to
// keep a snapshot, to prune a copy) should copy its parameters, not fail to
// compile. These wrappers copy as fresh, unlocked mutexes. Not part of the
// API: only the library's own headers use them.
#pragma once

#include <mutex>
#include <shared_mutex>

namespace mha::detail {

class CopyableMutex : public std::mutex {
 public:
  CopyableMutex() = default;
  CopyableMutex(const CopyableMutex&) : std::mutex() {}
  CopyableMutex& operator=(const CopyableMutex&) { return *this; }
};

class CopyableSharedMutex : public std::shared_mutex {
 public:
  CopyableSharedMutex() = default;
  CopyableSharedMutex(const CopyableSharedMutex&) : std::shared_mutex() {}
  CopyableSharedMutex& operator=(const CopyableSharedMutex&) { return *this; }
};

}  // namespace mha::detail
