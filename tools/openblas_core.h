// tools/openblas_core.h: run the tool on OpenBLAS's fast kernels.
//
// OpenBLAS 0.3.21 (Debian 12) does not recognise some recent Xeons and falls
// back to its generic "Prescott" kernels, about 4x slower at sgemm; every
// projection of mha then runs at that speed. The kernel set is chosen once,
// when the library loads, from OPENBLAS_CORETYPE. So before any command runs,
// main() asks OpenBLAS which set it chose and, when that is a generic one and
// the CPU has AVX-512 or AVX2, runs the tool again (execv of itself) with
// OPENBLAS_CORETYPE=SkylakeX or Haswell. A user who sets OPENBLAS_CORETYPE
// keeps their choice; MHA_KEEP_OPENBLAS_CORE=1 turns this off.
#pragma once

namespace mha::tools {

// Returns only when nothing is to be done or execv failed.
void rerun_on_fast_openblas_kernels(char** argv);

}  // namespace mha::tools
