// Replays the fuzzers' seed corpus and every saved fuzzer crash through the
// same functions the fuzzers call (tests/fuzz/fuzz_targets.h), in every build:
// a crash, a sanitizer report or an exception other than mha::Error fails.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "mha/memory.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> files_in(const std::string& target) {
  std::vector<fs::path> out;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(MHA_SOURCE_DIR) / "tests" / "fuzz" / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() != ".md") out.push_back(e.path());
  }
  return out;
}

std::vector<uint8_t> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The fuzz targets lower the memory limit; put it back for the other tests.
struct RestoreLimit {
  ~RestoreLimit() { mha::set_memory_limit(0); }
};

TEST(FuzzCorpus, SafetensorsReaderSurvivesEveryFile) {
  RestoreLimit restore;
  const auto files = files_in("safetensors");
  ASSERT_GE(files.size(), 10u) << "the seed corpus is missing (tests/fuzz/make_corpus.py)";
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const auto b = bytes_of(f);
    EXPECT_NO_THROW(mha::fuzz::safetensors_one_input(b.data(), b.size()));
  }
}

TEST(FuzzCorpus, RunInputsSurviveEveryFile) {
  RestoreLimit restore;
  const auto files = files_in("run_inputs");
  ASSERT_GE(files.size(), 10u) << "the seed corpus is missing (tests/fuzz/make_corpus.py)";
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const auto b = bytes_of(f);
    EXPECT_NO_THROW(mha::fuzz::run_inputs_one_input(b.data(), b.size()));
  }
}

}  // namespace
