// libFuzzer target: `mha run`'s input file handling (see fuzz_targets.h).
//   build-asan/tests/fuzz/fuzz_run_inputs tests/fuzz/corpus/run_inputs
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mha::fuzz::run_inputs_one_input(data, size);
  return 0;
}
