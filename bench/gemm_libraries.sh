#!/bin/sh
# bench/gemm_libraries.sh [BUILD] [THREADS] [ROUNDS]: builds and runs
# bench/gemm_libraries.cpp against BUILD's libmha.a (default: build).
# BLIS and oneDNN are optional peers: apt-get install libblis-dev libdnnl-dev.
set -e
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
out=$build/gemm_libraries
c++ -O2 -std=c++17 -fopenmp -I"$here/include" -I"$here/src" "$here/bench/gemm_libraries.cpp" \
  "$build/libmha.a" -lopenblas -ldl -o "$out"
exec "$out" "${2:-2}" "${3:-5}"
