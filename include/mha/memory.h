// mha/memory.h: the library's memory limit, and the size checks behind it.
//
// Before a call allocates its tensors it adds up what it will need, with
// every product checked for 64-bit overflow, and throws mha::Error if a
// product overflows or the total is above the limit, so that a hostile or
// mistaken size (a file header declaring a terabyte tensor, B*h*Q*K past
// 2^63) fails with a message instead of a crash, an out-of-memory kill or a
// silent wrap-around:
//   [MultiHeadAttention.forward] attention weights (1, 16777216, 1048576, 1048576):
//   the element count overflows 64 bits
//
// The limit applies to the tensors one call allocates (a module's forward
// pass counts its projections, attention weights, output and any lazily
// created parameters); it is not a cap on the process.
//
//   mha::set_memory_limit(std::uint64_t{8} << 30);   // 8 GiB per call
//   mha::set_memory_limit(0);                        // back to the default
#pragma once

#include <cstdint>

namespace mha {

// The current limit in bytes. The default is the machine's physical memory
// (2^40 bytes where it cannot be read), or the process's address-space limit
// (ulimit -v, RLIMIT_AS) when that is lower: a call that needs more could
// not complete anyway.
uint64_t memory_limit();

// Sets the limit to `bytes`; 0 restores the default. Safe to call from any
// thread; calls that have already checked their sizes are not affected.
void set_memory_limit(uint64_t bytes);

// The default limit: the machine's physical memory in bytes, or the
// address-space limit when lower (read once, at the first call).
uint64_t default_memory_limit();

}  // namespace mha
