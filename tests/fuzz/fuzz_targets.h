// tests/fuzz/fuzz_targets.h: what the fuzzers run on each input, shared with
// the regression test (tests/cpp/tools/test_fuzz_corpus.cpp) that replays the seed
// corpus and every input a fuzzer ever crashed on.
//
// Each function accepts any bytes. Returning normally (with or without an
// mha::Error along the way, which is the expected answer to a bad file) is a
// pass; a crash, a sanitizer report, a hang, another exception type or a
// failed invariant (abort) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mha::fuzz {

// The memory limit the fuzz targets run under, so that a header declaring a
// huge tensor is refused by the size checks rather than by the fuzzer's own
// out-of-memory guard.
inline constexpr uint64_t kFuzzMemoryLimit = uint64_t{64} << 20;

// parse_safetensors on the bytes; then every tensor through to_float_tensor,
// and the F32 ones written back and read again, which must give them
// unchanged.
void safetensors_one_input(const uint8_t* data, size_t size);

// `mha run`'s input handling: the bytes as its inputs file (run_inputs_from),
// then an evaluation-mode forward pass of a small module on what it read.
void run_inputs_one_input(const uint8_t* data, size_t size);

}  // namespace mha::fuzz
