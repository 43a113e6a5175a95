#!/usr/bin/env bash
# Runs each libFuzzer target for a fixed time (default 30 s each) on the seed
# corpus in tests/fuzz/corpus/, under ASan + UBSan, from the build-asan folder
# that `scripts/test-sanitizers.sh asan` makes (built here if missing).
#   scripts/fuzz.sh [seconds-per-target]
# New inputs the fuzzer finds go to a scratch folder, not the repository. A
# crash leaves its input in build-asan/fuzz-artifacts/: fix the bug, then copy
# the input into tests/fuzz/regressions/<target>/ (see the README there).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
dir=${ASAN_BUILD:-build-asan}
here=$PWD
if [ ! -x "$dir/tests/fuzz/fuzz_safetensors" ] || [ ! -x "$dir/tests/fuzz/fuzz_run_inputs" ]; then
  cmake -S . -B "$dir" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" \
    -DMHA_BUILD_PYTHON=OFF -DMHA_SANITIZE=address,undefined -DMHA_BUILD_FUZZERS=ON > /dev/null
fi
cmake --build "$dir" -j"${JOBS:-2}" --target fuzz_safetensors fuzz_run_inputs > /dev/null
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:suppressions=$here/tests/sanitizers/asan.supp"
export LSAN_OPTIONS="suppressions=$here/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
mkdir -p "$dir/fuzz-artifacts"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/mha-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
for target in safetensors run_inputs; do
  mkdir -p "$scratch/$target"
  log=$dir/fuzz-artifacts/$target.log
  # -timeout: an input taking 10 s is a hang; -rss_limit_mb: the library's
  # own memory limit (64 MiB in the fuzz targets) must stop big sizes first.
  if ! "$dir/tests/fuzz/fuzz_$target" "$scratch/$target" "tests/fuzz/corpus/$target" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$dir/fuzz-artifacts/$target-" > "$log" 2>&1; then
    tail -60 "$log" >&2
    echo "fuzz: $target failed; the input is in $dir/fuzz-artifacts/" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  echo "fuzz: $target ok ($runs inputs in ${seconds} s, $cov, corpus +$(ls "$scratch/$target" | wc -l))"
done
