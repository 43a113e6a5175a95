#include "openblas_core.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace mha::tools {

namespace {

// The kernel set OpenBLAS chose, or "" when the BLAS is not OpenBLAS.
std::string openblas_core() {
  using CoreName = char* (*)();
  auto get = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = get ? get() : nullptr;
  return name ? name : "";
}

bool generic_core(const std::string& core) {
  for (const char* g : {"prescott", "core2", "nehalem", "generic"})
    if (strcasecmp(core.c_str(), g) == 0) return true;
  return false;
}

}  // namespace

void rerun_on_fast_openblas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("MHA_KEEP_OPENBLAS_CORE")) return;
  const std::string core = openblas_core();
  if (core.empty() || !generic_core(core)) return;
  __builtin_cpu_init();
  const char* best = __builtin_cpu_supports("avx512f")  ? "SkylakeX"
                     : __builtin_cpu_supports("avx2") ? "Haswell"
                                                      : nullptr;
  if (!best) return;
  setenv("OPENBLAS_CORETYPE", best, 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // execv failed: carry on with the generic kernels
}

}  // namespace mha::tools
