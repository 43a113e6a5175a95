// src/cpu/isa/target_end.h: ends the region cpu/isa/target_begin.h began.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#undef MHA_ISA_TARGET
