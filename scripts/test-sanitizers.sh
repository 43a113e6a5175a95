#!/usr/bin/env bash
# Builds the library, the tool and the C++ tests with clang under sanitizers
# in a folder of their own and runs the whole C++ test binary there:
#   scripts/test-sanitizers.sh asan   ASan + UBSan + LeakSanitizer (build-asan;
#                                     also builds the fuzzers, scripts/fuzz.sh)
#   scripts/test-sanitizers.sh tsan   TSan (build-tsan)
# Any report fails the run. Environment: JOBS (default 2), ASAN_BUILD,
# TSAN_BUILD, MHA_TSAN_FILTER (a --gtest_filter for the TSan run, default all),
# MHA_ASAN_FILTER (for the ASan run). Both runs leave out seeds 1-3 of the
# four random-case sweeps of the kernels (window, document, score options,
# random: Parts/*KernelCases.MatchTheReference/1..3), which the release run
# keeps: the same code on other shapes, a third of a sanitizer run's time.
# Only the test binary is built (the tool, benches and MPI tests are not run
# here; scripts/fuzz.sh builds the fuzzers).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: $0 asan|tsan}
jobs=${JOBS:-2}
here=$PWD

# The sweeps' seeds 1-3 (the release run keeps them).
other_seeds="*:-"
for sweep in Window Document Score Random; do
  for seed in 1 2 3; do other_seeds+="Parts/${sweep}KernelCases.MatchTheReference/$seed:"; done
done
other_seeds=${other_seeds%:}

common=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug
        # -O1: sanitizers' recommended speed/precision trade; -g for reports.
        "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g"
        -DMHA_BUILD_PYTHON=OFF -DMHA_BUILD_TOOLS=ON -DMHA_BUILD_TESTS=ON)
case "$mode" in
  asan)
    dir=${ASAN_BUILD:-build-asan}
    flags=(-DMHA_SANITIZE=address,undefined -DMHA_BUILD_FUZZERS=ON)
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_init_order=1:detect_stack_use_after_return=1:suppressions=$here/tests/sanitizers/asan.supp"
    export LSAN_OPTIONS="suppressions=$here/tests/sanitizers/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    filter=${MHA_ASAN_FILTER:-$other_seeds}
    ;;
  tsan)
    dir=${TSAN_BUILD:-build-tsan}
    flags=(-DMHA_SANITIZE=thread)
    # OpenMP: clang's libomp is not instrumented, but its Archer tool
    # (libarcher.so, from libomp-dev) tells TSan about OpenMP's barriers and
    # tasks; with ignore_noninstrumented_modules the runtime's own accesses
    # (and OpenBLAS's) are not reported. GCC's libgomp has no such support and
    # gives false reports, hence clang here.
    llvm_lib=$(cd "$(clang++ -print-resource-dir)/../.." && pwd)
    export OMP_TOOL_LIBRARIES="$llvm_lib/libarcher.so"
    [ -f "$OMP_TOOL_LIBRARIES" ] || { echo "test-sanitizers: $OMP_TOOL_LIBRARIES missing (apt-get install libomp-dev)" >&2; exit 1; }
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$here/tests/sanitizers/tsan.supp"
    filter=${MHA_TSAN_FILTER:-$other_seeds}
    ;;
  *) echo "usage: $0 asan|tsan" >&2; exit 2 ;;
esac

start=$(date +%s)
mkdir -p "$dir"
cmake -S . -B "$dir" "${common[@]}" "${flags[@]}" > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log" >&2; exit 1; }
if ! cmake --build "$dir" -j"$jobs" --target mha_tests > "$dir/build.log" 2>&1; then
  tail -60 "$dir/build.log" >&2
  echo "test-sanitizers: $mode build failed (log: $dir/build.log)" >&2
  exit 1
fi
built=$(date +%s)
# The tests find the tool and the sources the same way as in the normal build.
"$dir/tests/cpp/mha_tests" --gtest_filter="$filter" --gtest_brief=1
end=$(date +%s)
echo "test-sanitizers: $mode ok (build $((built - start)) s, tests $((end - built)) s)"
