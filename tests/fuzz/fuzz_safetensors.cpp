// libFuzzer target: the safetensors reader (see fuzz_targets.h).
//   build-asan/tests/fuzz/fuzz_safetensors tests/fuzz/corpus/safetensors
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mha::fuzz::safetensors_one_input(data, size);
  return 0;
}
