// src/cpu/isa/have_x86.h: MHA_HAVE_X86 (CMakeLists.txt) is 1 where the
// AVX2/AVX-512/AMX sources are built (x86-64), 0 elsewhere; the dispatchers
// then offer only the portable kernels. Included by every kernels-layer
// source that reads it, so that a build without it fails instead of
// silently dropping the x86 kernels.
#pragma once

#ifndef MHA_HAVE_X86
#error "MHA_HAVE_X86 is not set: build mha with its CMakeLists.txt"
#endif

// A per-ISA table's x86 entry (cpu::isa_entry): its address on x86-64,
// null (never read) elsewhere, where the entry is not defined.
#if MHA_HAVE_X86
#define MHA_X86_ONLY(entry) (&(entry))
#else
#define MHA_X86_ONLY(entry) nullptr
#endif
